#!/usr/bin/python3
"""Independent PyTorch implementation of megabatch's T5 (Megatron layout), the reference of
the golden test. Parameters use megabatch's names and shapes; fused QKV outputs are
(head, [q, k, v], head_dim) per token and linear_kv's (head, [k, v], head_dim), as in
Megatron.

  t5_torch.py grads IN.h5 OUT.h5     lm loss and every gradient

IN.h5: attributes enc_layers, dec_layers, heads, eps, relative (0/1: T5's relative position
buckets, 32 buckets up to distance 128, instead of absolute positions), residual_post_norm (0/1:
each sub-layer adds its output to its norm's output, not its input:
--apply-residual-connection-post-layernorm); datasets params/<name>,
enc_tokens (B, Te), enc_mask (B, Te), dec_tokens (B, Td), dec_mask (B, Td), labels (B, Td;
-1 = no loss). GELU is the tanh form; dropout is off.
"""
import math
import sys

import h5py
import torch
import torch.nn.functional as F


def ln(x, P, name, eps):
    return F.layer_norm(x, (x.shape[-1],), P[name + ".weight"], P[name + ".bias"], eps)


def lin(x, P, name):
    return F.linear(x, P[name + ".weight"], P[name + ".bias"])


def bucket(rel, bidirectional, num_buckets=32, max_distance=128):  # rel = key - query
    out, n = 0, -rel
    if bidirectional:
        num_buckets //= 2
        out += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return out + n
    return out + min(exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact)),
                     num_buckets - 1)


def rel_bias(table, T, bidirectional):  # table (buckets, H) -> (1, H, T, T)
    idx = torch.tensor([[bucket(j - i, bidirectional) for j in range(T)] for i in range(T)])
    return table[idx].permute(2, 0, 1)[None]


def attend(q, k, v, mask, bias=None):  # q (B, H, Tq, D), k/v (B, H, Tk, D), mask (B or 1, 1, Tq or 1, Tk) bool
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def forward(P, a, enc_tokens, enc_mask, dec_tokens, dec_mask, labels):
    heads, eps = int(a["heads"]), float(a["eps"])
    rel = bool(a.get("relative", 0))
    after_norm = bool(a.get("residual_post_norm", 0))

    def sub(x, name, f):  # x + f(ln(x)), or ln(x) + f(ln(x)) with the residual after the norm
        h = ln(x, P, name, eps)
        return (h if after_norm else x) + f(h)
    wte = P["embedding.word_embeddings.weight"]
    B, Te = enc_tokens.shape
    Td = dec_tokens.shape[1]
    C = wte.shape[1]
    D = C // heads
    split = lambda t, T: t.view(B, T, heads, D).transpose(1, 2)
    merge = lambda t, T: t.transpose(1, 2).reshape(B, T, C)
    mlp = lambda h, p: lin(F.gelu(lin(h, P, p + "mlp.linear_fc1"), approximate="tanh"), P, p + "mlp.linear_fc2")
    # encoder
    x = wte[enc_tokens] + (0 if rel else P["embedding.position_embeddings.weight"][:Te])
    ebias = rel_bias(P["encoder.relative_attention_bias.weight"], Te, True) if rel else None
    emask = enc_mask.bool()[:, None, None, :]
    for l in range(int(a["enc_layers"])):
        p = f"encoder.layers.{l}."

        def self_attn(h):
            qkv = lin(h, P, p + "self_attention.linear_qkv").view(B, Te, heads, 3, D)
            q, k, v = (qkv[:, :, :, i, :].transpose(1, 2) for i in range(3))
            return lin(merge(attend(q, k, v, emask, ebias), Te), P, p + "self_attention.linear_proj")

        x = sub(x, p + "input_layernorm", self_attn)
        x = sub(x, p + "pre_mlp_layernorm", lambda h: mlp(h, p))
    e = ln(x, P, "encoder.final_layernorm", eps)
    # decoder
    y = wte[dec_tokens] + (0 if rel else P["embedding.position_embeddings.weight"][:Td])
    dbias = rel_bias(P["decoder.relative_attention_bias.weight"], Td, False) if rel else None
    causal = torch.ones(Td, Td, dtype=torch.bool).tril()[None, None]
    dmask = causal & dec_mask.bool()[:, None, None, :]
    for l in range(int(a["dec_layers"])):
        p = f"decoder.layers.{l}."

        def self_attn(h):
            qkv = lin(h, P, p + "self_attention.linear_qkv").view(B, Td, heads, 3, D)
            q, k, v = (qkv[:, :, :, i, :].transpose(1, 2) for i in range(3))
            return lin(merge(attend(q, k, v, dmask, dbias), Td), P, p + "self_attention.linear_proj")

        def cross_attn(h):
            q = split(lin(h, P, p + "cross_attention.linear_q"), Td)
            kv = lin(e, P, p + "cross_attention.linear_kv").view(B, Te, heads, 2, D)
            k, v = (kv[:, :, :, i, :].transpose(1, 2) for i in range(2))
            return lin(merge(attend(q, k, v, emask), Td), P, p + "cross_attention.linear_proj")

        y = sub(y, p + "input_layernorm", self_attn)
        y = sub(y, p + "pre_cross_attn_layernorm", cross_attn)
        y = sub(y, p + "pre_mlp_layernorm", lambda h: mlp(h, p))
    y = ln(y, P, "decoder.final_layernorm", eps)
    logits = y @ wte.t() + P["lm_head.output_layer.bias"]
    return F.cross_entropy(logits.view(B * Td, -1), labels.reshape(-1), ignore_index=-1)


def main():
    torch.set_num_threads(1)
    f = h5py.File(sys.argv[2], "r")
    a = dict(f.attrs)
    P = {n: torch.tensor(f["params"][n][()], dtype=torch.float32, requires_grad=True) for n in f["params"]}
    t = {k: torch.tensor(f[k][()], dtype=torch.long) for k in ["enc_tokens", "enc_mask", "dec_tokens", "dec_mask", "labels"]}
    loss = forward(P, a, t["enc_tokens"], t["enc_mask"], t["dec_tokens"], t["dec_mask"], t["labels"])
    loss.backward()
    with h5py.File(sys.argv[3], "w") as o:
        o.attrs["lm_loss"] = loss.item()
        for n, p in P.items():
            o[f"grads/{n}"] = p.grad.numpy()


if __name__ == "__main__":
    main()
