#!/usr/bin/python3
"""Figures of a sweep (sweep plot DIR [DIR ...]): PNG and SVG in the first DIR's figures/.

  loss_vs_iteration   train loss against iterations, a line per setting, a panel per optimizer
  loss_vs_samples     the same against consumed samples (every point sees the same data)
  scaling             the result (final validation loss) against global batch size
  lr_schedule         each step's learning rate over the samples it consumed
  trust_ratio         per-tensor trust ratios over training (log10), at most a few dozen
                      rows (tensors aggregated by layer and module when there are more)
  noise_scale         the gradient noise scale B_simple over training, where logged

A setting is the points that differ only by seed: its line is the mean over seeds with a
min-max band. Every other swept value (and, with several DIRs, the sweep) is its own line.
Diverged points are drawn up to where they left the axes and marked with an x at the top
edge; the axes are scaled to the points that did not diverge. Works on running sweeps.
"""
import json
import math
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.transforms as mtransforms  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megabatch_runs import (HIDDEN, RESULT_LABEL, SPREAD_LABEL, axis_values, legend_keys, line_keys,  # noqa: E402
                            load_many, settings)

MAX_HEATMAP_ROWS = 36


def label(setting, keys):
    shown = {("B" if k == "global_batch_size" else k): setting.config.get(k) for k in keys if k not in HIDDEN}
    parts = axis_values(shown, list(shown))
    if len(setting.points) > 1:
        parts.append(f"{len(setting.points)} seeds")
    return ", ".join(parts) or setting.points[0].id


def by_optimizer(groups):
    out = {}
    for g in groups:
        out.setdefault(g.optimizer, []).append(g)
    for g in out.values():
        g.sort(key=lambda s: (s.batch, s.points[0].id))
    return out


def save(fig, out_dir, name, written):
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, f"{name}.{ext}")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        written.append(path)
    plt.close(fig)


def healthy_limits(values):
    """y-limits from the non-diverged curves, with a margin."""
    v = np.concatenate([np.asarray(x, dtype=float) for x in values]) if values else np.array([])
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return None
    lo, hi = float(v.min()), float(v.max())
    pad = 0.05 * (hi - lo if hi > lo else 1.0)
    return lo - pad, hi + pad


def mark_diverged(ax, xs, color, text=None):
    """x markers at the top edge of the axes at data x positions (does not move the limits)."""
    if not xs:
        return
    trans = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    ax.plot(xs, [0.97] * len(xs), "x", color=color, ms=8, mew=2, transform=trans, clip_on=False)
    if text:
        for x in xs:
            ax.text(x, 0.93, text, color=color, fontsize=6, transform=trans, ha="center", va="top")


def loss_curves(groups, keys, title, x_name, x_label, out_dir, name, written):
    opt_groups = by_optimizer(groups)
    fig, axes = plt.subplots(1, len(opt_groups), figsize=(5.5 * len(opt_groups), 4), sharey=True, squeeze=False)
    healthy = []
    for ax, (opt, gs) in zip(axes[0], opt_groups.items()):
        cmap = plt.get_cmap("viridis", max(2, len(gs)))
        for i, g in enumerate(gs):
            c = g.curve(x_name)
            if c is not None:
                x, mean, lo, hi = c
                ax.plot(x, mean, color=cmap(i), lw=1.2, label=label(g, keys))
                if len(g.points) - len(g.diverged) > 1:
                    ax.fill_between(x, lo, hi, color=cmap(i), alpha=0.2, lw=0)
                healthy.append(lo)
                healthy.append(hi)
            for p in g.diverged:
                x, y = p.series(x_name), p.series("train/lm_loss")
                n = min(len(x), len(y))
                ax.plot(x[:n], y[:n], color=cmap(i), lw=0.8, ls=":",
                        label=f"{label(g, keys)}: diverged" if c is None else None)
                if n:
                    mark_diverged(ax, [float(x[n - 1])], cmap(i))
        ax.set_title(opt)
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    lim = healthy_limits(healthy)
    if lim:
        axes[0][0].set_ylim(*lim)
    axes[0][0].set_ylabel("train loss (lm loss of each iteration)")
    fig.suptitle(title + ("; lines: mean over seeds, bands: " + SPREAD_LABEL
                          if any(len(g.points) > 1 for g in groups) else ""))
    save(fig, out_dir, name, written)


