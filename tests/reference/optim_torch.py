#!/usr/bin/python3
"""PyTorch references for the optimizer plugins, written independently of them.

  optim_torch.py IN.h5 OUT.h5
IN.h5: attrs optimizer (sgd, adamw, lamb, lars, lamb_noise, lamb_embscale), lr, steps,
global_batch and the hyperparameters; params/<i> (initial values), grads/<i> (steps, numel),
role/<i> (0 embedding, 1 weight, 2 bias, 3 norm), and for lamb_noise noise/<i> (steps,
numel): the standard normal draws of each step; optionally weight_decay_steps (steps): the
weight decay of each step (a schedule's), which replaces the weight_decay attribute; and
decoupled_lr_steps (steps) with decoupled/<i> (1 or 0): the learning rate of each step for
the tensors marked 1 (Megatron's --decoupled-lr), the others keeping lr.
OUT.h5: params/<i> after the steps, state/<i>/<name>, and per step trust/<i> (the trust
ratio each tensor used).

sgd and adamw are torch.optim's own. lamb follows NVIDIA Apex FusedLAMB (global-norm
pre-normalization, bias-corrected moments, decoupled decay inside the update, trust ratio
|w|/|u| on decayed tensors or all with nvlamb); lars follows You et al. 2017, Algorithm 1.
"""
import math
import sys

import h5py
import torch

EMBEDDING, WEIGHT, BIAS, NORM = 0, 1, 2, 3

f = h5py.File(sys.argv[1], "r")
a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
name = a["optimizer"]
n = len(f["params"])
steps = int(a["steps"])
lr = float(a["lr"])
P = [torch.tensor(f["params"][str(i)][()]) for i in range(n)]
roles = [int(f["role"][str(i)][()][0]) for i in range(n)]
grads = [torch.tensor(f["grads"][str(i)][()]) for i in range(n)]
decayed = [r in (EMBEDDING, WEIGHT) for r in roles]
state = [dict() for _ in range(n)]
trust = [[] for _ in range(n)]


def hp(key):
    return float(a[key])


wd_steps = [float(x) for x in f["weight_decay_steps"][()]] if "weight_decay_steps" in f else None


def wd_at(s):
    """The weight decay of step s (from 0)."""
    return wd_steps[s] if wd_steps is not None else hp("weight_decay")


dlr_steps = [float(x) for x in f["decoupled_lr_steps"][()]] if "decoupled_lr_steps" in f else None
decoupled = [dlr_steps is not None and int(f["decoupled"][str(i)][()][0]) == 1 for i in range(n)]


def lr_at(i, s):
    """The learning rate of tensor i at step s (from 0)."""
    return dlr_steps[s] if decoupled[i] else lr


if name in ("sgd", "adamw"):
    params = [p.clone().requires_grad_(True) for p in P]
    # a group per (decayed, decoupled): each step sets its weight decay and learning rate
    kinds = sorted({(d, c) for d, c in zip(decayed, decoupled)})
    groups = [{"params": [p for p, d, c in zip(params, decayed, decoupled) if (d, c) == k]} for k in kinds]
    if name == "sgd":
        opt = torch.optim.SGD(groups, lr=lr, momentum=hp("momentum"), dampening=hp("dampening"),
                              weight_decay=hp("weight_decay"), nesterov=bool(a["nesterov"]))
    else:
        opt = torch.optim.AdamW(groups, lr=lr, betas=(hp("beta1"), hp("beta2")), eps=hp("eps"),
                                weight_decay=hp("weight_decay"))
    for s in range(steps):
        for i, p in enumerate(params):
            p.grad = grads[i][s].clone()
        for (d, c), group in zip(kinds, opt.param_groups):
            group["weight_decay"] = wd_at(s) if d else 0.0
            group["lr"] = dlr_steps[s] if c else lr
        opt.step()
    P = [p.detach() for p in params]
    for i, p in enumerate(params):
        for k, v in opt.state[p].items():
            if torch.is_tensor(v) and v.numel() == p.numel():
                state[i][k] = v
elif name in ("lamb", "lamb_noise", "lamb_embscale"):
    b1, b2, eps, max_norm = hp("beta1"), hp("beta2"), hp("eps"), hp("max_grad_norm")
    nvlamb = bool(a["nvlamb"])
    B = float(a["global_batch"])
    for i in range(n):
        state[i] = {"exp_avg": torch.zeros_like(P[i]), "exp_avg_sq": torch.zeros_like(P[i])}
    for s in range(steps):
        t = s + 1
        wd = wd_at(s)
        g_all = [grads[i][s] for i in range(n)]
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in g_all))
        c = norm / max_norm if max_norm > 0 and norm > max_norm else 1.0
        for i in range(n):
            g = g_all[i] / c
            if name == "lamb_noise":
                extra = max(0.0, B / hp("ref_batch") - 1.0)
                rms = math.sqrt(float((g.double() ** 2).mean()))
                sigma = hp("scale") * rms * math.sqrt(extra) / (1.0 + s) ** hp("decay")
                if extra > 0 and hp("scale") > 0:
                    g = g + sigma * torch.tensor(f["noise"][str(i)][s])
            m, v = state[i]["exp_avg"], state[i]["exp_avg_sq"]
            m.mul_(b1).add_((1 - b1) * g)
            v.mul_(b2).add_((1 - b2) * g * g)
            wdi = wd if decayed[i] else 0.0
            u = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps) + wdi * P[i]
            wn, un = float(P[i].norm()), float(u.norm())
            ratio = wn / un if (nvlamb or wdi != 0) and wn > 0 and un > 0 else 1.0
            lr_i = lr_at(i, s)
            if name == "lamb_embscale" and roles[i] == EMBEDDING:
                mult = hp("multiplier")
                lr_i = lr_i * (mult if mult > 0 else (B / hp("ref_batch")) ** (hp("alpha") / 2))
            P[i] = P[i] - (lr_i * ratio) * u
            trust[i].append(ratio)
elif name == "lars":
    mu, eta, eps = hp("momentum"), hp("trust_coefficient"), hp("eps")
    for i in range(n):
        state[i] = {"momentum_buffer": torch.zeros_like(P[i])}
    for s in range(steps):
        wd = wd_at(s)
        for i in range(n):
            g = grads[i][s]
            wdi = wd if decayed[i] else 0.0
            wn, gn = float(P[i].norm()), float(g.norm())
            local = eta * wn / (gn + wdi * wn + eps) if decayed[i] and wn > 0 and gn > 0 else 1.0
            buf = state[i]["momentum_buffer"]
            buf.mul_(mu).add_(lr_at(i, s) * local * (g + wdi * P[i]))
            P[i] = P[i] - buf
            trust[i].append(local)
else:
    sys.exit(f"optim_torch.py: no reference for optimizer '{name}'")

with h5py.File(sys.argv[2], "w") as o:
    for i in range(n):
        o[f"params/{i}"] = P[i].numpy()
        for k, v in state[i].items():
            o[f"state/{i}/{k}"] = v.numpy()
        if trust[i]:
            o[f"trust/{i}"] = torch.tensor(trust[i], dtype=torch.float64).numpy()
