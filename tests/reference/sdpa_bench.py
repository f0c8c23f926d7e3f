"""PyTorch's scaled_dot_product_attention timed as attention_bench times megabatch's flash
kernels: q (B, H, T, D), k and v (B, G, T, D) (G = H unless GROUPS says: grouped-query
attention, enable_gqa) in bf16/fp16 on the GPU, forward and forward + backward, the median of
`reps` calls timed with CUDA events after warm-up. DOCLEN L > 0 packs each row with documents of
L tokens that attend within themselves (--reset-attention-mask), given to SDPA as a boolean mask
(T, T), with the causal one folded in (SDPA then runs a kernel that takes masks). DROPOUT P > 0:
SDPA's attention dropout (dropout_p). One line per configuration: "sdpa T D causal fwd_ms
fwdbwd_ms".

    python3 sdpa_bench.py TOKENS HIDDEN DTYPE REPS T:D:CAUSAL[:GROUPS[:DOCLEN[:DROPOUT]]] [...]
"""
import sys

import torch
import torch.nn.functional as F


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    tokens, hidden, dtype, reps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    dt = torch.bfloat16 if dtype == "bf16" else torch.float16
    g = torch.Generator(device="cuda").manual_seed(0)
    for spec in sys.argv[5:]:
        fields = spec.split(":")
        T, D, causal, *rest = (int(x) for x in fields[:5])
        B, H = max(tokens // T, 1), hidden // D
        G = rest[0] if rest and rest[0] else H
        L = rest[1] if len(rest) > 1 else 0
        p = float(fields[5]) if len(fields) > 5 else 0.0
        q = torch.randn(B, H, T, D, device="cuda", dtype=dt, generator=g, requires_grad=True)
        k, v = (torch.randn(B, G, T, D, device="cuda", dtype=dt, generator=g, requires_grad=True) for _ in range(2))
        dy = torch.randn(B, H, T, D, device="cuda", dtype=dt, generator=g)
        kw = {"enable_gqa": True} if G != H else {}
        if p:
            kw["dropout_p"] = p
        if L:
            doc = torch.arange(T, device="cuda") // L
            mask = doc[:, None] == doc[None, :]
            kw["attn_mask"] = mask.tril() if causal else mask
        else:
            kw["is_causal"] = bool(causal)
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, **kw)
        def both():
            F.scaled_dot_product_attention(q, k, v, **kw).backward(dy)
        print(f"sdpa {T} {D} {causal} {median_ms(fwd, reps):.4f} {median_ms(both, reps):.4f}", flush=True)


if __name__ == "__main__":
    main()
