#!/usr/bin/python3
"""Independent PyTorch implementation of megabatch's GPT (GPT-2 / Megatron layout), the
reference of the golden tests and the benchmark. Parameters use megabatch's names and
shapes; the fused QKV output is (head, [q, k, v], head_dim) per token, as in Megatron.

  gpt_torch.py grads  IN.h5 OUT.h5          loss and every gradient for the batch in IN.h5
  gpt_torch.py adamw  IN.h5 OUT.h5 STEPS    AdamW trajectory (losses) from the weights in IN.h5
  gpt_torch.py bench  LAYERS HIDDEN HEADS SEQ VOCAB BATCH STEPS THREADS   tokens/s of training
  gpt_torch.py bench_cuda LAYERS HIDDEN HEADS SEQ VOCAB BATCH STEPS DTYPE ATTENTION
      tokens/s of training on the GPU: DTYPE f32 or bf16 (autocast, fp32 master weights, as a
      PyTorch user trains), ATTENTION explicit (the same algorithm as megabatch's: softmax of
      the full score matrix) or sdpa (F.scaled_dot_product_attention, flash where available)

IN.h5 holds attributes (layers, hidden, heads, seq, vocab, eps, and for adamw: lr, beta1,
beta2, adam_eps, weight_decay, clip), datasets params/<name>, tokens (steps?, B, T) and
labels. Dropout is off (the golden tests run without it). Where params/output_layer.weight is
given, the output layer is its own (Megatron's untied output layer), else the word embeddings;
a linear layer without params/<its name>.bias has none (--disable-bias-linear); attribute swiglu
1 gates the MLP (--swiglu: fc1's outputs are interleaved (gate, up) pairs); attributes
rotary_dim and rotary_base turn queries and keys (--position-embedding-type rope; rotary_interleaved
and rotary_factor: --rotary-interleaved, --rotary-seq-len-interpolation-factor), without
learned positions (as without params/embedding.position_embeddings.weight: --no-position-embedding);
attribute query_groups G < heads H makes the attention grouped-query
(--group-query-attention --num-query-groups G: the QKV output per token is Megatron's G groups
of [H/G queries, a key, a value], each key and value repeated for its group's query heads);
params/<layer>.self_attention.q_layernorm.weight and k_layernorm's, where given, are LayerNorms
over each head's query and key before the rotary turn (--qk-layernorm); attribute layernorm_1p 1
applies every LayerNorm's weight as 1 + w (--apply-layernorm-1p); attribute squared_relu 1 makes
the MLP's activation max(x, 0)^2 (--squared-relu); attribute residual_post_norm 1 adds each
sub-layer's output to its norm's output, not its input (--apply-residual-connection-post-layernorm);
a dataset positions (B, T), where given, holds each token's learned position (--reset-position-ids);
attribute reset_attention_eod E >= 0 masks, after each input token E, the attention to every key up
to it, as Megatron's get_ltor_masks_and_position_ids does for --reset-attention-mask.
"""
import math
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from cuda_timing import report_training_speed


def names(layers):
    out = ["embedding.word_embeddings.weight", "embedding.position_embeddings.weight"]
    for l in range(layers):
        p = f"decoder.layers.{l}."
        for n in ["input_layernorm.weight", "input_layernorm.bias", "pre_mlp_layernorm.weight",
                  "pre_mlp_layernorm.bias", "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
                  "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "self_attention.linear_proj.weight",
                  "self_attention.linear_proj.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"]:
            out.append(p + n)
    return out + ["decoder.final_layernorm.weight", "decoder.final_layernorm.bias"]


