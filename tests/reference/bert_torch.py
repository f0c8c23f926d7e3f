#!/usr/bin/python3
"""Independent PyTorch implementation of megabatch's BERT (Megatron layout), the reference
of the golden test. Parameters use megabatch's names and shapes; the fused QKV output is
(head, [q, k, v], head_dim) per token, as in Megatron.

  bert_torch.py grads IN.h5 OUT.h5     lm loss, sop loss and every gradient of lm + sop
  bert_torch.py bench_cuda LAYERS HIDDEN HEADS SEQ VOCAB BATCH STEPS DTYPE OPTIMIZER POST_LN MASK_EVERY
      training throughput on a GPU (gpu_train_bench's BERT rows): random parameters and
      tokens, two segments, no padding, every MASK_EVERY-th position (from 1) masked and the
      LM head on those rows only, SDPA, autocast DTYPE, OPTIMIZER adamw (fused) or lamb
      (foreach_lamb.py), the gradient clipped to norm 1 -> "tokens_per_second X",
      "peak_reserved_bytes Y"

IN.h5: attributes layers, heads, eps, post_ln (0/1); datasets params/<name>, tokens (B, T),
token_types (B, T), padding_mask (B, T), labels (B, T; -1 = not masked), sop_labels (B).
GELU is the tanh form throughout (as megabatch's op); dropout is off.
"""
import math
import sys

import h5py
import torch
import torch.nn.functional as F

from cuda_timing import report_training_speed


def layer_norm(x, P, name, eps):
    return F.layer_norm(x, (x.shape[-1],), P[name + ".weight"], P[name + ".bias"], eps)


