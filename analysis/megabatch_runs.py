"""Reading a sweep's runs: runs/<name>/sweep.json and each point's metrics.h5.

The result of a point (RESULT_LABEL) is one number everywhere -- status, plots, report:
its final validation loss, the evaluation after the last iteration on the validation
split (with eval_samples, the same held-out samples for every point). A diverged or
unfinished point has no result (NaN). Training loss is only ever labelled as such.

Points that differ only by their seed are one setting: `settings()` groups them, and
`Setting.result()` gives the mean with the min-max spread over seeds.

Metrics files may be read while a sweep runs: `train` writes each version whole and
renames it over metrics.h5, so a read sees one complete version. A failed read is retried
briefly (a rename racing the open on a network file system), not for long: a damaged file
stays damaged, and 400 retries of one made a report wait two minutes and say nothing.
"""
import json
import math
import os
import sys
import time

import h5py
import numpy as np


def read_sweep(sweep_dir):
    """sweep.json as sweep run writes it. The sweep tool has checked the types of the fields
    read here before starting this script; a name or file a hand edit removed is filled in."""
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        sweep = json.load(f)
    sweep.setdefault("name", os.path.basename(os.path.normpath(sweep_dir)))
    sweep.setdefault("file", "")
    return sweep


_warned = set()  # files already named in a warning (report reads the points twice)


def read_metrics(path, attempts=3):
    """Every dataset of metrics.h5 as numpy arrays ({"train/lm_loss": array, ...}), the
    optimizer tensor names as a list, and the config attribute; None when the file does not
    exist (yet) or cannot be read (a warning on stderr names it)."""
    if not os.path.exists(path):
        return None
    for attempt in range(attempts):
        try:
            out = {}
            with h5py.File(path, "r", locking=False) as f:
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
        except (OSError, KeyError, ValueError, TypeError) as e:
            if attempt == attempts - 1:
                if path not in _warned:
                    _warned.add(path)
                    print(f"warning: {path}: unreadable ({e}); its point is shown without metrics", file=sys.stderr)
                return None
            time.sleep(0.1)


RESULT_LABEL = "final validation loss"
SPREAD_LABEL = "min-max over seeds"


