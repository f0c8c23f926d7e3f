#!/usr/bin/python3
"""One self-contained HTML page of a sweep (sweep report DIR -> DIR/report.html) that a
researcher can paste from: the optimizer x batch-size table of the result (final
validation loss, mean and min-max over seeds, the best per batch size in bold) with steps
and samples to a target loss, the sample budget, the diverged points, the critical batch
size section (sweep analyze), every figure of `sweep plot` embedded, and the table of
points. The page reads offline and travels alone."""
import base64
import html
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import critical_batch  # noqa: E402
import plot  # noqa: E402
from megabatch_runs import (RESULT_LABEL, SPREAD_LABEL, axis_values, legend_keys, line_keys, load_points,  # noqa: E402
                            series_keys, settings, swept_keys)

FIGURES = [
    ("scaling", f"The result ({RESULT_LABEL}) after the same sample budget, against global batch size"),
    ("critical_batch", "Steps and samples to each target train loss, with the fitted "
                       "(S/S_min - 1)(E/E_min - 1) = 1 frontier per optimizer"),
    ("loss_vs_samples", "Train loss against consumed samples"),
    ("loss_vs_iteration", "Train loss against iterations"),
    ("lr_schedule", "Learning-rate schedules"),
    ("trust_ratio", "Per-layer trust ratios over training (log10)"),
    ("noise_scale", "Gradient noise scale B_simple"),
]


def fmt(v, digits=4):
    if v is None:
        return "-"
    if isinstance(v, float):
        return "-" if not math.isfinite(v) else f"{v:.{digits}g}"
    return html.escape(str(v))


def fmt_loss(v):
    """A loss with three decimals, so a column of them lines up (7.110, not 7.11); a diverged
    one's 1e+08 stays short."""
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.3f}" if abs(v) < 1e5 else f"{v:.3g}"


def fmt_rate(v):
    """A throughput as a whole number with thousands separators (152,340, not 1.523e+05)."""
    return "-" if v is None or not math.isfinite(v) else f"{v:,.0f}"


def result_table(groups, analysis, other_keys, axes):
    """Optimizer (and other swept values) x batch size: result mean (min-max) over the seeds that have
    one, best per batch in bold (of the settings none of whose seeds diverged),
    steps / samples to the first target from the analysis: in the cell of the analysis series
    (critical_batch.series_label over `axes`) and, where a batch size had several settings, of the
    one the analysis took."""
    batches = sorted({g.batch for g in groups})
    rows = {}
    for g in groups:
        other = ", ".join(axis_values(g.config, other_keys))
        rows.setdefault((g.optimizer, other), {})[g.batch] = g
    best = {}  # among the settings none of whose seeds diverged (as the analysis counts them)
    for B in batches:
        vals = [(cells[B].result()[0], key) for key, cells in rows.items() if B in cells and not cells[B].diverged]
        vals = [v for v in vals if math.isfinite(v[0])]
        if vals:
            best[B] = min(vals)[1]
    target = analysis["targets"][0] if analysis.get("targets") else None
    to_target = {}
    for opt, rs in analysis.get("optimizers", {}).items():
        if rs:
            for t in rs[0]["points"]:
                to_target[(opt, t["batch"])] = t
    head = "<tr><th>optimizer</th>" + "".join(f"<th>B = {B}</th>" for B in batches) + "</tr>"
    out = [head]
    for key, cells in sorted(rows.items()):
        opt, other = key
        tds = [f"<td>{html.escape(opt)}{(' (' + html.escape(other) + ')') if other else ''}</td>"]
        for B in batches:
            g = cells.get(B)
            if g is None:
                tds.append("<td>-</td>")
                continue
            m, lo, hi = g.result()
            text = fmt_loss(m)
            if len(g.points) > 1 and math.isfinite(m):
                have = len(g.results())  # the seeds the mean is over
                of = f"{have} of {len(g.points)}" if have < len(g.points) else f"{have}"
                text += f" <small>({fmt_loss(lo)}-{fmt_loss(hi)}, {of} seeds)</small>"
            if g.diverged:
                text += f" <span class='diverged'>{len(g.diverged)}/{len(g.points)} diverged</span>"
            if best.get(B) == key:
                text = f"<b>{text}</b>"
            t = to_target.get((critical_batch.series_label(g, axes), B))
            if t and "chosen" in t and any(g.config.get(k) != v for k, v in t["chosen"].items()):
                t = None  # another setting of this batch size reached the target first
            if t and target is not None:
                took = f", {critical_batch.fmt_seconds(t['seconds'])}" if "seconds" in t else ""
                text += f"<br><small>to {target:.3f}: {t['steps']:.0f} steps, {t['samples']:.0f} samples{took}</small>"
            tds.append(f"<td>{text}</td>")
        out.append("<tr>" + "".join(tds) + "</tr>")
    return "<table>" + "\n".join(out) + "</table>"


