#!/usr/bin/python3
"""torch.optim reference for the sgd and adamw plugins.

  optim_torch.py IN.h5 OUT.h5
IN.h5: attrs optimizer ("sgd"|"adamw"), lr, steps and the hyperparameters; params/<i>
(initial values), grads/<i> (steps, numel), decay/<i> (1 if weight decay applies).
OUT.h5: params/<i> after the steps and state/<i>/<name>.
"""
import sys

import h5py
import torch

f = h5py.File(sys.argv[1], "r")
a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
n = len(f["params"])
P = [torch.tensor(f["params"][str(i)][()], requires_grad=True) for i in range(n)]
decay = [bool(f["decay"][str(i)][()]) for i in range(n)]
groups = [{"params": [p for p, d in zip(P, decay) if d]}, {"params": [p for p, d in zip(P, decay) if not d],
                                                          "weight_decay": 0.0}]
if a["optimizer"] == "sgd":
    opt = torch.optim.SGD(groups, lr=float(a["lr"]), momentum=float(a["momentum"]), dampening=float(a["dampening"]),
                          weight_decay=float(a["weight_decay"]), nesterov=bool(a["nesterov"]))
else:
    opt = torch.optim.AdamW(groups, lr=float(a["lr"]), betas=(float(a["beta1"]), float(a["beta2"])),
                            eps=float(a["eps"]), weight_decay=float(a["weight_decay"]))
for s in range(int(a["steps"])):
    for i, p in enumerate(P):
        p.grad = torch.tensor(f["grads"][str(i)][s])
    opt.step()
with h5py.File(sys.argv[2], "w") as o:
    for i, p in enumerate(P):
        o[f"params/{i}"] = p.detach().numpy()
        for k, v in opt.state[p].items():
            if torch.is_tensor(v) and v.numel() == p.numel():
                o[f"state/{i}/{k}"] = v.numpy()