class Point:
    """One point of a sweep: its id, configuration, state and metrics."""

    def __init__(self, sweep_dir, entry):
        self.id = entry["id"]
        self.config = entry.get("config", {})
        self.state = entry.get("state", "pending")
        self.reason = entry.get("reason", "")
        self.wall_s = entry.get("wall_s", 0.0)
        self.dir = os.path.join(sweep_dir, self.id)
        self.diverged_at = None
        if os.path.exists(os.path.join(self.dir, "DONE")):
            self.state = "done"
            if not self.wall_s:  # an exported sweep's point: the wall time its launcher gave sweep finish
                try:
                    with open(os.path.join(self.dir, "DONE")) as f:
                        self.wall_s = float(json.load(f).get("wall_s", 0.0))
                except (OSError, ValueError, TypeError, AttributeError):
                    pass
        elif os.path.exists(os.path.join(self.dir, "DIVERGED")):
            self.state = "diverged"
            try:
                with open(os.path.join(self.dir, "DIVERGED")) as f:
                    d = json.load(f)
                self.diverged_at = int(d.get("iteration", 0))
                self.reason = f"iteration {self.diverged_at}: {d.get('reason', '')}"
            except (OSError, ValueError):
                pass
        elif os.path.exists(os.path.join(self.dir, "FAILED")):  # under an exported sweep's launcher
            self.state = "failed"
            try:
                with open(os.path.join(self.dir, "FAILED")) as f:
                    self.reason = str(json.load(f).get("reason", ""))
            except (OSError, ValueError, AttributeError):
                pass
        self.metrics = read_metrics(os.path.join(self.dir, "metrics.h5")) or {}

    def series(self, name):
        return np.asarray(self.metrics.get(name, []), dtype=float)

    def devices(self):
        """What train's first line said it ran on ("cpu (no GPU visible), f32; AMD EPYC; OpenBLAS
        0.3.21 sgemm kernel Haswell"), once per distinct line over the point's attempts, in order."""
        seen = []
        try:
            with open(os.path.join(self.dir, "stdout.log"), errors="replace") as f:
                for line in f:
                    if line.startswith("> device: ") and line[10:].strip() not in seen:
                        seen.append(line[10:].strip())
        except OSError:
            pass
        return seen

    @property
    def optimizer(self):
        return self.config.get("optimizer", "adamw")

    @property
    def batch(self):
        return int(self.config.get("global_batch_size", self.config.get("micro_batch_size", 8)))

    @property
    def sample_budget(self):
        """The samples the point trains on: train_samples where it counts samples (as a ramped
        batch must), else global batch x train_iters."""
        if self.config.get("train_samples"):
            return int(self.config["train_samples"])
        return self.batch * int(self.config.get("train_iters", 0))

    def final_train_loss(self):
        """Mean lm loss over the last 10% of iterations (at least one)."""
        loss = self.series("train/lm_loss")
        if len(loss) == 0:
            return float("nan")
        k = max(1, len(loss) // 10)
        return float(np.mean(loss[-k:]))

    def final_valid_loss(self):
        """The result: the validation loss evaluated after the last iteration (NaN when the
        point diverged or has not finished)."""
        if self.state != "done":
            return float("nan")
        v, it = self.series("validation/lm_loss"), self.series("validation/iteration")
        n = min(len(v), len(it))
        if n == 0 or int(it[n - 1]) != int(self.config.get("train_iters", it[n - 1])):
            return float("nan")
        return float(v[n - 1])

    result = final_valid_loss

    @property
    def seed(self):
        return self.config.get("seed", 1234)

    def best_valid_loss(self):
        v = self.series("validation/lm_loss")
        return float(np.min(v)) if len(v) else float("nan")

    def tokens_per_second(self):
        t = self.series("train/tokens_per_second")
        return float(np.median(t)) if len(t) else float("nan")

    def peak_memory_bytes(self):
        """The most memory the point's tensors held on its device (memory/max_allocated_bytes);
        NaN for a run from before train wrote it."""
        m = self.series("memory/max_allocated_bytes")
        return float(np.max(m)) if len(m) else float("nan")


def load_points(sweep_dir):
    sweep = read_sweep(sweep_dir)
    return sweep, [Point(sweep_dir, p) for p in sweep["points"]]


class Setting:
    """Points that differ only by their seed: one line of a plot, one cell of a table."""

    def __init__(self, points):
        self.points = sorted(points, key=lambda p: p.seed)
        self.config = {k: v for k, v in self.points[0].config.items() if k != "seed"}
        self.optimizer = self.points[0].optimizer
        self.batch = self.points[0].batch

    @property
    def seeds(self):
        return [p.seed for p in self.points]

    @property
    def diverged(self):
        return [p for p in self.points if p.state == "diverged"]

    def results(self):
        """The seeds' results that exist (a diverged or unfinished seed has none)."""
        return [x for x in (p.result() for p in self.points) if math.isfinite(x)]

    def result(self):
        """(mean, min, max) of the seeds' results that exist; NaNs when none."""
        r = self.results()
        if not r:
            return float("nan"), float("nan"), float("nan")
        return float(np.mean(r)), float(min(r)), float(max(r))

    def curve(self, x_name, y_name="train/lm_loss"):
        """Mean, min and max of a series over the seeds that are not diverged, on the
        common iterations; (x, mean, lo, hi) or None."""
        ys, xs = [], None
        for p in self.points:
            if p.state == "diverged":
                continue
            x, y = p.series(x_name), p.series(y_name)
            n = min(len(x), len(y))
            if n == 0:
                continue
            xs = x[:n] if xs is None or n < len(xs) else xs
            ys.append(y[:n])
        if not ys:
            return None
        n = min(len(y) for y in ys)
        a = np.stack([y[:n] for y in ys])
        return xs[:n], a.mean(axis=0), a.min(axis=0), a.max(axis=0)


def settings(points, keys=None):
    """Groups points that differ only by seed, in the order of their first point."""
    keys = keys if keys is not None else [k for k in swept_keys(points) if k != "seed"]
    groups = {}
    for p in points:
        k = json.dumps([p.config.get(x) for x in keys if x != "seed"], sort_keys=True)
        groups.setdefault(k, []).append(p)
    return [Setting(g) for g in groups.values()]


# Keys that never name a line or a row by themselves: the optimizer has its own place, the
# rest are derived from the batch size or are seeds.
HIDDEN = ("optimizer", "train_iters", "min_lr", "seed", "lr_warmup_iters", "lr_decay_iters", "lr_wsd_decay_iters")


def line_keys(items, keys, derived=True):
    """The keys that, besides the optimizer, tell the lines of a figure against batch size (the
    rows of the result table, the series of the critical-batch analysis) apart: the swept axes
    other than the batch size, and (with `derived`) any key derived from the batch (lr,
    train_iters, ...) that still differs between items of one batch size within a line. The
    learning rate scaled with the batch stays inside a line; an lr grid at one batch size is a
    line per lr, not a vertical zig-zag. So does a pretrained_checkpoint zipped with the batch
    (each batch size starting from its own earlier run). Items: points or settings (.optimizer,
    .batch, .config)."""
    base = [k for k in keys if k not in HIDDEN and k not in ("global_batch_size", "lr", "pretrained_checkpoint")]
    if not derived:
        return base
    rest = [k for k in keys if k not in base and k not in ("global_batch_size", "seed", "optimizer")]
    same_batch = {}
    for g in items:
        same_batch.setdefault((g.optimizer, g.batch, json.dumps([g.config.get(k) for k in base])), []).append(g)
    return base + [k for k in rest
                   if any(len({json.dumps(g.config.get(k)) for g in gs}) > 1 for gs in same_batch.values())]


def in_step(groups, j, k):
    """Whether keys j and k vary together over the settings (one value of k for each of j's, and
    the other way round), j taking two values or more: a zip group's keys."""
    pairs = {(json.dumps(g.config.get(j), sort_keys=True), json.dumps(g.config.get(k), sort_keys=True)) for g in groups}
    return len({a for a, _ in pairs}) > 1 and len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs})