def critical_section(analysis):
    parts = [f"<p>Method: {html.escape(analysis['method'])}. Targets are train losses "
             f"({', '.join(f'{t:.3f}' for t in analysis['targets'])}); S(B) is interpolated in each point's "
             "smoothed train-loss curve and counts the optimizer updates made before it reaches the target "
             "(the loss logged at iteration k is measured after k - 1 updates); E = B S."
             + (f" B_simple at the target: {html.escape(analysis['b_simple_smoothing'])}."
                if analysis.get("b_simple_smoothing") else "")
             + (f" Times: {html.escape(analysis['time'])}." if analysis.get("time") else "") + "</p>"]
    left = analysis.get("ramped_left_out")
    if left:
        parts.append(f"<p>Left out of the fit: {len(left)} point(s) that ramp their batch (rampup_batch_size), so "
                     "their steps are not those of one batch size: "
                     + ", ".join(f"<code>{html.escape(i)}</code>" for i in left) + ".</p>")
    rows = ["<tr><th>optimizer</th><th>target train loss</th><th>batch sizes reaching it</th><th>S_min</th>"
            "<th>E_min</th><th>B_crit = E_min / S_min</th><th>68% interval (bootstrap)</th>"
            "<th>B_simple at the target (median, range)</th><th>least time to it</th></tr>"]
    for opt, rs in analysis["optimizers"].items():
        for r in rs:
            f = r.get("fit")
            bs = ", ".join(str(t["batch"]) for t in r["points"]) or "none"
            fast = r.get("fastest")
            fastest = f"B={fast['batch']}: {critical_batch.fmt_seconds(fast['seconds'])}" if fast else "-"
            if f is None:
                rows.append(f"<tr><td>{html.escape(opt)}</td><td>{r['target']:.3f}</td><td>{bs}</td>"
                            f"<td colspan='5'>{html.escape(r['note'])}</td><td>{fastest}</td></tr>")
                continue
            crit = fmt(r.get("b_crit"), 3) if r.get("b_crit") else html.escape(r.get("note", ""))
            ci = r.get("b_crit_interval")
            ns = r.get("b_simple")
            nr = r.get("b_simple_range")
            rows.append(f"<tr><td>{html.escape(opt)}</td><td>{r['target']:.3f}</td><td>{bs}</td>"
                        f"<td>{fmt(f['s_min'], 3)}</td><td>{fmt(f['e_min'], 3)}</td><td>{crit}</td>"
                        f"<td>{'%s - %s' % (fmt(ci[0], 3), fmt(ci[1], 3)) if ci else '-'}</td>"
                        f"<td>{fmt(ns, 3)}{' (%s - %s)' % (fmt(nr[0], 3), fmt(nr[1], 3)) if nr else ''}"
                        f"{html.escape(critical_batch.b_simple_runs(r))}</td><td>{fastest}</td></tr>")
    parts.append("<table>" + "\n".join(rows) + "</table>")
    short = [f"{html.escape(opt)} at loss {r['target']:.3f}: {html.escape(critical_batch.short_settings(r))}"
             for opt, rs in analysis["optimizers"].items() for r in rs if r.get("short")]
    if short:
        parts.append("<p>Not counted (a setting counts at a target only where every one of its finished seeds "
                     "reaches it): " + "; ".join(short) + ".</p>")
    return "\n".join(parts)


def devices_section(points):
    """Where the points ran, as train's first line says: the device, and on a CPU the sgemm kernel
    OpenBLAS chose, which sets the last bits of the results (the same point differs in its third
    decimal between two kernels). More than one is said plainly, with the points of each."""
    by_device = {}
    for p in points:
        for d in p.devices() or ["not recorded (no stdout.log)"]:
            by_device.setdefault(d, []).append(p.id)
    if not by_device:
        return "<p>No points.</p>"
    if len(by_device) == 1:
        (d, ids), = by_device.items()
        return f"<p>All {len(ids)} points ran on <code>{html.escape(d)}</code>.</p>"
    items = "".join(f"<li><code>{html.escape(d)}</code>: {len(ids)} point(s): "
                    + ", ".join(f"<code>{html.escape(i)}</code>" for i in ids) + "</li>"
                    for d, ids in by_device.items())
    return ("<p class='failed'>The points ran on " + str(len(by_device)) + " different devices or sgemm kernels; "
            "results that differ by rounding alone (a kernel sums in another order) are not comparable to the "
            "last digits across them:</p><ul>" + items + "</ul>")


