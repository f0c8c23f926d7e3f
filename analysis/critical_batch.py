#!/usr/bin/python3
"""The critical batch size of a sweep (sweep analyze DIR), after McCandlish et al. 2018,
"An Empirical Model of Large-Batch Training".

For a target loss, a point of batch size B needs S(B) optimizer steps and E(B) = B S(B)
samples to reach it. The paper's model says both trade off along a hyperbola,

    (S / S_min - 1) (E / E_min - 1) = 1,   equivalently   S(B) = S_min + E_min / B,

where S_min is the fewest steps (infinite batch) and E_min the fewest samples (batch -> 0);
B_crit = E_min / S_min is the batch size at which training costs twice the minimum of
both. S(B) is linear in 1/B, so the fit is a weighted linear least-squares of S against
(1, 1/B) with relative residuals (weights 1/S). Its uncertainty comes from a bootstrap:
batch sizes resampled with replacement, and within each batch size its seeds.

Steps to a target are read from the logged training loss (every iteration is in
metrics.h5), smoothed by a centred moving average over as many samples as the largest batch of the
sweep (the same for every batch size, so each curve is about as noisy as the largest
batch's; centred, so a smooth curve is not delayed), and interpolated
linearly between the two iterations around the first crossing. S counts the updates made
before that point: the loss logged at iteration k was measured on the weights of the updates
of the iterations before it, k - 1 where none was skipped (an fp16 overflow, train/skipped 1,
or an iteration of --iterations-to-skip, which logs no row, updates nothing). A run that starts at or below a target has no measured S for it and is left
out, and said. Targets default to three losses every non-diverged point reaches from
above; `--targets` sets them.

B_crit is set against the gradient noise scale B_simple = tr(Sigma) / |G|^2 that the runs
logged (--log-noise-scale), read at the iteration where each point reached the target.

A series is an optimizer with the values of the sweep's other axes (model width, tensor
parallelism, ...: megabatch_runs.series_keys), each fitted on its own. Where a batch size has
several settings within a series (a learning-rate grid at each batch size), S(B) is that of
the setting reaching the target in the fewest steps, as the paper tunes hyperparameters per
batch size; the table records which one ("chosen"). Only seeds are averaged, and a setting
counts at a target only where every one of its finished seeds reaches it: a seed that
diverged, or finished above the target, takes its setting out there ("short": which, and how
many of its seeds reach it), where the mean over the seeds that got there would make a setting
that fails for some seeds look as good as one that never does.

Several sweeps (sweep analyze DIR DIR ...) are analyzed side by side: the sweep is a series
axis, as in overlaid plots (lamb in lamb_bsz and lamb in lamb_wsd are two series, each fitted
on its own points), written to the first DIR's figures-overlay/.
"""
import json
import math
import os
import sys
import zlib
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megabatch_runs import axis_values, series_keys, swept_keys  # noqa: E402

BOOTSTRAP = 1000
MIN_BATCH_SIZES = 3  # two parameters and at least one degree of freedom


def smoothed(samples, loss, window_samples):
    """Centred moving average of `loss` over about `window_samples` samples: w steps, as
    many on either side of each one (an even w takes the two outermost steps at half weight,
    so the average stays centred on the step instead of half a step before it, which would
    delay the crossing of a falling curve by half a step). The ends are padded with the
    first and last values."""
    loss = np.asarray(loss, dtype=float)
    if len(loss) < 3:
        return loss
    per_step = (samples[-1] - samples[0]) / max(1, len(samples) - 1) if len(samples) > 1 else 1.0
    w = int(round(window_samples / max(per_step, 1e-12)))
    w = max(1, min(w, len(loss)))
    if w == 1:
        return loss
    half = w // 2
    kernel = np.ones(2 * half + 1)
    if w % 2 == 0:
        kernel[0] = kernel[-1] = 0.5
    kernel /= kernel.sum()
    padded = np.concatenate([np.full(half, loss[0]), loss, np.full(half, loss[-1])])
    return np.convolve(padded, kernel, mode="valid")


