#!/usr/bin/python3
"""PyTorch side of optim_bench: median optimizer step time over the tensor shapes listed in
SHAPES (one "rows cols" line per tensor, cols 1 for vectors), fp32.

  optim_torch_bench.py SHAPES STEPS THREADS [cpu|cuda]

cpu (default): torch.optim.AdamW (foreach)         -> "step_seconds X"
cuda: torch.optim.AdamW (fused), and a LAMB made of torch._foreach ops (Apex's update: Adam's
      moments with bias correction, weight decay in the update, the trust ratio
      |w| / |update| of each tensor, 1 where either is 0)
                                                     -> "step_seconds X", "lamb_step_seconds Y"
"""
import os
import sys
import time

import torch

shapes = [tuple(int(x) for x in line.split()) for line in open(sys.argv[1]) if line.strip()]
steps, threads = int(sys.argv[2]), int(sys.argv[3])
device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
torch.set_num_threads(threads)
gen = torch.Generator().manual_seed(0)
params = []
for r, c in shapes:
    p = (torch.randn(r, c, generator=gen) * 0.02).to(device)
    p.grad = (torch.randn(r, c, generator=gen) * 1e-3).to(device)
    params.append(p)


def sync():
    if device != "cpu":
        torch.cuda.synchronize()


def median_seconds(step):
    times = []
    with torch.no_grad():
        for s in range(steps + 1):
            sync()
            t0 = time.perf_counter()
            step(s + 1)
            sync()
            if s > 0:
                times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


if device == "cpu":
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=True)
else:
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)
print(f"step_seconds {median_seconds(lambda s: opt.step()):.6f}")

if device != "cpu":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
    from foreach_lamb import ForeachLamb

    lamb = ForeachLamb(params, lr=1e-4, weight_decay=0.01)
    print(f"lamb_step_seconds {median_seconds(lambda s: lamb.step()):.6f}")
