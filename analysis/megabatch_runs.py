"""Reading a sweep's runs: runs/<name>/sweep.json and each point's metrics.h5.

Metrics files may still be written by a running sweep: `train` opens, appends and closes
them once per log interval, so a read that collides with a write is retried.
"""
import json
import os
import time

import h5py
import numpy as np


def read_sweep(sweep_dir):
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        return json.load(f)


def _open(path, attempts=20):
    for i in range(attempts):
        try:
            return h5py.File(path, "r", locking=False)
        except (OSError, TypeError):
            if i == attempts - 1:
                raise
            time.sleep(0.1)


def read_metrics(path):
    """Every dataset of metrics.h5 as numpy arrays ({"train/lm_loss": array, ...}), the
    optimizer tensor names as a list, and the config attribute; None when the file does not
    exist (yet)."""
    if not os.path.exists(path):
        return None
    for attempt in range(20):
        try:
            out = {}
            with _open(path) as f:
                def visit(name, obj):
                    if isinstance(obj, h5py.Dataset):
                        data = obj[()]
                        if data.dtype.kind in "OS":
                            data = [x.decode() if isinstance(x, bytes) else str(x) for x in data]
                        out[name] = data
                f.visititems(visit)
                cfg = f.attrs.get("config")
                out["config"] = json.loads(cfg.decode() if isinstance(cfg, bytes) else cfg) if cfg is not None else {}
            # series written in one flush have equal lengths; trim a torn read to the shortest
            for group in ("train", "validation", "noise_scale", "optimizer"):
                keys = [k for k in out if k.startswith(group + "/") and k != "optimizer/tensor_names"]
                if keys:
                    n = min(len(out[k]) for k in keys)
                    for k in keys:
                        out[k] = out[k][:n]
            return out
        except (OSError, KeyError, ValueError):
            time.sleep(0.1)
    return None


class Point:
    """One point of a sweep: its id, configuration, state and metrics."""

    def __init__(self, sweep_dir, entry):
        self.id = entry["id"]
        self.config = entry["config"]
        self.state = entry.get("state", "pending")
        self.reason = entry.get("reason", "")
        self.wall_s = entry.get("wall_s", 0.0)
        self.dir = os.path.join(sweep_dir, self.id)
        if os.path.exists(os.path.join(self.dir, "DONE")):
            self.state = "done"
        self.metrics = read_metrics(os.path.join(self.dir, "metrics.h5")) or {}

    def series(self, name):
        return np.asarray(self.metrics.get(name, []), dtype=float)

    @property
    def optimizer(self):
        return self.config.get("optimizer", "adamw")

    @property
    def batch(self):
        return int(self.config.get("global_batch_size", self.config.get("micro_batch_size", 8)))

    def final_train_loss(self):
        """Mean lm loss over the last 10% of iterations (at least one)."""
        loss = self.series("train/lm_loss")
        if len(loss) == 0:
            return float("nan")
        k = max(1, len(loss) // 10)
        return float(np.mean(loss[-k:]))

    def final_valid_loss(self):
        v = self.series("validation/lm_loss")
        return float(v[-1]) if len(v) else float("nan")

    def best_valid_loss(self):
        v = self.series("validation/lm_loss")
        return float(np.min(v)) if len(v) else float("nan")

    def tokens_per_second(self):
        t = self.series("train/tokens_per_second")
        return float(np.median(t)) if len(t) else float("nan")


def load_points(sweep_dir):
    sweep = read_sweep(sweep_dir)
    return sweep, [Point(sweep_dir, p) for p in sweep["points"]]


def swept_keys(points):
    """Configuration keys whose values differ between points (the sweep's axes and derived values)."""
    keys = []
    for p in points:
        for k in p.config:
            if k not in keys and len({json.dumps(q.config.get(k), sort_keys=True) for q in points}) > 1:
                keys.append(k)
    return keys