def scaling(groups, keys, title, out_dir, written):
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    lines = {}
    split = line_keys(groups, keys)
    for g in groups:  # by the values' JSON: a list value (a data path, a blend) is no dict key
        other = json.dumps([[k, g.config.get(k)] for k in split], sort_keys=True)
        lines.setdefault((g.optimizer, other), []).append(g)
    healthy, diverged = [], []
    for k, ((opt, other), gs) in enumerate(sorted(lines.items(), key=lambda kv: str(kv[0]))):
        other = [tuple(kv) for kv in json.loads(other)]
        color = plt.get_cmap("tab10")(k % 10)
        gs.sort(key=lambda g: g.batch)
        b, mean, lo, hi = [], [], [], []
        for g in gs:
            m, a, z = g.result()
            if math.isfinite(m):
                b.append(g.batch)
                mean.append(m)
                lo.append(m - a)
                hi.append(z - m)
            if g.diverged:
                diverged.append((g.batch, color, len(g.diverged), len(g.points)))
        name = ", ".join([opt] + axis_values(dict(other), split))
        if b:
            ax.errorbar(b, mean, yerr=[lo, hi], fmt="o-", color=color, capsize=3, label=name)
            healthy.append(np.array(mean) - np.array(lo))
            healthy.append(np.array(mean) + np.array(hi))
    lim = healthy_limits(healthy)
    if lim:
        ax.set_ylim(*lim)
    ax.set_xscale("log", base=2)
    for B, color, n, total in diverged:
        mark_diverged(ax, [B], color, "diverged" if n == total else f"{n}/{total} diverged")
    ax.set_xlabel("global batch size (samples)")
    ax.set_ylabel(RESULT_LABEL)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    spread = any(len(g.points) > 1 for g in groups)
    ax.set_title(title + (f"\nmean over seeds, bars: {SPREAD_LABEL}" if spread else ""), fontsize=10)
    save(fig, out_dir, "scaling", written)


def schedules(groups, keys, title, out_dir, written, series="train/learning_rate", what="learning rate",
              name="lr_schedule"):
    """One panel per optimizer, each with its own axis: optimizers' rates differ by orders of
    magnitude (LAMB 0.04-0.16 beside AdamW 0.002-0.008 in the default sweep), and on one axis
    the smaller ones lie flat along zero. The weight decay of runs that schedule it
    (train/weight_decay) and the embedding's own learning rate (train/decoupled_learning_rate)
    are drawn the same way."""
    opt_groups = by_optimizer(groups)
    fig, axes = plt.subplots(1, len(opt_groups), figsize=(5 * len(opt_groups), 4), squeeze=False)
    for ax, (opt, gs) in zip(axes[0], opt_groups.items()):
        cmap = plt.get_cmap("viridis", max(2, len(gs)))
        for i, g in enumerate(gs):
            p = g.points[0]
            x, y = p.series("train/consumed_samples"), p.series(series)
            n = min(len(x), len(y))
            if n == 0:
                continue
            # a row's rate is its step's, over the samples the step consumed: drawn from where
            # the step started, so every batch size's steps lie on the one schedule in samples
            # (at its row's consumed samples, a batch-128 warmup would end 128 samples late)
            batch = p.series("train/global_batch_size")
            batch = batch[:n] if len(batch) >= n else np.full(n, float(p.batch))
            starts = x[:n] - batch
            ax.step(np.append(starts, x[n - 1]), np.append(y[:n], y[n - 1]), where="post", color=cmap(i),
                    lw=1.2, label=label(g, keys))
        ax.set_title(opt)
        ax.set_xlabel("consumed samples")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[0][0].set_ylabel(what)
    fig.suptitle(title)
    save(fig, out_dir, name, written)


