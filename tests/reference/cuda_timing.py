"""Timing of a training step on a GPU for the PyTorch references of gpu_train_bench
(gpt_torch.py and bert_torch.py bench_cuda)."""
import time

import torch


def report_training_speed(step, steps, tokens_per_step):
    """Runs step() three times (warm-up), then `steps` timed times; prints
    "tokens_per_second X", "peak_memory_bytes Y" and "peak_reserved_bytes Z"."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    t = (time.perf_counter() - t0) / steps
    print(f"tokens_per_second {tokens_per_step / t:.1f}")
    print(f"peak_memory_bytes {torch.cuda.max_memory_allocated()}")
    print(f"peak_reserved_bytes {torch.cuda.max_memory_reserved()}")