def report(sweep_dir):
    plot.plot(sweep_dir)
    analysis, _ = critical_batch.run([sweep_dir])
    sweep, points = load_points(sweep_dir)
    keys = [k for k in swept_keys(points) if k != "min_lr"]
    groups = settings(points, [k for k in keys if k != "seed"])
    # a row per line of the scaling figure, named as its legend: one of the keys that vary in step
    other_keys = line_keys(groups, legend_keys(groups, keys))
    rows = []
    for p in points:
        cells = [f"<td><code>{html.escape(p.id)}</code></td>"]
        # a key this point leaves unset (a null in the sweep file) runs at train's default
        cells += [f"<td>{fmt(p.config[k]) if k in p.config else '(default)'}</td>" for k in keys]
        state = p.state + (f": {html.escape(p.reason)}" if p.reason and p.state in ("failed", "diverged") else "")
        cells += [f"<td class='{p.state}'>{state}</td>", f"<td>{fmt_loss(p.result())}</td>",
                  f"<td>{fmt_loss(p.final_train_loss())}</td>", f"<td>{p.wall_s / 60:.1f}</td>",
                  f"<td>{fmt_rate(p.tokens_per_second())}</td>",
                  f"<td>{fmt_rate(p.peak_memory_bytes() / 2**20)}</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{html.escape(k)}</th>" for k in ["point"] + keys + [
        "state", RESULT_LABEL, "final train loss", "wall (min)", "tokens/s", "peak memory (MiB)"])
    figs = []
    for name, caption in FIGURES:
        path = os.path.join(sweep_dir, "figures", f"{name}.png")
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = base64.b64encode(f.read()).decode()
            figs.append(f"<figure><img src='data:image/png;base64,{data}' alt='{name}'>"
                        f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    desc = ""
    try:
        with open(sweep["file"]) as f:
            desc = json.load(f).get("description", "")
    except (OSError, ValueError):
        pass
    budgets = sorted({p.sample_budget for p in points})
    diverged = [p for p in points if p.state == "diverged"]
    div_html = ("<ul>" + "".join(f"<li><code>{html.escape(p.id)}</code>: {html.escape(p.reason)}</li>"
                                 for p in diverged) + "</ul>") if diverged else "<p>None.</p>"
    counts = {s: sum(p.state == s for p in points) for s in ("done", "diverged", "failed")}
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(sweep['name'])}: megabatch sweep report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1200px; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th {{ background: #f0f0f0; }} td:first-child {{ text-align: left; }}
.done {{ color: #070; }} .failed, .diverged {{ color: #b00; }} .running, .interrupted, .pending {{ color: #a60; }}
img {{ max-width: 100%; }} figure {{ margin: 2em 0; }} figcaption {{ font-style: italic; }}
</style></head><body>
<h1>Sweep {html.escape(sweep['name'])}</h1>
<p>{html.escape(desc)}</p>
<p>Sweep file: <code>{html.escape(sweep.get('file', ''))}</code>; {len(points)} points: {counts['done']} done,
{counts['diverged']} diverged, {counts['failed']} failed. Sample budget per point:
{', '.join(str(b) for b in budgets)} samples.</p>
<h2>Result: {RESULT_LABEL}</h2>
<p>The result of a point is its {RESULT_LABEL}: the evaluation after its last iteration on the validation
split (the same held-out samples for every point when the sweep sets eval_samples). Cells give the mean over
the seeds that have one with the {SPREAD_LABEL}; the best optimizer per batch size is in bold, of those none of
whose seeds diverged. Below each: optimizer steps and
samples to the first target train loss of the analysis.</p>
{result_table(groups, analysis, other_keys, series_keys(groups, keys))}
<h2>Critical batch size</h2>
{critical_section(analysis)}
<h2>Diverged points</h2>
{div_html}
<h2>Where the points ran</h2>
{devices_section(points)}
<h2>Figures</h2>
{chr(10).join(figs)}
<h2>Points</h2>
<p>Final train loss is the mean train loss over the last 10% of iterations.</p>
<table><tr>{head}</tr>
{chr(10).join(rows)}
</table>
</body></html>
"""
    out = os.path.join(sweep_dir, "report.html")
    with open(out + ".tmp", "w") as f:
        f.write(page)
    os.replace(out + ".tmp", out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RUNS/<sweep>")
    print(report(sys.argv[1]))
