#!/usr/bin/python3
"""One self-contained HTML page of a sweep (sweep report DIR -> DIR/report.html): the table
of points (the values that differ between them, status, final losses, wall time, tokens/s)
and every figure of `sweep plot`, embedded, so the page reads offline and travels alone."""
import base64
import html
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megabatch_runs import load_points, swept_keys  # noqa: E402
import plot  # noqa: E402

FIGURES = [
    ("scaling", "Loss at the end of the same sample budget, against global batch size"),
    ("loss_vs_samples", "Training loss against consumed samples"),
    ("loss_vs_iteration", "Training loss against iterations"),
    ("lr_schedule", "Learning-rate schedules"),
    ("trust_ratio", "Per-tensor trust ratios over training"),
    ("noise_scale", "Gradient noise scale"),
]


def fmt(v):
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.4g}"
    return html.escape(str(v))


def report(sweep_dir):
    plot.plot(sweep_dir)
    sweep, points = load_points(sweep_dir)
    keys = [k for k in swept_keys(points) if k != "min_lr"]
    rows = []
    for p in points:
        cells = [f"<td><code>{html.escape(p.id)}</code></td>"]
        cells += [f"<td>{fmt(p.config.get(k, ''))}</td>" for k in keys]
        state = p.state + (f": {html.escape(p.reason)}" if p.reason and p.state == "failed" else "")
        cells += [f"<td class='{p.state}'>{state}</td>", f"<td>{fmt(p.final_train_loss())}</td>",
                  f"<td>{fmt(p.final_valid_loss())}</td>", f"<td>{fmt(p.best_valid_loss())}</td>",
                  f"<td>{p.wall_s / 60:.1f}</td>", f"<td>{fmt(p.tokens_per_second())}</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{html.escape(k)}</th>" for k in ["point"] + keys + [
        "state", "final train loss", "final valid loss", "best valid loss", "wall (min)", "tokens/s"])
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
        import json
        with open(sweep["file"]) as f:
            desc = json.load(f).get("description", "")
    except (OSError, ValueError):
        pass
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(sweep['name'])}: megabatch sweep report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1200px; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
th {{ background: #f0f0f0; }} td:first-child {{ text-align: left; }}
.done {{ color: #070; }} .failed {{ color: #b00; }} .running, .interrupted, .pending {{ color: #a60; }}
img {{ max-width: 100%; }} figure {{ margin: 2em 0; }} figcaption {{ font-style: italic; }}
</style></head><body>
<h1>Sweep {html.escape(sweep['name'])}</h1>
<p>{html.escape(desc)}</p>
<p>Sweep file: <code>{html.escape(sweep.get('file', ''))}</code>; {len(points)} points.
Final train loss is the mean over the last 10% of iterations.</p>
<table><tr>{head}</tr>
{chr(10).join(rows)}
</table>
{chr(10).join(figs)}
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