def rotate(t, rotary_dim, base, interleaved=False, factor=1):
    """Megatron's rotary embedding of t (B, H, T, D): the first rotary_dim channels turned at
    angle position / factor x base^(-2i / rotary_dim), frequencies in fp32; pairs (i, i + d/2)
    (rotate-half form) or, interleaved, (2i, 2i + 1)."""
    T = t.shape[2]
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32) * (1.0 / factor), inv_freq)
    if interleaved:
        emb = torch.stack((freqs, freqs), dim=-1).reshape(T, rotary_dim)  # f0 f0 f1 f1 ...
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(t.dtype), emb.sin().to(t.dtype)
    r, rest = t[..., :rotary_dim], t[..., rotary_dim:]
    if interleaved:
        x1, x2 = r[..., 0::2], r[..., 1::2]
        turned = torch.stack((-x2, x1), dim=-1).reshape(r.shape)
    else:
        x1, x2 = r[..., : rotary_dim // 2], r[..., rotary_dim // 2 :]
        turned = torch.cat((-x2, x1), dim=-1)
    return torch.cat((r * cos + turned * sin, rest), dim=-1)


def forward(P, tokens, labels, layers, heads, eps, sdpa=False, swiglu=False, rotary_dim=0, rotary_base=10000.0,
            query_groups=0, layernorm_1p=False, squared_relu=False, rotary_interleaved=False, rotary_factor=1,
            residual_post_norm=False, positions=None, reset_attention_eod=-1, dropout=0.0):
    """dropout: Megatron's hidden and attention dropout, both p (the benchmark's; the gradient
    checks run without, since PyTorch's masks are not megabatch's)."""
    B, T = tokens.shape
    drop = (lambda t: F.dropout(t, dropout)) if dropout else (lambda t: t)
    wte = P["embedding.word_embeddings.weight"]
    C = wte.shape[1]
    D = C // heads
    G = query_groups or heads
    per = heads // G  # query heads a key/value group
    x = wte[tokens]

    def norm(t, name):  # the LayerNorm of params/<name>.*, its weight applied as 1 + w with layernorm_1p
        w = P[name + ".weight"]
        return F.layer_norm(t, (w.shape[0],), w + 1 if layernorm_1p else w, P[name + ".bias"], eps)

    if "embedding.position_embeddings.weight" in P:  # learned positions (not with rope or NoPE)
        wpe = P["embedding.position_embeddings.weight"]
        x = x + (wpe[:T] if positions is None else wpe[positions])  # positions (B, T): --reset-position-ids
    x = drop(x)
    attend = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril().expand(B, T, T).clone()
    if reset_attention_eod >= 0:  # Megatron's loop: the rows after an end of document see nothing up to it
        for b in range(B):
            for i in (tokens[b] == reset_attention_eod).nonzero().flatten().tolist():
                attend[b, i + 1:, : i + 1] = False
    for l in range(layers):
        p = f"decoder.layers.{l}."
        h = norm(x, p + "input_layernorm")
        qkv = F.linear(h, P[p + "self_attention.linear_qkv.weight"], P.get(p + "self_attention.linear_qkv.bias"))
        qkv = qkv.view(B, T, G, per + 2, D)  # Megatron's groups: [per queries, key, value]
        q = qkv[:, :, :, :per, :].reshape(B, T, heads, D).transpose(1, 2)  # (B, H, T, D)
        k, v = (qkv[:, :, :, per + i, :].repeat_interleave(per, dim=2).transpose(1, 2) for i in range(2))
        if p + "self_attention.q_layernorm.weight" in P:  # --qk-layernorm: over each head's D channels
            q, k = norm(q, p + "self_attention.q_layernorm"), norm(k, p + "self_attention.k_layernorm")
        if rotary_dim:
            q, k = (rotate(t, rotary_dim, rotary_base, rotary_interleaved, rotary_factor) for t in (q, k))
        if sdpa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
            a = a.transpose(1, 2).reshape(B, T, C)
        else:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
            s = s.masked_fill(~attend[:, None], float("-inf"))
            a = (drop(torch.softmax(s, dim=-1)) @ v).transpose(1, 2).reshape(B, T, C)
        x = (h if residual_post_norm else x) + drop(F.linear(a, P[p + "self_attention.linear_proj.weight"],
                                                             P.get(p + "self_attention.linear_proj.bias")))
        h = norm(x, p + "pre_mlp_layernorm")
        residual = h if residual_post_norm else x
        h = F.linear(h, P[p + "mlp.linear_fc1.weight"], P.get(p + "mlp.linear_fc1.bias"))
        # SwiGLU: fc1's outputs are (gate, up) pairs, interleaved
        if swiglu:
            h = F.silu(h[..., 0::2]) * h[..., 1::2]
        else:
            h = F.relu(h) ** 2 if squared_relu else F.gelu(h, approximate="tanh")
        x = residual + drop(F.linear(h, P[p + "mlp.linear_fc2.weight"], P.get(p + "mlp.linear_fc2.bias")))
    x = norm(x, "decoder.final_layernorm")
    logits = x @ P.get("output_layer.weight", wte).t()  # untied: the output layer's own (Megatron's name)
    return F.cross_entropy(logits.view(B * T, -1), labels.reshape(-1), ignore_index=-1)


def load(path):
    f = h5py.File(path, "r")
    a = dict(f.attrs)
    # the output layer where it is untied; the linear layers' biases where they have them
    qk = [f"decoder.layers.{l}.self_attention.{n}_layernorm.{w}" for l in range(int(a["layers"]))
          for n in "qk" for w in ("weight", "bias")]
    P = {n: torch.tensor(f["params"][n][()], dtype=torch.float32, requires_grad=True)
         for n in names(int(a["layers"])) + ["output_layer.weight"] + qk if n in f["params"]}
    return f, a, P


def variant(a):
    """forward's keyword arguments for the model variant IN.h5's attributes name."""
    return dict(swiglu=bool(a.get("swiglu", 0)), rotary_dim=int(a.get("rotary_dim", 0)),
                rotary_base=float(a.get("rotary_base", 10000)), query_groups=int(a.get("query_groups", 0)),
                layernorm_1p=bool(a.get("layernorm_1p", 0)), squared_relu=bool(a.get("squared_relu", 0)),
                rotary_interleaved=bool(a.get("rotary_interleaved", 0)), rotary_factor=int(a.get("rotary_factor", 1)),
                residual_post_norm=bool(a.get("residual_post_norm", 0)),
                reset_attention_eod=int(a.get("reset_attention_eod", -1)))


def bench_params(layers, hidden, seq, vocab, device):
    g = torch.Generator().manual_seed(0)
    P = {}
    for n in names(layers):
        if n == "embedding.word_embeddings.weight":
            shape = (vocab, hidden)
        elif n == "embedding.position_embeddings.weight":
            shape = (seq, hidden)
        elif n.endswith("linear_qkv.weight"):
            shape = (3 * hidden, hidden)
        elif n.endswith("linear_qkv.bias"):
            shape = (3 * hidden,)
        elif n.endswith("linear_fc1.weight"):
            shape = (4 * hidden, hidden)
        elif n.endswith("linear_fc1.bias"):
            shape = (4 * hidden,)
        elif n.endswith("linear_fc2.weight"):
            shape = (hidden, 4 * hidden)
        elif n.endswith("linear_proj.weight"):
            shape = (hidden, hidden)
        else:
            shape = (hidden,)
        P[n] = (torch.randn(shape, generator=g) * 0.02).to(device).requires_grad_()
    return P, g


def bench_cuda(layers, hidden, heads, seq, vocab, batch, steps, dtype, attention, dropout):
    dev = torch.device("cuda")
    P, g = bench_params(layers, hidden, seq, vocab, dev)
    opt = torch.optim.AdamW(P.values(), lr=1e-4, fused=True)
    tokens = torch.randint(0, 50257, (batch, seq), generator=g).to(dev)
    labels = torch.randint(0, 50257, (batch, seq), generator=g).to(dev)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if dtype == "bf16" else torch.autocast("cuda", enabled=False)
    # attention: "explicit" (megabatch's form), "sdpa" (scaled_dot_product_attention) or
    # "compile" (sdpa, the forward and loss through torch.compile; compiled in the warm-up)
    fwd = lambda: forward(P, tokens, labels, layers, heads, 1e-5, sdpa=attention != "explicit", dropout=dropout)
    if attention == "compile":
        fwd = torch.compile(fwd)
    def step():
        opt.zero_grad(set_to_none=True)
        with ctx:
            loss = fwd()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(P.values(), 1.0)
        opt.step()
    report_training_speed(step, steps, batch * seq)


def main():
    mode = sys.argv[1]
    if mode == "bench_cuda":
        layers, hidden, heads, seq, vocab, batch, steps = (int(x) for x in sys.argv[2:9])
        dropout = float(sys.argv[11]) if len(sys.argv) > 11 else 0.0
        return bench_cuda(layers, hidden, heads, seq, vocab, batch, steps, sys.argv[9], sys.argv[10], dropout)
    torch.set_num_threads(int(sys.argv[9]) if mode == "bench" else 1)
    if mode == "grads":
        f, a, P = load(sys.argv[2])
        tokens = torch.tensor(f["tokens"][()], dtype=torch.long)
        labels = torch.tensor(f["labels"][()], dtype=torch.long)
        positions = torch.tensor(f["positions"][()], dtype=torch.long) if "positions" in f else None
        loss = forward(P, tokens, labels, int(a["layers"]), int(a["heads"]), float(a["eps"]), positions=positions,
                       **variant(a))
        loss.backward()
        with h5py.File(sys.argv[3], "w") as o:
            o.attrs["loss"] = loss.item()
            for n, t in P.items():
                o[f"grads/{n}"] = t.grad.numpy()
    elif mode == "adamw":
        f, a, P = load(sys.argv[2])
        steps = int(sys.argv[4])
        opt = torch.optim.AdamW(P.values(), lr=float(a["lr"]), betas=(float(a["beta1"]), float(a["beta2"])),
                                eps=float(a["adam_eps"]), weight_decay=0.0)
        decay = [t for n, t in P.items() if not (n.endswith(".bias") or "layernorm" in n)]
        losses = []
        for s in range(steps):
            tokens = torch.tensor(f["tokens"][s], dtype=torch.long)
            labels = torch.tensor(f["labels"][s], dtype=torch.long)
            opt.zero_grad()
            loss = forward(P, tokens, labels, int(a["layers"]), int(a["heads"]), float(a["eps"]), **variant(a))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(P.values(), float(a["clip"]))
            with torch.no_grad():  # decoupled decay of weights and embeddings only (Megatron's groups)
                for t in decay:
                    t.mul_(1 - float(a["lr"]) * float(a["weight_decay"]))
            opt.step()
            losses.append(loss.item())
        with h5py.File(sys.argv[3], "w") as o:
            o["losses"] = np.array(losses)
    elif mode == "bench":
        layers, hidden, heads, seq, vocab, batch, steps = (int(x) for x in sys.argv[2:9])
        P, g = bench_params(layers, hidden, seq, vocab, torch.device("cpu"))
        opt = torch.optim.AdamW(P.values(), lr=1e-4)
        tokens = torch.randint(0, 50257, (batch, seq), generator=g)
        labels = torch.randint(0, 50257, (batch, seq), generator=g)
        times = []
        for s in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = forward(P, tokens, labels, layers, heads, 1e-5)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(P.values(), 1.0)
            opt.step()
            times.append(time.perf_counter() - t0)
        t = sorted(times[1:])[len(times[1:]) // 2]  # median after the first (warm-up) step
        print(f"tokens_per_second {batch * seq / t:.1f}")
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
