#!/usr/bin/python3
"""Figures of a sweep (sweep plot DIR): PNG and SVG in DIR/figures.

  loss_vs_iteration   lm loss against iterations, one line per point, a panel per optimizer
  loss_vs_samples     the same against consumed samples (every point sees the same data)
  scaling             final training and validation loss against global batch size per
                      optimizer: the large-batch scaling curve
  lr_schedule         learning rate against consumed samples
  trust_ratio         per-tensor trust ratios over training (log10), a panel per point that logged them
  noise_scale         the gradient noise scale B_simple over training, where logged

Works on runs that are still being written.
"""
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megabatch_runs import load_points, swept_keys  # noqa: E402


def label(p, keys):
    parts = []
    for k in keys:
        if k in ("optimizer", "train_iters", "min_lr", "seed") or k not in p.config:
            continue
        v = p.config[k]
        name = {"global_batch_size": "B", "lr": "lr"}.get(k, k)
        parts.append(f"{name}={v:.3g}" if isinstance(v, float) else f"{name}={v}")
    return ", ".join(parts) or p.id


def by_optimizer(points):
    groups = {}
    for p in points:
        groups.setdefault(p.optimizer, []).append(p)
    for g in groups.values():
        g.sort(key=lambda p: (p.batch, p.id))
    return groups


def save(fig, out_dir, name, written):
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, f"{name}.{ext}")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        written.append(path)
    plt.close(fig)


def loss_curves(points, keys, title, x_name, x_label, out_dir, name, written):
    groups = by_optimizer(points)
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4), sharey=True, squeeze=False)
    for ax, (opt, ps) in zip(axes[0], groups.items()):
        cmap = plt.get_cmap("viridis", max(2, len(ps)))
        for i, p in enumerate(ps):
            x, y = p.series(x_name), p.series("train/lm_loss")
            n = min(len(x), len(y))
            if n:
                ax.plot(x[:n], y[:n], color=cmap(i), lw=1.2, label=label(p, keys))
        ax.set_title(opt)
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("lm loss (train)")
    fig.suptitle(title)
    save(fig, out_dir, name, written)


def scaling(points, title, out_dir, written):
    groups = by_optimizer(points)
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for k, (opt, ps) in enumerate(groups.items()):
        color = plt.get_cmap("tab10")(k)
        b = [p.batch for p in ps]
        ax.plot(b, [p.final_train_loss() for p in ps], "o-", color=color, label=f"{opt}: final train loss")
        valid = [p.final_valid_loss() for p in ps]
        if any(math.isfinite(v) for v in valid):
            ax.plot(b, valid, "s--", color=color, label=f"{opt}: final validation loss")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch size (samples)")
    ax.set_ylabel("lm loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    save(fig, out_dir, "scaling", written)


def lr_schedules(points, keys, title, out_dir, written):
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, (opt, ps) in enumerate(by_optimizer(points).items()):
        for i, p in enumerate(ps):
            x, y = p.series("train/consumed_samples"), p.series("train/learning_rate")
            n = min(len(x), len(y))
            ax.plot(x[:n], y[:n], color=plt.get_cmap("tab10")(k), alpha=0.4 + 0.6 * (i + 1) / len(ps), lw=1,
                    label=f"{opt}, {label(p, keys)}")
    ax.set_xlabel("consumed samples")
    ax.set_ylabel("learning rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    ax.set_title(title)
    save(fig, out_dir, "lr_schedule", written)


def trust_ratios(points, title, out_dir, written):
    ps = [p for p in points if len(p.series("optimizer/trust_ratio"))]
    if not ps:
        return
    fig, axes = plt.subplots(len(ps), 1, figsize=(8, 2.2 + 1.6 * len(ps)), squeeze=False)
    for ax, p in zip(axes[:, 0], ps):
        r = np.asarray(p.metrics["optimizer/trust_ratio"], dtype=float)  # (steps, tensors)
        names = p.metrics.get("optimizer/tensor_names", [str(i) for i in range(r.shape[1])])
        it = p.series("optimizer/iteration")
        with np.errstate(divide="ignore", invalid="ignore"):
            img = np.log10(r.T)
        m = ax.imshow(img, aspect="auto", interpolation="nearest", cmap="magma",
                      extent=[it[0] if len(it) else 0, it[-1] if len(it) else 1, len(names) - 0.5, -0.5])
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels([n.replace(".weight", ".w").replace(".bias", ".b") for n in names], fontsize=4)
        ax.set_title(p.id, fontsize=9)
        fig.colorbar(m, ax=ax, label="log10 trust ratio")
    axes[-1, 0].set_xlabel("iteration")
    fig.suptitle(title)
    save(fig, out_dir, "trust_ratio", written)


def noise_scale(points, title, out_dir, written):
    ps = [p for p in points if len(p.series("noise_scale/b_simple"))]
    if not ps:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for p in ps:
        ax.plot(p.series("noise_scale/iteration"), p.series("noise_scale/b_simple"), label=p.id)
    ax.set_xlabel("iteration")
    ax.set_ylabel("B_simple = tr(Sigma) / |G|^2")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title)
    save(fig, out_dir, "noise_scale", written)


def plot(sweep_dir):
    sweep, points = load_points(sweep_dir)
    points = [p for p in points if p.metrics]
    if not points:
        sys.exit(f"sweep plot: no point of {sweep_dir} has metrics yet")
    out_dir = os.path.join(sweep_dir, "figures")
    os.makedirs(out_dir, exist_ok=True)
    keys = swept_keys(points)
    axes = " x ".join(k for k in keys if k not in ("lr", "min_lr", "train_iters")) or "one point"
    name = sweep["name"]
    written = []
    loss_curves(points, keys, f"{name}: lm loss by iteration ({axes})", "train/iteration", "iteration", out_dir,
                "loss_vs_iteration", written)
    loss_curves(points, keys, f"{name}: lm loss by consumed samples ({axes})", "train/consumed_samples",
                "consumed samples", out_dir, "loss_vs_samples", written)
    scaling(points, f"{name}: loss at the end of the same sample budget", out_dir, written)
    lr_schedules(points, keys, f"{name}: learning-rate schedules", out_dir, written)
    trust_ratios(points, f"{name}: per-tensor trust ratios", out_dir, written)
    noise_scale(points, f"{name}: gradient noise scale", out_dir, written)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: plot.py RUNS/<sweep>")
    for path in plot(sys.argv[1]):
        print(path)