def iteration_reaching(iterations, values, target):
    """Fractional iteration where `values` first reaches `target` (linear interpolation), or
    None; the first iteration where `values` starts at or below it."""
    below = np.nonzero(values <= target)[0]
    if len(below) == 0:
        return None
    i = int(below[0])
    if i == 0:
        return float(iterations[0])
    x0, x1, y0, y1 = iterations[i - 1], iterations[i], values[i - 1], values[i]
    return float(x0 + (x1 - x0) * (y0 - target) / (y0 - y1)) if y0 != y1 else float(x1)


def updates_before(p, iteration):
    """Optimizer updates point `p` made before the train loss logged at `iteration` (fractional
    between two logged ones) was measured. The trainer, as Megatron's, logs iteration k's loss
    from its forward pass, on the weights the iterations before it updated (iteration 1's is the
    initial model's); its own update follows, unless it is skipped: an fp16 overflow (a row
    with train/skipped 1) or one of --iterations-to-skip (no row) updates nothing. So a run
    whose loss reaches the target at iteration k took k - 1 steps, less those skipped."""
    it = p.series("train/iteration")
    skipped = p.series("train/skipped")
    made = 1.0 - (skipped != 0) if len(skipped) == len(it) else np.ones(len(it))
    before = (it[0] - 1.0) + np.concatenate([[0.0], np.cumsum(made)[:-1]])  # at each logged iteration
    return float(np.interp(iteration, it, before))


def seconds_before(p, iteration):
    """Training time in seconds before the loss logged at `iteration` was measured: the run's
    own step times (train/iteration_time_ms: the steps only, no evaluation or checkpoint) of
    iterations 1 .. iteration - 1 (a skipped one's too: it took its time), a fraction of the
    next in proportion. None where the run logged no step times."""
    it, ms = p.series("train/iteration"), p.series("train/iteration_time_ms")
    n = min(len(it), len(ms))
    if n == 0 or not np.all(np.isfinite(ms[:n])):
        return None
    after = np.concatenate([[it[0] - 1.0], it[:n]])  # iterations done, and the time they took
    took = np.concatenate([[0.0], np.cumsum(ms[:n])]) / 1000.0
    return float(np.interp(iteration - 1.0, after, took))


def fit_hyperbola(batches, steps):
    """S(B) = S_min + E_min / B by least squares with relative residuals. Returns
    (S_min, E_min), or None when fewer than MIN_BATCH_SIZES distinct batch sizes."""
    b = np.asarray(batches, dtype=float)
    s = np.asarray(steps, dtype=float)
    if len(set(b.tolist())) < MIN_BATCH_SIZES:
        return None
    w = 1.0 / s
    a = np.stack([np.ones_like(b), 1.0 / b], axis=1) * w[:, None]
    (s_min, e_min), *_ = np.linalg.lstsq(a, s * w, rcond=None)
    return float(s_min), float(e_min)


def describe_fit(s_min, e_min, batches):
    """B_crit and how to read it: a bound where the fit leaves the model's domain."""
    lo, hi = min(batches), max(batches)
    if e_min <= 0:
        return {"b_crit": None, "bound": f"below {lo}", "note": f"steps do not fall with the batch size: B_crit < {lo}"}
    if s_min <= 0:
        return {"b_crit": None, "bound": f"above {hi}",
                "note": f"steps fall as 1/B over the whole range (perfect scaling): B_crit > {hi}"}
    return {"b_crit": e_min / s_min, "bound": None, "note": ""}


def bootstrap(by_batch, rng, n=BOOTSTRAP):
    """B_crit over resamples: batch sizes with replacement, then each one's seeds."""
    keys = sorted(by_batch)
    out = []
    for _ in range(n):
        bs, ss = [], []
        for k in rng.choice(keys, size=len(keys), replace=True):
            seeds = by_batch[k]
            s = float(np.mean(rng.choice(seeds, size=len(seeds), replace=True)))
            bs.append(k)
            ss.append(s)
        fit = fit_hyperbola(bs, ss)
        if fit and fit[0] > 0 and fit[1] > 0:
            out.append(fit[1] / fit[0])
    return np.asarray(out)