def legend_keys(groups, keys):
    """The swept keys a legend (a row of the report's table, a series of the analysis) names: of
    keys that vary in step, one, its value telling the others' (a weight-decay schedule's style,
    not its start, end and the constant weight decay beside it), preferring one that every
    setting sets (a null names nothing). The batch size and the learning rate are always named,
    and a key no legend names (the optimizer: each its own panel or line) tells no other's
    values. Groups: settings or points (.config)."""
    always = ("global_batch_size", "lr")
    kept = []
    for k in sorted(keys, key=lambda k: any(g.config.get(k) is None for g in groups)):  # stable
        if k in always or not any(in_step(groups, j, k) for j in kept if j not in always and j not in HIDDEN):
            kept.append(k)
    return [k for k in keys if k in kept]


def series_keys(items, keys):
    """The keys that name a series of the critical-batch analysis (and the report's cells that
    show it): the other swept axes (line_keys without the derived ones), each zip group by one
    of its keys (legend_keys)."""
    return line_keys(items, legend_keys(items, keys), derived=False)


def value_text(v):
    """A swept value as a label shows it, as point ids do (sweeps/sweep.h): a float to 3
    significant digits, a path by its last component (a run's checkpoints/ by the run's), a list
    (a blend's weights and datasets) by its items joined with '+'."""
    if isinstance(v, list):
        return "+".join(value_text(x) for x in v)
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, str) and "/" in v.rstrip("/"):
        parts = [p for p in v.split("/") if p]
        return parts[-2] if parts[-1] == "checkpoints" and len(parts) > 1 else parts[-1]
    return f"{v}"


def axis_values(config, keys):
    """The values of `keys` in `config` as legends, tables and series read them: "key=value"
    (value_text), the sweep (several sweeps overlaid) by its name alone. A key the
    configuration leaves unset (a null in the sweep file: train's default) says nothing."""
    parts = []
    for k in keys:
        v = config.get(k)
        if v is None:
            continue
        parts.append(f"{v}" if k == "sweep" else f"{k}={value_text(v)}")
    return parts


def swept_keys(points):
    """Configuration keys whose values differ between points (the sweep's axes and derived values)."""
    keys = []
    for p in points:
        for k in p.config:
            if k not in keys and len({json.dumps(q.config.get(k), sort_keys=True) for q in points}) > 1:
                keys.append(k)
    # one sample budget, counted in iterations by some points and in samples by others (a ramped
    # batch counts samples): the run's length is not an axis
    if {"train_iters", "train_samples"} & set(keys) and len({p.sample_budget for p in points}) == 1:
        keys = [k for k in keys if k not in ("train_iters", "train_samples")]
    return keys


def sweep_labels(sweep_dirs, names):
    """What tells overlaid sweeps apart: each one's name, or where two share a name (one
    sweep file run twice, on two machines or at two commits) the shortest tail of its
    directory that differs ("a/lamb_bsz", "b/lamb_bsz"), so their points are never taken
    for seeds of one setting."""
    parts = [os.path.normpath(os.path.abspath(d)).split(os.sep) for d in sweep_dirs]
    labels = []
    for i, (name, p) in enumerate(zip(names, parts)):
        twins = [q for j, q in enumerate(parts) if j != i and names[j] == name]
        k = 1
        while any(q[-k:] == p[-k:] for q in twins) and k < len(p):
            k += 1
        labels.append("/".join(p[-k:]) if twins else name)
    return labels


def load_many(sweep_dirs, command):
    """Points of one or several sweeps, and the configuration keys that tell their settings
    apart. With several, the sweep (sweep_labels) becomes the first axis, and the other axes
    are those swept within a sweep: keys that differ only between the sweeps' bases (data
    path, model size, intervals) are told apart by the sweep, not spelled out in every label.
    Returns the sweeps' label ("a + b"), the points with metrics and those keys; `command`
    names the program in an error."""
    real = [os.path.realpath(d) for d in sweep_dirs]
    for i, d in enumerate(sweep_dirs):
        if real[i] in real[:i]:
            sys.exit(f"{command}: {d} is given twice; give each sweep once")
    loaded = [load_points(d) for d in sweep_dirs]
    labels = sweep_labels(sweep_dirs, [sweep["name"] for sweep, _ in loaded])
    points, keys = [], []
    for (_, ps), name in zip(loaded, labels):
        ps = [p for p in ps if p.metrics]
        keys += [k for k in swept_keys(ps) if k not in keys]
        if len(sweep_dirs) > 1:
            for p in ps:
                p.config = dict(p.config, sweep=name)
        points += ps
    if len(sweep_dirs) > 1:
        keys.insert(0, "sweep")
    return " + ".join(labels), points, keys
