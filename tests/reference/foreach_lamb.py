"""LAMB (Apex's FusedLAMB update) written with torch._foreach ops: the PyTorch reference of
the GPU benchmarks (bench/optim_torch_bench.py, bert_torch.py bench_cuda). Adam's moments
with bias correction, weight decay in the update, the trust ratio |w| / |update| of each
tensor (1 where either norm is 0); no host synchronization."""
import math

import torch


class ForeachLamb:
    def __init__(self, params, lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        self.params = list(params)
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    @torch.no_grad()
    def step(self):
        self.t += 1
        g = [p.grad for p in self.params]
        torch._foreach_mul_(self.m, self.b1)
        torch._foreach_add_(self.m, g, alpha=1 - self.b1)
        torch._foreach_mul_(self.v, self.b2)
        torch._foreach_addcmul_(self.v, g, g, value=1 - self.b2)
        denom = torch._foreach_sqrt(self.v)
        torch._foreach_div_(denom, math.sqrt(1 - self.b2**self.t))
        torch._foreach_add_(denom, self.eps)
        update = torch._foreach_div(self.m, denom)
        torch._foreach_div_(update, 1 - self.b1**self.t)
        torch._foreach_add_(update, self.params, alpha=self.wd)
        wn = torch.stack(torch._foreach_norm(self.params))
        un = torch.stack(torch._foreach_norm(update))
        ratio = torch.where((wn > 0) & (un > 0), wn / un, torch.ones_like(wn)) * -self.lr
        torch._foreach_mul_(update, list(ratio.unbind()))
        torch._foreach_add_(self.params, update)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None
