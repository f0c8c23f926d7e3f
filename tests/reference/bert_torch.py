#!/usr/bin/python3
"""Independent PyTorch implementation of megabatch's BERT (Megatron layout), the reference
of the golden test. Parameters use megabatch's names and shapes; the fused QKV output is
(head, [q, k, v], head_dim) per token, as in Megatron.

  bert_torch.py grads IN.h5 OUT.h5     lm loss, sop loss and every gradient of lm + sop

IN.h5: attributes layers, heads, eps, post_ln (0/1); datasets params/<name>, tokens (B, T),
token_types (B, T), padding_mask (B, T), labels (B, T; -1 = not masked), sop_labels (B).
GELU is the tanh form throughout (as megabatch's op); dropout is off.
"""
import math
import sys

import h5py
import torch
import torch.nn.functional as F


def layer_norm(x, P, name, eps):
    return F.layer_norm(x, (x.shape[-1],), P[name + ".weight"], P[name + ".bias"], eps)


def forward(P, tokens, types, pad, labels, sop_labels, layers, heads, eps, post_ln):
    B, T = tokens.shape
    wte = P["embedding.word_embeddings.weight"]
    C = wte.shape[1]
    D = C // heads
    x = wte[tokens] + P["embedding.position_embeddings.weight"][:T] + P["embedding.tokentype_embeddings.weight"][types]
    if post_ln:
        x = layer_norm(x, P, "embedding.layernorm", eps)
    keymask = pad.bool()[:, None, None, :]  # (B, 1, 1, T): attend to real tokens only
    for l in range(layers):
        p = f"encoder.layers.{l}."
        h = x if post_ln else layer_norm(x, P, p + "input_layernorm", eps)
        qkv = F.linear(h, P[p + "self_attention.linear_qkv.weight"], P[p + "self_attention.linear_qkv.bias"])
        qkv = qkv.view(B, T, heads, 3, D)
        q, k, v = (qkv[:, :, :, i, :].transpose(1, 2) for i in range(3))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(~keymask, float("-inf"))
        a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(a, P[p + "self_attention.linear_proj.weight"], P[p + "self_attention.linear_proj.bias"])
        if post_ln:
            x = layer_norm(x, P, p + "input_layernorm", eps)
        h = x if post_ln else layer_norm(x, P, p + "pre_mlp_layernorm", eps)
        h = F.gelu(F.linear(h, P[p + "mlp.linear_fc1.weight"], P[p + "mlp.linear_fc1.bias"]), approximate="tanh")
        x = x + F.linear(h, P[p + "mlp.linear_fc2.weight"], P[p + "mlp.linear_fc2.bias"])
        if post_ln:
            x = layer_norm(x, P, p + "pre_mlp_layernorm", eps)
    if not post_ln:
        x = layer_norm(x, P, "encoder.final_layernorm", eps)
    # masked LM: dense, gelu, layer norm, tied decoder + bias, mean over masked tokens
    h = F.gelu(F.linear(x, P["lm_head.dense.weight"], P["lm_head.dense.bias"]), approximate="tanh")
    h = layer_norm(h, P, "lm_head.layer_norm", eps)
    logits = h @ wte.t() + P["output_layer.bias"]
    lm = F.cross_entropy(logits.view(B * T, -1), labels.reshape(-1), ignore_index=-1)
    # sentence order: tanh pooler on [CLS], binary head
    pooled = torch.tanh(F.linear(x[:, 0], P["pooler.dense.weight"], P["pooler.dense.bias"]))
    sop = F.cross_entropy(F.linear(pooled, P["binary_head.weight"], P["binary_head.bias"]), sop_labels)
    return lm, sop


def main():
    torch.set_num_threads(1)
    f = h5py.File(sys.argv[2], "r")
    a = dict(f.attrs)
    P = {n: torch.tensor(f["params"][n][()], dtype=torch.float32, requires_grad=True) for n in f["params"]}
    t = {k: torch.tensor(f[k][()], dtype=torch.long) for k in ["tokens", "token_types", "padding_mask", "labels",
                                                                 "sop_labels"]}
    lm, sop = forward(P, t["tokens"], t["token_types"], t["padding_mask"], t["labels"], t["sop_labels"],
                      int(a["layers"]), int(a["heads"]), float(a["eps"]), bool(a["post_ln"]))
    (lm + sop).backward()
    with h5py.File(sys.argv[3], "w") as o:
        o.attrs["lm_loss"] = lm.item()
        o.attrs["sop_loss"] = sop.item()
        for n, p in P.items():
            o[f"grads/{n}"] = p.grad.numpy()


if __name__ == "__main__":
    main()