def default_targets(curves, count=3):
    """`count` losses every curve reaches: from the worst curve's best upwards, spaced over
    a quarter of the way to the highest loss any smoothed curve starts from."""
    if not curves:
        return []
    reach = max(float(np.min(c["smooth"])) for c in curves)
    start = min(float(c["smooth"][0]) for c in curves)
    if not start > reach:
        return [round(reach, 3)]
    span = 0.25 * (start - reach)
    return [round(reach + 1e-3 + span * k / max(1, count - 1), 3) for k in range(count)]


def point_curves(points, window_samples=None):
    """Smoothed training-loss curves of the finished, non-diverged points."""
    curves = []
    for p in points:
        if p.state != "done":
            continue
        it, loss = p.series("train/iteration"), p.series("train/lm_loss")
        samples = p.series("train/consumed_samples")
        n = min(len(it), len(loss), len(samples))
        if n < 2:
            continue
        it, loss, samples = it[:n], loss[:n], samples[:n]
        w = window_samples if window_samples else max(q.batch for q in points)
        curves.append({"point": p, "iteration": it, "samples": samples, "smooth": smoothed(samples, loss, w)})
    return curves


def noise_scale_centred(p, iteration, window_samples):
    """B_simple from the run's per-step estimates (train/noise_grad_sq_norm and
    train/noise_trace_cov, one per iteration): the sum of tr(Sigma) over the sum of |G|^2 of
    the steps within window_samples / 2 samples (at least the nearest step) of where the run
    is at `iteration`. Centred, unlike the moving average the trainer logs, so it carries
    neither early training nor a distant loss spike into the value at a loss. None where
    the run has no per-step estimates, or their |G|^2 sums to <= 0 (noise drowning the
    signal)."""
    it, g2, tr = p.series("train/iteration"), p.series("train/noise_grad_sq_norm"), p.series("train/noise_trace_cov")
    samples = p.series("train/consumed_samples")
    n = min(len(it), len(g2), len(tr), len(samples))
    if n == 0:
        return None
    it, g2, tr, samples = it[:n], g2[:n], tr[:n], samples[:n]
    at = float(np.interp(iteration, it, samples))
    half = 0.5 * max(window_samples, p.batch)
    near = (np.abs(samples - at) <= half) & np.isfinite(g2) & np.isfinite(tr)
    if not near.any() or g2[near].sum() <= 0:
        return None
    return float(tr[near].sum() / g2[near].sum())


def has_step_estimates(p):
    """Whether the run logged each step's noise-scale estimates (runs since 2026-11-25)."""
    return len(p.series("train/noise_grad_sq_norm")) > 0


def noise_scale_at(p, iteration):
    """B_simple at `iteration`, interpolated between the logged values around it; None where
    either is undefined (<= 0: the |G|^2 estimate <= 0) or it lies outside the logged span.
    (Interpolating over the defined values only carried a value logged long before across
    an undefined stretch: after a heavy-tailed micro-batch drove an AdamW run's estimate
    below zero for the rest of the run, its last positive value stood for every later loss.)"""
    it, b = p.series("noise_scale/iteration"), p.series("noise_scale/b_simple")
    n = min(len(it), len(b))
    if n == 0 or iteration < it[0] or iteration > it[n - 1]:
        return None
    it, b = it[:n], b[:n]
    i = int(np.searchsorted(it, iteration))  # it[i - 1] < iteration <= it[i]
    around = b[max(i - 1, 0):i + 1] if it[i] != iteration else b[i:i + 1]
    if not np.all(np.isfinite(around) & (around > 0)):
        return None
    return float(np.interp(iteration, it, b))


