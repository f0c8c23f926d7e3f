#!/usr/bin/python3
"""PyTorch side of optim_bench: median step time of torch.optim.AdamW (foreach) over the
tensor shapes listed in SHAPES (one "rows cols" line per tensor, cols 1 for vectors).

  optim_torch_bench.py SHAPES STEPS THREADS      -> prints "step_seconds X"
"""
import sys
import time

import torch

shapes = [tuple(int(x) for x in line.split()) for line in open(sys.argv[1]) if line.strip()]
steps, threads = int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
gen = torch.Generator().manual_seed(0)
params = []
for r, c in shapes:
    p = torch.randn(r, c, generator=gen) * 0.02
    p.grad = torch.randn(r, c, generator=gen) * 1e-3
    params.append(p)
opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=True)
times = []
with torch.no_grad():
    for s in range(steps + 1):
        t0 = time.perf_counter()
        opt.step()
        if s > 0:
            times.append(time.perf_counter() - t0)
times.sort()
print(f"step_seconds {times[len(times) // 2]:.6f}")