def short_name(name):
    name = name.replace("decoder.layers.", "L").replace("encoder.layers.", "enc L").replace("layers.", "L")
    name = name.replace("self_attention.", "attn.").replace("inter_attention.", "xattn.").replace("embedding.", "emb.")
    return name.replace(".weight", ".w").replace(".bias", ".b")


def aggregate_rows(names, ratios, max_rows=MAX_HEATMAP_ROWS):
    """At most max_rows rows: tensors as they are, else weights and biases of a module
    together, else whole layers (geometric means of the trust ratios)."""
    def group_by(key):
        groups = {}
        for i, n in enumerate(names):
            groups.setdefault(key(n), []).append(i)
        return groups
    levels = [lambda n: n, lambda n: re.sub(r"\.(weight|bias)$", "", n),
              lambda n: (re.match(r"^(.*?layers\.\d+)\.", n) or re.match(r"^([^.]+)", n)).group(1)]
    for key in levels:
        groups = group_by(key)
        if len(groups) <= max_rows:
            break
    if len(groups) > max_rows:  # still too many layers: bands of consecutive rows
        keys = list(groups)
        step = math.ceil(len(keys) / max_rows)
        merged = {}
        for i in range(0, len(keys), step):
            merged[f"{keys[i]} .. {keys[min(i + step, len(keys)) - 1]}"] = sum((groups[k] for k in keys[i:i + step]), [])
        groups = merged
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log10(ratios)
    rows = [np.nanmean(logs[:, idx], axis=1) for idx in groups.values()]
    return [short_name(k) for k in groups], np.stack(rows) if rows else np.zeros((0, logs.shape[0]))


def trust_ratios(groups, title, out_dir, written, max_panels=6):
    """One panel per optimizer and batch size extreme (smallest, largest) that logged them."""
    chosen = []
    for opt, gs in by_optimizer(groups).items():
        gs = [g for g in gs if any(len(p.series("optimizer/trust_ratio")) for p in g.points)]
        for g in ([gs[0], gs[-1]] if len(gs) > 1 else gs):
            if g not in chosen:
                chosen.append(g)
    chosen = chosen[:max_panels]
    if not chosen:
        return
    panels = []
    for g in chosen:
        p = next(p for p in g.points if len(p.series("optimizer/trust_ratio")))
        r = np.asarray(p.metrics["optimizer/trust_ratio"], dtype=float)  # (steps, tensors)
        names = p.metrics.get("optimizer/tensor_names", [str(i) for i in range(r.shape[1])])
        rows, img = aggregate_rows(list(names), r)
        panels.append((p, rows, img))
    # one color scale for every panel, so a color reads the same trust ratio in each
    finite = np.concatenate([img[np.isfinite(img)] for _, _, img in panels])
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (None, None)
    height = sum(1.2 + 0.16 * len(rows) for _, rows, _ in panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, max(3.0, height)), squeeze=False,
                             gridspec_kw={"height_ratios": [max(1, len(rows)) for _, rows, _ in panels]})
    for ax, (p, rows, img) in zip(axes[:, 0], panels):
        it = p.series("optimizer/iteration")
        m = ax.imshow(img, aspect="auto", interpolation="nearest", cmap="magma", vmin=vmin, vmax=vmax,
                      extent=[it[0] if len(it) else 0, it[-1] if len(it) else 1, len(rows) - 0.5, -0.5])
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(rows, fontsize=7)
        ax.set_title(f"{p.id} ({p.optimizer}, B={p.batch})", fontsize=9)
        fig.colorbar(m, ax=ax, label="log10 trust ratio", pad=0.01)
    axes[-1, 0].set_xlabel("iteration")
    fig.suptitle(title)
    save(fig, out_dir, "trust_ratio", written)