def noise_smoothing(points, window_samples):
    """How B_simple at a target is formed ("per-step estimates summed over the 128 samples
    centred on ..."; for runs without them, the logged average, from their configurations:
    "as logged, a moving average over 128 samples"; several kinds joined by "; "), or None
    where no run logged it."""
    kinds = []
    for p in points:
        c = p.config
        if not c.get("log_noise_scale"):
            continue
        if has_step_estimates(p):
            kind = (f"the per-step estimates summed over the {window_samples:g} samples centred on where the run "
                    "reaches the target (sum of tr(Sigma) / sum of |G|^2)")
        elif c.get("noise_scale_window"):
            kind = f"as logged, a moving average over {c['noise_scale_window']} samples"
        else:
            kind = f"as logged, a moving average decaying by {c.get('noise_scale_ema', 0.99)} a step"
        if kind not in kinds:
            kinds.append(kind)
    return "; ".join(kinds) or None


def series_label(point, axes):
    """The optimizer, and the other swept axes' values ("lamb, tensor_model_parallel_size=2")."""
    return ", ".join([point.optimizer] + axis_values(point.config, axes))


def tuned_keys(curves, keys, batch):
    """The keys whose values differ between the settings of one batch size (the tuned ones)."""
    at_b = [c["point"].config for c in curves if c["point"].batch == batch]
    return [k for k in keys if len({json.dumps(cfg.get(k)) for cfg in at_b}) > 1]