def forward(P, tokens, types, pad, labels, sop_labels, layers, heads, eps, post_ln, sdpa=False, rows=None,
            dropout=0.0):
    """pad None: no padding. sdpa: F.scaled_dot_product_attention. rows: the flat positions of
    the LM head (the masked ones; default all, labels -1 ignored). dropout: Megatron's hidden and
    attention dropout, both p (the benchmark's; PyTorch's masks are not megabatch's)."""
    B, T = tokens.shape
    drop = (lambda t: F.dropout(t, dropout)) if dropout else (lambda t: t)
    wte = P["embedding.word_embeddings.weight"]
    C = wte.shape[1]
    D = C // heads
    x = wte[tokens] + P["embedding.position_embeddings.weight"][:T] + P["embedding.tokentype_embeddings.weight"][types]
    if post_ln:
        x = layer_norm(x, P, "embedding.layernorm", eps)
    x = drop(x)
    keymask = None if pad is None else pad.bool()[:, None, None, :]  # (B, 1, 1, T): attend to real tokens only
    for l in range(layers):
        p = f"encoder.layers.{l}."
        h = x if post_ln else layer_norm(x, P, p + "input_layernorm", eps)
        qkv = F.linear(h, P[p + "self_attention.linear_qkv.weight"], P[p + "self_attention.linear_qkv.bias"])
        qkv = qkv.view(B, T, heads, 3, D)
        q, k, v = (qkv[:, :, :, i, :].transpose(1, 2) for i in range(3))
        if sdpa:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=keymask, dropout_p=dropout)
            a = a.transpose(1, 2).reshape(B, T, C)
        else:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
            if keymask is not None:
                s = s.masked_fill(~keymask, float("-inf"))
            a = (drop(torch.softmax(s, dim=-1)) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + drop(F.linear(a, P[p + "self_attention.linear_proj.weight"], P[p + "self_attention.linear_proj.bias"]))
        if post_ln:
            x = layer_norm(x, P, p + "input_layernorm", eps)
        h = x if post_ln else layer_norm(x, P, p + "pre_mlp_layernorm", eps)
        h = F.gelu(F.linear(h, P[p + "mlp.linear_fc1.weight"], P[p + "mlp.linear_fc1.bias"]), approximate="tanh")
        x = x + drop(F.linear(h, P[p + "mlp.linear_fc2.weight"], P[p + "mlp.linear_fc2.bias"]))
        if post_ln:
            x = layer_norm(x, P, p + "pre_mlp_layernorm", eps)
    if not post_ln:
        x = layer_norm(x, P, "encoder.final_layernorm", eps)
    # masked LM: dense, gelu, layer norm, tied decoder + bias, mean over masked tokens
    xs, ys = x.reshape(B * T, C), labels.reshape(-1)
    if rows is not None:
        xs, ys = xs[rows], ys[rows]
    h = F.gelu(F.linear(xs, P["lm_head.dense.weight"], P["lm_head.dense.bias"]), approximate="tanh")
    h = layer_norm(h, P, "lm_head.layer_norm", eps)
    logits = h @ wte.t() + P["output_layer.bias"]
    lm = F.cross_entropy(logits, ys, ignore_index=-1)
    # sentence order: tanh pooler on [CLS], binary head
    pooled = torch.tanh(F.linear(x[:, 0], P["pooler.dense.weight"], P["pooler.dense.bias"]))
    sop = F.cross_entropy(F.linear(pooled, P["binary_head.weight"], P["binary_head.bias"]), sop_labels)
    return lm, sop


def bench_params(layers, hidden, seq, vocab, post_ln, device):
    g = torch.Generator().manual_seed(0)
    shapes = {"embedding.word_embeddings.weight": (vocab, hidden), "embedding.position_embeddings.weight": (seq, hidden),
              "embedding.tokentype_embeddings.weight": (2, hidden)}
    norms = ["embedding.layernorm"] if post_ln else ["encoder.final_layernorm"]
    for l in range(layers):
        p = f"encoder.layers.{l}."
        norms += [p + "input_layernorm", p + "pre_mlp_layernorm"]
        shapes.update({p + "self_attention.linear_qkv.weight": (3 * hidden, hidden), p + "self_attention.linear_qkv.bias": (3 * hidden,),
                       p + "self_attention.linear_proj.weight": (hidden, hidden), p + "self_attention.linear_proj.bias": (hidden,),
                       p + "mlp.linear_fc1.weight": (4 * hidden, hidden), p + "mlp.linear_fc1.bias": (4 * hidden,),
                       p + "mlp.linear_fc2.weight": (hidden, 4 * hidden), p + "mlp.linear_fc2.bias": (hidden,)})
    norms.append("lm_head.layer_norm")
    for n in norms:
        shapes[n + ".weight"], shapes[n + ".bias"] = (hidden,), (hidden,)
    shapes.update({"lm_head.dense.weight": (hidden, hidden), "lm_head.dense.bias": (hidden,), "output_layer.bias": (vocab,),
                   "pooler.dense.weight": (hidden, hidden), "pooler.dense.bias": (hidden,),
                   "binary_head.weight": (2, hidden), "binary_head.bias": (2,)})
    P = {}
    for n, shape in shapes.items():
        t = torch.ones(shape) if n.endswith("layernorm.weight") or n.endswith("layer_norm.weight") else torch.randn(shape, generator=g) * 0.02
        P[n] = t.to(device).requires_grad_()
    return P, g


def bench_cuda(layers, hidden, heads, seq, vocab, batch, steps, dtype, optimizer, post_ln, mask_every, dropout):
    dev = torch.device("cuda")
    P, g = bench_params(layers, hidden, seq, vocab, post_ln, dev)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(P.values(), lr=1e-4, weight_decay=0.01, fused=True)
    else:
        from foreach_lamb import ForeachLamb
        opt = ForeachLamb(P.values(), lr=1e-4, weight_decay=0.01)
    tokens = torch.randint(0, vocab, (batch, seq), generator=g).to(dev)
    types = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).to(dev)
    labels = torch.randint(0, vocab, (batch, seq), generator=g).to(dev)
    rows = torch.tensor([i for i in range(batch * seq) if (i % seq) % mask_every == 1], device=dev)
    sop = torch.randint(0, 2, (batch,), generator=g).to(dev)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if dtype == "bf16" else torch.autocast("cuda", enabled=False)

    def step():
        opt.zero_grad(set_to_none=True)
        with ctx:
            lm, so = forward(P, tokens, types, None, labels, sop, layers, heads, 1e-5, post_ln, sdpa=True, rows=rows,
                             dropout=dropout)
        (lm + so).backward()
        torch.nn.utils.clip_grad_norm_(P.values(), 1.0)
        opt.step()

    report_training_speed(step, steps, batch * seq)


def main():
    if sys.argv[1] == "bench_cuda":
        a = sys.argv[2:]
        layers, hidden, heads, seq, vocab, batch, steps = (int(x) for x in a[:7])
        dropout = float(a[11]) if len(a) > 11 else 0.0
        return bench_cuda(layers, hidden, heads, seq, vocab, batch, steps, a[7], a[8], a[9] == "1", int(a[10]), dropout)
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