def noise_scale(groups, keys, title, out_dir, written):
    """B_simple by consumed samples (where runs of every batch size share an axis, as in the
    loss curves; by iteration a batch-8 run stretched 8x as far as one of batch 64), a panel
    per optimizer, one shared log axis."""
    curves = [(g, g.curve("noise_scale/iteration", "noise_scale/b_simple")) for g in groups]
    curves = [(g, c) for g, c in curves if c is not None]
    if not curves:
        return
    by_opt = {}
    for g, c in curves:
        by_opt.setdefault(g.optimizer, []).append((g, c))
    fig, axes = plt.subplots(1, len(by_opt), figsize=(5.5 * len(by_opt), 4), sharey=True, squeeze=False)
    undefined = False
    for ax, (opt, og) in zip(axes[0], by_opt.items()):
        og.sort(key=lambda gc: (gc[0].batch, gc[0].points[0].id))
        cmap = plt.get_cmap("viridis", max(2, len(og)))
        for i, (g, (it, mean, lo, hi)) in enumerate(og):
            x = np.asarray(it, dtype=float) * g.batch  # a constant batch: samples after each iteration
            # B_simple <= 0 (the |G|^2 estimate <= 0, noise drowning the signal) has no place on a
            # log axis: a gap, said in the title, where matplotlib drew a plunge to the bottom
            bad = ~(np.isfinite(mean) & (mean > 0))
            undefined = undefined or bool(bad.any())
            ax.plot(x, np.where(bad, np.nan, mean), color=cmap(i), lw=1.2, label=label(g, keys))
            if len(g.points) > 1:
                ok = np.isfinite(lo) & (lo > 0) & ~bad
                ax.fill_between(x, np.where(ok, lo, np.nan), np.where(ok, hi, np.nan), color=cmap(i), alpha=0.2, lw=0)
        ax.set_title(opt)
        ax.set_xlabel("consumed samples")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("B_simple = tr(Sigma) / |G|^2")
    fig.suptitle(title + ("; lines: mean over seeds, bands: " + SPREAD_LABEL
                          if any(len(g.points) > 1 for g, _ in curves) else "")
                 + ("\ngaps: B_simple <= 0 (the |G|^2 estimate <= 0: undefined)" if undefined else ""))
    fig.tight_layout()  # room for a two-line title above the panels' own
    save(fig, out_dir, "noise_scale", written)


def plot(*sweep_dirs):
    name, points, keys = load_many(list(sweep_dirs), "sweep plot")
    if not points:
        sys.exit(f"sweep plot: no point of {', '.join(sweep_dirs)} has metrics yet")
    out_dir = os.path.join(sweep_dirs[0], "figures" if len(sweep_dirs) == 1 else "figures-overlay")
    os.makedirs(out_dir, exist_ok=True)
    groups = settings(points, [k for k in keys if k != "seed"])
    keys = legend_keys(groups, keys)  # (the settings stay those of every swept key)
    axes = " x ".join(k for k in keys if k not in ("lr", "min_lr", "train_iters", "seed")) or "one point"
    written = []
    loss_curves(groups, keys, f"{name}: train loss by iteration ({axes})", "train/iteration", "iteration", out_dir,
                "loss_vs_iteration", written)
    loss_curves(groups, keys, f"{name}: train loss by consumed samples ({axes})", "train/consumed_samples",
                "consumed samples", out_dir, "loss_vs_samples", written)
    scaling(groups, keys, f"{name}: {RESULT_LABEL} after the same sample budget", out_dir, written)
    schedules(groups, keys, f"{name}: learning-rate schedules", out_dir, written)
    # what some runs schedule beside the learning rate: the weight decay (--weight-decay-incr-style)
    # and the embedding's own learning rate (--decoupled-lr)
    for series, title, what, figure in (
            ("train/weight_decay", "weight-decay schedules", "weight decay", "wd_schedule"),
            ("train/decoupled_learning_rate", "embedding learning-rate schedules (--decoupled-lr)",
             "embedding learning rate", "decoupled_lr_schedule")):
        if any(len(p.series(series)) for g in groups for p in g.points):
            schedules(groups, keys, f"{name}: {title}", out_dir, written, series, what, figure)
    trust_ratios(groups, f"{name}: per-tensor trust ratios", out_dir, written)
    noise_scale(groups, keys, f"{name}: gradient noise scale", out_dir, written)
    return written


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: plot.py RUNS/<sweep> [RUNS/<other sweep> ...]")
    for path in plot(*sys.argv[1:]):
        print(path)