def analyze(points, targets=None, seed=0, keys=None):
    """Per optimizer and target: S(B), E(B), the fit and B_crit with a bootstrap interval,
    and B_simple at the target. `keys`: the configuration keys that tell settings apart
    (default: those that differ between the points; several sweeps: load_many's). Returns a
    JSON-ready dict."""
    # A ramped batch (rampup_batch_size) changes B as the run goes: its steps to a target are not
    # those of one batch size, so the fit leaves it out, and says so.
    ramped = [p for p in points if p.config.get("rampup_batch_size")]
    points = [p for p in points if not p.config.get("rampup_batch_size")]
    curves = point_curves(points)
    window = max((p.batch for p in points), default=1)  # as point_curves smooths the losses
    if targets is None:
        targets = default_targets(curves)
    result = {"targets": targets, "method": "S(B) = S_min + E_min/B, weighted least squares; "
              "bootstrap over batch sizes and seeds (16th-84th percentiles); where a batch size has "
              "several settings (a learning-rate grid), the one reaching the target in the fewest steps",
              "time": "t: the training time to the target, the runs' own step times (train/iteration_time_ms; "
              "no evaluation or checkpoints) summed over the iterations before it (skipped ones too), as "
              "measured: points that ran side by side shared the machine",
              "b_simple_smoothing": noise_smoothing(points, window), "optimizers": {}}
    if ramped:
        result["ramped_left_out"] = sorted(p.id for p in ramped)
    keys = [k for k in (swept_keys(points) if keys is None else keys) if k != "seed"]
    axes = series_keys(points, keys)  # other swept axes: a series of their own

    def setting(p):  # a batch size and the other values of a point's setting (all but its seed)
        return (p.batch, json.dumps([p.config.get(k) for k in keys]))
    # (series, setting) -> its seeds that finished: done or diverged (not failed, not running)
    finished = Counter((series_label(p, axes), setting(p)) for p in points if p.state in ("done", "diverged"))
    by_series = {}
    for c in curves:
        by_series.setdefault(series_label(c["point"], axes), []).append(c)
    for opt, cs in sorted(by_series.items()):
        # each series draws on its own, seeded by the series within its sweep, so its interval
        # does not depend on what else is analyzed beside it (another optimizer, another sweep)
        within = series_label(cs[0]["point"], [a for a in axes if a != "sweep"])
        rng = np.random.default_rng([seed, zlib.crc32(within.encode())])
        rows = []
        for target in targets:
            per_setting, table, b_simple = {}, [], {}  # (B, setting) -> steps of its seeds
            seconds = {}  # (B, setting) -> training time to the target of its seeds (None: not logged)
            starts_below = 0  # runs at or below the target from their first logged loss on
            reached = Counter()  # (B, setting) -> its seeds that reach the target (measured or from the start)
            for c in cs:
                at = iteration_reaching(c["iteration"], c["smooth"], target)
                if at is None:
                    continue
                key = setting(c["point"])
                reached[key] += 1
                if at <= c["iteration"][0]:  # how few steps it took is not measured
                    starts_below += 1
                    continue
                per_setting.setdefault(key, []).append(updates_before(c["point"], at))
                seconds.setdefault(key, []).append(seconds_before(c["point"], at))
                pt = c["point"]  # B_simple where the run is as it reaches the target: at the same iteration
                ns = noise_scale_centred(pt, at, window) if has_step_estimates(pt) else noise_scale_at(pt, at)
                if ns is not None:
                    b_simple.setdefault(key, []).append(ns)
            # a setting some of whose finished seeds do not reach the target is out at it
            short = sorted(k for k in per_setting if reached[k] < finished[(opt, k)])
            per_batch, chosen = {}, {}  # each batch size's fastest setting (tuned hyperparameters)
            for (B, st), steps in sorted(per_setting.items(), key=lambda kv: np.mean(kv[1])):
                if B not in per_batch and (B, st) not in short:
                    per_batch[B], chosen[B] = steps, st
            b_simple = [v for B, st in chosen.items() for v in b_simple.get((B, st), [])]

            def tuned(B, st):  # where B has several settings: the values that tell st from the others
                if sum(b == B for b, _ in per_setting) < 2:
                    return None
                told = tuned_keys(cs, keys, B)
                return {k: v for k, v in zip(keys, json.loads(st)) if k in told}
            for B in sorted(per_batch):
                S = float(np.mean(per_batch[B]))
                row = {"batch": B, "steps": S, "samples": S * B, "seeds": len(per_batch[B])}
                took = seconds[(B, chosen[B])]
                if all(t is not None for t in took):
                    row["seconds"] = float(np.mean(took))
                which = tuned(B, chosen[B])  # which of the settings at B it is
                if which is not None:
                    row["chosen"] = which
                table.append(row)
            out = []
            for B, st in short:
                out.append({"batch": B, "reached": reached[(B, st)], "of": finished[(opt, (B, st))]})
                which = tuned(B, st)
                if which is not None:
                    out[-1]["setting"] = which
            timed = [t for t in table if "seconds" in t]
            fastest = min(timed, key=lambda t: t["seconds"]) if len(timed) == len(table) and timed else None
            row = {"target": target, "points": table, "b_simple": float(np.median(b_simple)) if b_simple else None,
                   # the batch size that reached the target in the least training time
                   "fastest": {"batch": fastest["batch"], "seconds": fastest["seconds"]} if fastest else None,
                   "b_simple_range": [float(min(b_simple)), float(max(b_simple))] if b_simple else None,
                   # the runs whose B_simple is defined where they reach the target, of all taken
                   "b_simple_runs": [len(b_simple), sum(len(v) for v in per_batch.values())]}
            if out:
                row["short"] = out
            # batch sizes of this series none of whose finished seeds gets to the target at all
            unreached = sorted({B for (o, (B, _)) in finished if o == opt} - {B for B, _ in reached})
            if unreached:
                row["unreached"] = unreached
            fit = fit_hyperbola([t["batch"] for t in table], [t["steps"] for t in table]) if table else None
            if fit is None:
                row["fit"] = None
                row["note"] = (f"too few points for a fit: {len(table)} batch size(s) reach loss {target} from above "
                               f"(needs {MIN_BATCH_SIZES})")
            else:
                s_min, e_min = fit
                row["fit"] = {"s_min": s_min, "e_min": e_min}
                row.update(describe_fit(s_min, e_min, [t["batch"] for t in table]))
                boot = bootstrap({B: v for B, v in per_batch.items()}, rng)
                if len(boot) >= 10:
                    lo, mid, hi = np.percentile(boot, [16, 50, 84])
                    row["b_crit_interval"] = [float(lo), float(hi)]
                    row["b_crit_bootstrap_median"] = float(mid)
                    row["bootstrap_valid"] = int(len(boot))
            if starts_below:
                row["starts_below"] = starts_below
                row["note"] = "; ".join(x for x in (row.get("note"), (
                    f"{starts_below} run(s) start at or below loss {target} (their first logged train loss, "
                    "smoothed), so their steps to it are not measured and they are left out: choose a lower "
                    "target")) if x)
            rows.append(row)
        result["optimizers"][opt] = rows
    return result


