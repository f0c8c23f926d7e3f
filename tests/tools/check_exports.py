#!/usr/bin/python3
"""Checks a sweep's exports against its metrics.h5 files read with h5py: the CSV (read
with Python's csv module) and the TensorBoard event files (read by read_tfevents.py) hold
every logged value of every point at its iteration, with the point's swept values; a 2-D
series (logged step x tensor, such as optimizer/trust_ratio) as a series per column named
"<series>/<tensor name>" from the group's tensor_names.

usage: check_exports.py SWEEP_DIR CSV_FILE TB_DIR   (prints "ok: N values, M of them per tensor" or fails)
"""
import csv
import glob
import json
import math
import os
import sys

import h5py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import read_tfevents  # noqa: E402


def series(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if not isinstance(obj, h5py.Dataset) or obj.dtype.kind not in "fiu":
                return
            if obj.ndim == 1:
                out[name] = [float(x) for x in obj[()]]
            elif obj.ndim == 2:
                names = f.get(name.split("/")[0] + "/tensor_names")
                names = [n.decode() if isinstance(n, bytes) else str(n) for n in names[()]] if names is not None else []
                if len(names) != obj.shape[1]:
                    names = [str(c) for c in range(obj.shape[1])]
                for c, tensor in enumerate(names):
                    out[f"{name}/{tensor}"] = [float(x) for x in obj[:, c]]
        f.visititems(visit)
    return out


def main(sweep_dir, csv_file, tb_dir):
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        points = json.load(f)["points"]
    with open(csv_file, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows, "empty CSV"
    for col in ("point", "global_batch_size", "step", "samples", "metric", "value"):
        assert col in rows[0], f"CSV has no column {col}: {list(rows[0])}"
    checked = per_tensor = 0
    for p in points:
        s = series(os.path.join(sweep_dir, p["id"], "metrics.h5"))
        mine = [r for r in rows if r["point"] == p["id"]]
        assert all(r["global_batch_size"] == str(p["config"]["global_batch_size"]) for r in mine), p["id"]
        events = glob.glob(os.path.join(tb_dir, p["id"], "events.out.tfevents.*"))
        assert len(events) == 1, events
        tb = read_tfevents.read(events[0])
        assert tb["file_version"] == "brain.Event:2", tb["file_version"]
        for name, values in s.items():
            group = name.split("/")[0]
            if name == group + "/iteration" or group + "/iteration" not in s:
                continue
            steps = s[group + "/iteration"]
            csv_rows = [r for r in mine if r["metric"] == name]
            assert len(csv_rows) == len(values), (p["id"], name, len(csv_rows), len(values))
            tb_rows = [x for x in tb["scalars"] if x[0] == name]
            assert len(tb_rows) == len(values), (p["id"], name, len(tb_rows), len(values))
            for r, t, step, v in zip(csv_rows, tb_rows, steps, values):
                assert float(r["step"]) == step and t[1] == int(step), (name, r, t, step)
                assert (math.isnan(v) and r["value"] == "nan") or abs(float(r["value"]) - v) <= 1e-8 * max(1, abs(v)), \
                    (name, r["value"], v)
                assert math.isnan(v) or abs(t[2] - v) <= 1e-6 * max(1, abs(v)), (name, t, v)  # float32 in TensorBoard
                if group == "train":
                    assert float(r["samples"]) == s["train/consumed_samples"][steps.index(step)], r
                checked += 1
                per_tensor += name.count("/") > 1
    assert checked > 0
    print(f"ok: {checked} values, {per_tensor} of them per tensor")


if __name__ == "__main__":
    main(*sys.argv[1:])