def short_settings(row):
    """The settings a target's row leaves out because some of their seeds do not reach it:
    "B=64 lr=0.08 (2 of 3 seeds reach it: a seed that diverged or finished above it takes the
    setting out)"."""
    said = []
    for o in row.get("short", []):
        values = " ".join(f"{k}={v}" for k, v in o.get("setting", {}).items())
        said.append(f"B={o['batch']}{' ' + values if values else ''} ({o['reached']} of {o['of']} seeds reach it)")
    return "; ".join(said) + (": a seed that diverged, or finished above the target, takes its setting out"
                              if said else "")


def b_simple_runs(row):
    """" (2 of 5 runs)" where B_simple is undefined for some runs at the target, else ""."""
    have, of = row.get("b_simple_runs", [0, 0])
    return f" ({have} of {of} runs)" if have < of else ""


def fmt(v, digits=3):
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}g}"


def fmt_seconds(s):
    """12.3s, 4m05s, 2h03m"""
    if s < 60:
        return f"{s:.3g}s"
    m = int(round(s))
    return f"{m // 60}m{m % 60:02d}s" if m < 3600 else f"{m // 3600}h{m % 3600 // 60:02d}m"


def text_table(res):
    lines = [f"critical batch size (McCandlish et al. 2018): {res['method']}"]
    if res.get("time"):
        lines.append(res["time"])
    if res.get("b_simple_smoothing"):
        lines.append(f"B_simple at the target: {res['b_simple_smoothing']}")
    if res.get("ramped_left_out"):
        left = res["ramped_left_out"]
        lines.append(f"left out: {len(left)} point(s) ramp their batch (rampup_batch_size), so their steps are not "
                     f"those of one batch size: {', '.join(left)}")
    for opt, rows in res["optimizers"].items():
        for r in rows:
            head = f"{opt:8s} loss {r['target']:.3f}: "
            f = r.get("fit")
            if f is None:
                lines.append(head + r["note"])
            else:
                crit = fmt(r.get("b_crit")) if r.get("b_crit") else r.get("bound", "-")
                ci = r.get("b_crit_interval")
                ci_s = f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else ""
                lines.append(head + f"S_min {fmt(f['s_min'])}, E_min {fmt(f['e_min'])}, B_crit {crit}{ci_s}, "
                                    f"B_simple {fmt(r['b_simple'])}{b_simple_runs(r)}" +
                                    (f" ({r['note']})" if r.get("note") else ""))
            if r.get("short"):
                lines.append(f"    not counted: {short_settings(r)}")
            if r.get("unreached"):
                lines.append("    not reached: " + ", ".join(f"B={B}" for B in r["unreached"]) +
                             f" (no finished seed gets to loss {r['target']:.3f})")
            if not r["points"]:
                continue
            lines.append("    " + "  ".join(f"B={t['batch']}: S={t['steps']:.1f} E={t['samples']:.0f}" +
                                            (f" t={fmt_seconds(t['seconds'])}" if "seconds" in t else "")
                                            for t in r["points"]))
            if r.get("fastest"):
                lines.append(f"    least time to it: B={r['fastest']['batch']} "
                             f"({fmt_seconds(r['fastest']['seconds'])})")
    return "\n".join(lines)


def frontier_figure(res, out_dir, name, written):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    opts = list(res["optimizers"].items())
    if not opts:
        return
    fig, axes = plt.subplots(1, len(opts), figsize=(5.5 * len(opts), 4.2), squeeze=False)
    for ax, (opt, rows) in zip(axes[0], opts):
        all_s, all_e = [], []
        for k, r in enumerate(rows):
            color = plt.get_cmap("viridis", max(2, len(rows)))(k)
            if not r["points"]:
                continue
            S = [t["steps"] for t in r["points"]]
            E = [t["samples"] for t in r["points"]]
            all_s += S
            all_e += E
            ax.plot(S, E, "o", color=color, label=f"loss {r['target']:.3f}")
            for t in r["points"]:
                ax.annotate(f"B={t['batch']}", (t["steps"], t["samples"]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
            f = r.get("fit")
            if f and f["s_min"] > 0 and f["e_min"] > 0:
                x = np.logspace(-2, 2, 200)  # S / S_min - 1
                ax.plot(f["s_min"] * (1 + x), f["e_min"] * (1 + 1 / x), "-", color=color, lw=1,
                        label=f"fit: B_crit {r['b_crit']:.3g}")
        if all_s:
            ax.set_xlim(min(all_s) / 1.5, max(all_s) * 1.5)
            ax.set_ylim(min(all_e) / 1.5, max(all_e) * 1.5)
        else:  # said, not an empty frame (and no legend of nothing)
            ax.text(0.5, 0.5, "no run reaches these targets from above", transform=ax.transAxes, ha="center",
                    va="center", fontsize=9)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("optimizer steps S to the target loss")
        ax.set_ylabel("training samples E = B S")
        ax.set_title(f"{opt}: steps-samples frontier")
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"{name}: (S/S_min - 1)(E/E_min - 1) = 1 fitted per target train loss")
    for ext in ("png", "svg"):
        path = os.path.join(out_dir, f"critical_batch.{ext}")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        written.append(path)
    plt.close(fig)


def run(sweep_dirs, targets=None):
    """Analyzes one sweep (DIR/analysis.json, DIR/figures/) or several side by side (the first
    DIR's figures-overlay/analysis.json and figures)."""
    from megabatch_runs import load_many
    name, points, keys = load_many(sweep_dirs, "sweep analyze")
    if not points:  # nothing to analyze: say so, and write nothing
        sys.exit(f"sweep analyze: no point of {', '.join(sweep_dirs)} has metrics yet; run the sweep first")
    res = analyze(points, targets, keys=keys)
    one = len(sweep_dirs) == 1
    out_dir = os.path.join(sweep_dirs[0], "figures" if one else "figures-overlay")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    frontier_figure(res, out_dir, name, written)
    path = os.path.join(sweep_dirs[0] if one else out_dir, "analysis.json")
    with open(path + ".tmp", "w") as f:
        json.dump(res, f, indent=1)
    os.replace(path + ".tmp", path)
    return res, [path] + written


def parse_targets(text):
    """--targets L1,L2,...: one or more finite losses > 0 (Python's float() also takes nan,
    inf and 1e999, which no run reaches). A trailing comma is allowed; an empty entry inside
    the list is not (7,,5 is a typo of 7.5, not the targets 7 and 5)."""
    entries = text.split(",")
    if len(entries) > 1 and not entries[-1].strip():
        entries.pop()
    try:
        values = [float(x) for x in entries]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        sys.exit(f"sweep analyze: --targets: expected comma-separated losses > 0 such as 7.5,8; got '{text}'")
    return values


if __name__ == "__main__":
    args = sys.argv[1:]
    targets = None
    if "--targets" in args:
        i = args.index("--targets")
        if i + 1 >= len(args):
            sys.exit("sweep analyze: --targets needs a value, e.g. --targets 7.5,8")
        targets = parse_targets(args[i + 1])
        del args[i:i + 2]
    if not args:
        sys.exit("usage: critical_batch.py RUNS/<sweep> [RUNS/<other sweep> ...] [--targets L1,L2,...]")
    res, files = run(args, targets)
    print(text_table(res))
    for f in files:
        print(f)
