"""Seeds averaged, diverged points kept off the axes, one result: on a fake sweep directory
(sweep.json, metrics.h5 written with h5py, DONE / DIVERGED files) as sweep run leaves it."""
import contextlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import unittest

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis"))
import critical_batch  # noqa: E402
import megabatch_runs as runs  # noqa: E402
import plot  # noqa: E402
import report  # noqa: E402


def write_point(root, pid, config, loss, valid=None, diverged_at=None):
    d = os.path.join(root, pid)
    os.makedirs(d)
    n = len(loss)
    it = np.arange(1, n + 1, dtype=float)
    with h5py.File(os.path.join(d, "metrics.h5"), "w") as f:
        f["train/iteration"] = it
        f["train/lm_loss"] = np.asarray(loss, dtype=float)
        f["train/consumed_samples"] = it * config["global_batch_size"]
        f["train/learning_rate"] = np.full(n, config["lr"])
        f["train/tokens_per_second"] = np.full(n, 152340.0)  # a GPU's rate, in the points table
        if config["global_batch_size"] == 16:  # its tensors' memory, growing to 3.5 GiB: the peak in the points table
            f["memory/iteration"] = it
            f["memory/max_allocated_bytes"] = np.linspace(1, 3.5, n) * 2**30
        f["noise_scale/iteration"] = it
        f["noise_scale/b_simple"] = np.full(n, 4.0)
        if valid is not None:
            f["validation/iteration"] = np.array([float(config["train_iters"])])
            f["validation/lm_loss"] = np.array([valid])
        f.attrs["config"] = json.dumps(config)
    if diverged_at is None:
        with open(os.path.join(d, "DONE"), "w") as f:
            f.write("{}\n")
    else:
        with open(os.path.join(d, "DIVERGED"), "w") as f:
            json.dump({"iteration": diverged_at, "reason": "lm loss is nan"}, f)
    return {"id": pid, "state": "done" if diverged_at is None else "diverged", "config": config}


def plotted(*sweep_dirs):
    """plot.plot(*sweep_dirs), and per figure what its axes show: y-limits (in axis order and
    by axis title), legend texts, the color limits of its images and where its lines end on x."""
    shown = {}
    real_save = plot.save

    def keep(fig, out_dir, name, written):
        shown[name] = {"ylims": [ax.get_ylim() for ax in fig.axes],
                       "ylim_by_title": {ax.get_title(): ax.get_ylim() for ax in fig.axes},
                       "legend": [t.get_text() for ax in fig.axes if ax.get_legend()
                                  for t in ax.get_legend().get_texts()],
                       "clims": [im.get_clim() for ax in fig.axes for im in ax.images],
                       "line_x_ends": [float(np.max(line.get_xdata())) for ax in fig.axes for line in ax.lines
                                       if len(line.get_xdata())],
                       "lines": {line.get_label(): (np.asarray(line.get_xdata(), dtype=float),
                                                    np.asarray(line.get_ydata(), dtype=float))
                                 for ax in fig.axes for line in ax.lines}}
        real_save(fig, out_dir, name, written)
    plot.save = keep
    try:
        plot.plot(*sweep_dirs)
    finally:
        plot.save = real_save
    return shown


class Aggregation(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        root = self.tmp.name
        pts = []
        for B in (8, 16, 32):
            for seed, shift in ((1, 0.0), (2, 0.2)):
                iters = 256 // B
                cfg = {"optimizer": "lamb", "global_batch_size": B, "lr": 0.01, "seed": seed, "train_iters": iters}
                loss = 10.0 - 3.0 * np.arange(iters) / iters * (1.0 + 8.0 / B) + shift
                pts.append(write_point(root, f"lamb-bs{B}-s{seed}", cfg, loss, valid=7.0 + B / 100 + shift))
        cfg = {"optimizer": "lamb", "global_batch_size": 64, "lr": 0.01, "seed": 1, "train_iters": 4}
        pts.append(write_point(root, "lamb-bs64-s1", cfg, [10.0, 1e4, 1e8], diverged_at=3))
        with open(os.path.join(root, "sweep.json"), "w") as f:
            json.dump({"name": "fake", "file": "/nonexistent.json", "points": pts}, f)
        self.root = root

    def tearDown(self):
        self.tmp.cleanup()

    def test_seeds_form_one_setting_with_mean_and_spread(self):
        _, points = runs.load_points(self.root)
        groups = runs.settings(points)
        by_batch = {g.batch: g for g in groups}
        self.assertEqual(sorted(by_batch), [8, 16, 32, 64])
        self.assertEqual(by_batch[16].seeds, [1, 2])
        mean, lo, hi = by_batch[16].result()
        self.assertAlmostEqual(mean, 7.16 + 0.1)
        self.assertAlmostEqual(lo, 7.16)
        self.assertAlmostEqual(hi, 7.36)
        x, m, a, z = by_batch[8].curve("train/iteration")
        self.assertEqual(len(x), 32)
        self.assertTrue(np.allclose(z - a, 0.2))

    def test_a_diverged_point_has_no_result_and_does_not_stretch_the_axes(self):
        _, points = runs.load_points(self.root)
        d = next(p for p in points if p.id == "lamb-bs64-s1")
        self.assertEqual(d.state, "diverged")
        self.assertTrue(math.isnan(d.result()))
        self.assertIn("iteration 3: lm loss is nan", d.reason)
        shown = plotted(self.root)
        top = max(hi for _, hi in shown["loss_vs_iteration"]["ylims"])
        self.assertLess(top, 20.0, "the diverged curve (1e8) must not set the y-axis")
        lo, hi = shown["scaling"]["ylims"][0]
        self.assertLess(hi - lo, 1.0)
        for name in ("loss_vs_samples", "scaling", "lr_schedule"):
            self.assertTrue(os.path.exists(os.path.join(self.root, "figures", name + ".png")))

    def test_overlaid_sweeps_are_labelled_by_sweep_name_and_their_own_axes(self):
        # a second sweep whose base differs in model size and data path: those keys tell the two
        # sweeps apart, so the sweep's name stands for them; its own axis (the optimizer) stays
        other = os.path.join(self.tmp.name, "other")
        os.makedirs(other)
        pts = []
        for opt in ("adamw", "lamb"):
            cfg = {"optimizer": opt, "global_batch_size": 16, "lr": 0.002, "seed": 1, "train_iters": 16,
                   "hidden_size": 64, "data_path": ["/data/other_text_document"]}
            pts.append(write_point(other, f"{opt}-bs16-s1", cfg, 9.0 - np.arange(16) / 8, valid=7.5))
        with open(os.path.join(other, "sweep.json"), "w") as f:
            json.dump({"name": "other", "file": "/nonexistent.json", "points": pts}, f)
        shown = plotted(self.root, other)
        self.assertEqual(sorted(shown["scaling"]["legend"]), ["adamw, other", "lamb, fake", "lamb, other"])
        for text in shown["loss_vs_samples"]["legend"]:
            self.assertNotIn("hidden_size", text)
            self.assertNotIn("data_path", text)
        self.assertIn("other, B=16", shown["loss_vs_samples"]["legend"])
        # learning rates a panel per optimizer: adamw's 0.002 is not squeezed under lamb's 0.01
        lr = shown["lr_schedule"]["ylim_by_title"]
        self.assertEqual(sorted(lr), ["adamw", "lamb"])
        self.assertLess(lr["adamw"][1], 0.005)
        self.assertGreater(lr["lamb"][1], 0.0099)
        self.assertEqual(sorted(shown["noise_scale"]["ylim_by_title"]), ["adamw", "lamb"])

    def test_two_runs_of_one_sweep_file_stay_two_lines_not_seeds_of_one(self):
        # the same sweep (same name, same seeds) run twice, say at two commits: runs/fake and
        # again/fake are told apart by their directories, not averaged as 4 seeds
        first = os.path.join(self.tmp.name, "runs", "fake")
        second = os.path.join(self.tmp.name, "again", "fake")
        for d in (first, second):
            shutil.copytree(self.root, d, ignore=shutil.ignore_patterns("runs", "again", "figures*"))
        legend = plotted(first, second)["loss_vs_samples"]["legend"]
        self.assertIn("runs/fake, B=16, 2 seeds", legend)
        self.assertIn("again/fake, B=16, 2 seeds", legend)
        self.assertFalse([t for t in legend if "4 seeds" in t], legend)
        with self.assertRaises(SystemExit) as e:
            plot.plot(first, os.path.join(first, "."))
        self.assertIn("is given twice", str(e.exception))

    def test_an_lr_grid_at_one_batch_size_is_a_line_and_a_row_per_lr(self):
        # as experiments/lamb_bsz_lr.json: the lr swept at batch 8 is a line (here a point) per
        # lr; as lamb_bsz.json: an lr scaled with the batch stays inside one line
        def sweep(name, batches_lrs):
            d = os.path.join(self.tmp.name, name)
            os.makedirs(d)
            pts = []
            for B, lr in batches_lrs:
                cfg = {"optimizer": "lamb", "global_batch_size": B, "lr": lr, "seed": 1, "train_iters": 8}
                pts.append(write_point(d, f"lamb-bs{B}-lr{lr}-s1", cfg, 9.0 - np.arange(8) / 8, valid=7.0 + lr))
            with open(os.path.join(d, "sweep.json"), "w") as f:
                json.dump({"name": name, "file": "/nonexistent.json", "points": pts}, f)
            return d, plotted(d)["scaling"]["legend"]
        grid, legend = sweep("grid", [(8, 0.01), (8, 0.02), (8, 0.04)])
        self.assertEqual(legend, ["lamb, lr=0.01", "lamb, lr=0.02", "lamb, lr=0.04"])
        # the report's result table: a row per lr, where the three shared one cell (two lost)
        with open(report.report(grid)) as f:
            page = f.read()
        for lr, valid in ((0.01, "7.010"), (0.02, "7.020"), (0.04, "7.040")):
            self.assertIn(f"<td>lamb (lr={lr})</td><td>", page)
            self.assertIn(valid, page)
        # steps to the target: in the row of the lr the analysis took, not repeated in every row
        self.assertEqual(page.count("<br><small>to "), 1, page[page.find("<table>"):page.find("</table>")])
        self.assertEqual(sweep("scaled", [(8, 0.01), (16, 0.01 * 2 ** 0.5), (32, 0.02)])[1], ["lamb"])

    def test_a_pretrained_checkpoint_zipped_with_the_batch_stays_inside_one_line(self):
        # a second phase whose every batch size starts from that batch size's run of the first
        # (docs/sweeps.md): one line, as a scaled lr; two checkpoints at one batch size are two
        def sweep(name, batches_checkpoints):
            d = os.path.join(self.tmp.name, name)
            os.makedirs(d)
            pts = []
            for i, (B, ckpt) in enumerate(batches_checkpoints):
                cfg = {"optimizer": "lamb", "global_batch_size": B, "lr": 0.01, "seed": 1, "train_iters": 8,
                       "pretrained_checkpoint": ckpt}
                pts.append(write_point(d, f"p{i}", cfg, 9.0 - np.arange(8) / 8, valid=7.0 + B / 100))
            with open(os.path.join(d, "sweep.json"), "w") as f:
                json.dump({"name": name, "file": "/nonexistent.json", "points": pts}, f)
            return plotted(d)["scaling"]["legend"]
        self.assertEqual(sweep("phase2", [(B, f"runs/phase1/lamb-bs{B}-s1/checkpoints") for B in (8, 16, 32)]),
                         ["lamb"])
        self.assertEqual(sweep("two", [(8, "runs/p1/a/checkpoints"), (16, "runs/p1/a/checkpoints"),
                                       (8, "runs/p1/b/checkpoints/")]),
                         ["lamb, pretrained_checkpoint=a", "lamb, pretrained_checkpoint=b"])

    def test_a_wsd_decay_zipped_with_the_batch_stays_inside_one_line(self):
        # one sample budget with WSD's decay over its last 64 samples: lr_wsd_decay_iters zipped
        # with the batch (8, 4, 2 iterations) is derived from it, as train_iters is, not a line each
        d = os.path.join(self.tmp.name, "wsd")
        os.makedirs(d)
        pts = []
        for B in (8, 16, 32):
            cfg = {"optimizer": "lamb", "global_batch_size": B, "lr": 0.01, "seed": 1, "train_iters": 256 // B,
                   "lr_decay_style": "WSD", "lr_wsd_decay_iters": 64 // B}
            pts.append(write_point(d, f"lamb-bs{B}-s1", cfg, 9.0 - np.arange(256 // B) / 8, valid=7.0 + B / 100))
        with open(os.path.join(d, "sweep.json"), "w") as f:
            json.dump({"name": "wsd", "file": "/nonexistent.json", "points": pts}, f)
        self.assertEqual(plotted(d)["scaling"]["legend"], ["lamb"])

    def test_each_steps_learning_rate_is_drawn_over_the_samples_it_consumed(self):
        # A row's learning rate is its step's, of the samples before the step (a warmup over
        # 64 samples: step k at batch B trains at 0.01 min(1, (k - 1) B / 64)). Drawn at the
        # row's consumed samples, batch 32's warmup ended at 96 and batch 8's at 72: one
        # schedule in samples looked like two. Drawn over each step's samples, the two are one
        # function of the samples, from 0 to the budget.
        d = os.path.join(self.tmp.name, "warm")
        os.makedirs(d)
        pts = []
        schedule = lambda s: 0.01 * np.minimum(1.0, s / 64.0)  # noqa: E731
        for B in (8, 32):
            iters = 128 // B
            cfg = {"optimizer": "lamb", "global_batch_size": B, "lr": 0.01, "seed": 1, "train_iters": iters}
            pts.append(write_point(d, f"lamb-bs{B}-s1", cfg, 9.0 - np.arange(iters) / 8, valid=7.0))
            with h5py.File(os.path.join(d, f"lamb-bs{B}-s1", "metrics.h5"), "a") as f:
                del f["train/learning_rate"]
                f["train/learning_rate"] = schedule(np.arange(iters) * B)
        with open(os.path.join(d, "sweep.json"), "w") as f:
            json.dump({"name": "warm", "file": "/nonexistent.json", "points": pts}, f)
        lines = plotted(d)["lr_schedule"]["lines"]
        self.assertEqual(sorted(lines), ["B=32", "B=8"])
        for name, (x, y) in lines.items():
            self.assertEqual((x[0], x[-1]), (0.0, 128.0), name)
            # the drawn step function, at each of batch 32's step starts and within the steps
            for at in (0.0, 16.0, 32.0, 64.0, 96.0, 127.0):
                drawn = y[np.searchsorted(x, at, side="right") - 1]
                self.assertAlmostEqual(drawn, float(schedule(at // 32 * 32 if name == "B=32" else at // 8 * 8)),
                                       msg=f"{name} at {at}")
        x8, y8 = lines["B=8"]
        x32, y32 = lines["B=32"]
        for at in (0.0, 32.0, 64.0, 96.0):  # where both steps start, the same rate
            self.assertEqual(y8[np.searchsorted(x8, at, side="right") - 1],
                             y32[np.searchsorted(x32, at, side="right") - 1], at)

    def test_a_weight_decay_schedule_is_drawn_over_the_samples_as_the_learning_rate_is(self):
        # Points that schedule the weight decay (train/weight_decay: linear from 0 to 0.1 over
        # 128 samples, at batch 8 and 32) get a wd_schedule figure beside lr_schedule, each step's
        # value over the samples it consumed: one function of the samples at both batch sizes.
        # A point of constant weight decay has no such series and no line; a sweep without any
        # gets no figure (the default fixture's). The keys zipped with the style (its start and
        # end, the constant weight decay) vary in step with it: legends name the style alone.
        d = os.path.join(self.tmp.name, "wd")
        os.makedirs(d)
        pts = []
        schedule = lambda s: 0.1 * s / 128.0  # noqa: E731
        for B, scheduled in ((8, True), (32, True), (16, False), (8, False)):
            iters = 128 // B
            cfg = {"optimizer": "adamw", "global_batch_size": B, "lr": 0.01, "seed": 1, "train_iters": iters}
            if scheduled:
                cfg.update({"weight_decay_incr_style": "linear", "start_weight_decay": 0.0, "end_weight_decay": 0.1})
            else:
                cfg.update({"weight_decay_incr_style": "constant", "weight_decay": 0.01})
            pid = f"adamw-bs{B}-{'linear' if scheduled else 'constant'}-s1"
            pts.append(write_point(d, pid, cfg, 9.0 - np.arange(iters) / 8, valid=7.0))
            if scheduled:
                with h5py.File(os.path.join(d, pid, "metrics.h5"), "a") as f:
                    f["train/weight_decay"] = schedule(np.arange(iters) * B)
                    f["train/decoupled_learning_rate"] = 3 * schedule(np.arange(iters) * B)  # --decoupled-lr
        with open(os.path.join(d, "sweep.json"), "w") as f:
            json.dump({"name": "wd", "file": "/nonexistent.json", "points": pts}, f)
        shown = plotted(d)
        self.assertTrue(os.path.exists(os.path.join(d, "figures", "wd_schedule.png")))
        lines = shown["wd_schedule"]["lines"]
        self.assertEqual(sorted(lines), ["B=32, weight_decay_incr_style=linear", "B=8, weight_decay_incr_style=linear"])
        self.assertEqual(sorted(shown["scaling"]["legend"]), ["adamw, weight_decay_incr_style=constant",
                                                              "adamw, weight_decay_incr_style=linear"])
        for figure, scale in (("wd_schedule", 1), ("decoupled_lr_schedule", 3)):  # (drawn alike)
            for name, (x, y) in shown[figure]["lines"].items():
                self.assertEqual((x[0], x[-1]), (0.0, 128.0), name)
                step = 32 if name.startswith("B=32") else 8
                for at in (0.0, 40.0, 64.0, 127.0):
                    drawn = y[np.searchsorted(x, at, side="right") - 1]
                    self.assertAlmostEqual(drawn, scale * schedule(at // step * step), msg=f"{figure} {name} at {at}")
        self.assertEqual(sorted(shown["decoupled_lr_schedule"]["lines"]), sorted(lines))
        # the report's rows and the analysis's series name the style alone, as the legends do
        with open(report.report(d)) as f:
            page = f.read()
        for style in ("constant", "linear"):
            self.assertIn(f"<td>adamw (weight_decay_incr_style={style})</td><td>", page)
        with open(os.path.join(d, "analysis.json")) as f:
            self.assertEqual(sorted(json.load(f)["optimizers"]), ["adamw, weight_decay_incr_style=constant",
                                                                 "adamw, weight_decay_incr_style=linear"])
        self.assertNotIn("wd_schedule", plotted(self.root))
        self.assertNotIn("decoupled_lr_schedule", plotted(self.root))

    def test_sweeps_analyzed_side_by_side_are_each_as_analyzed_alone(self):
        # sweep analyze A B: the sweep is a series axis, so lamb of A and lamb of B are fitted
        # on their own points; each series equals A's or B's own analysis, bootstrap interval
        # included (each series draws on its own), and A's analysis.json is not overwritten
        def write_sweep(name, noise_batch):
            d = os.path.join(self.tmp.name, name)
            os.makedirs(d)
            pts = []
            for opt, scale in (("adamw", 1.0), ("lamb", 1.3)):
                for B in (8, 16, 32, 64):
                    iters = 512 // B
                    cfg = {"optimizer": opt, "global_batch_size": B, "lr": 0.01, "seed": 1, "train_iters": iters}
                    # S(B) grows as the batch falls below noise_batch: another B_crit per sweep
                    loss = 10.0 - 3.0 * scale * np.arange(iters) / iters * (1.0 + noise_batch / B)
                    pts.append(write_point(d, f"{opt}-bs{B}-s1", cfg, loss, valid=7.0))
            with open(os.path.join(d, "sweep.json"), "w") as f:
                json.dump({"name": name, "file": "/nonexistent.json", "points": pts}, f)
            return d

        first, second = write_sweep("first", 8.0), write_sweep("second", 48.0)
        targets = [8.5, 9.0]
        alone = {d: critical_batch.run([d], targets)[0]["optimizers"] for d in (first, second)}
        with open(os.path.join(first, "analysis.json")) as f:
            first_alone = f.read()
        both, files = critical_batch.run([first, second], targets)
        self.assertEqual(sorted(both["optimizers"]),
                         ["adamw, first", "adamw, second", "lamb, first", "lamb, second"])
        for d, name in ((first, "first"), (second, "second")):
            for opt in ("adamw", "lamb"):
                self.assertEqual(both["optimizers"][f"{opt}, {name}"], alone[d][opt], f"{opt}, {name}")
        b_crit = {k: rows[0]["b_crit"] for k, rows in both["optimizers"].items()}
        self.assertNotAlmostEqual(b_crit["lamb, first"], b_crit["lamb, second"], places=1)
        overlay = os.path.join(first, "figures-overlay")
        self.assertIn(os.path.join(overlay, "analysis.json"), files)
        self.assertTrue(os.path.exists(os.path.join(overlay, "critical_batch.png")))
        with open(os.path.join(first, "analysis.json")) as f:
            self.assertEqual(f.read(), first_alone, "the sweep's own analysis is kept")

    def test_paths_and_blends_are_labelled_as_point_ids_name_them(self):
        # a data_path axis: a dataset by its file name, a blend by its weights and datasets
        d = os.path.join(self.tmp.name, "data")
        os.makedirs(d)
        pts = []
        for i, data in enumerate((["/data/wiki_text_sentence"], ["0.3", "/data/wiki_text_sentence", "0.7", "/b/books"])):
            for B in (8, 16):
                cfg = {"optimizer": "lamb", "global_batch_size": B, "lr": 0.01, "seed": 1, "train_iters": 8,
                       "data_path": data}
                pts.append(write_point(d, f"p{i}-{B}", cfg, 9.0 - np.arange(8) / 8, valid=7.0 + B / 100))
        with open(os.path.join(d, "sweep.json"), "w") as f:
            json.dump({"name": "data", "file": "/nonexistent.json", "points": pts}, f)
        self.assertEqual(sorted(plotted(d)["scaling"]["legend"]),
                         ["lamb, data_path=0.3+wiki_text_sentence+0.7+books", "lamb, data_path=wiki_text_sentence"])
        with open(report.report(d)) as f:
            self.assertIn("<td>lamb (data_path=0.3+wiki_text_sentence+0.7+books)</td>", f.read())

    def test_a_key_that_one_optimizer_leaves_unset_is_not_named_for_it(self):
        # "weight_decay": [0.01, null] zipped with the optimizers (plugins/README.md): sgd runs at
        # train's default, and its line, row and series say nothing of weight decay
        d = os.path.join(self.tmp.name, "unset")
        os.makedirs(d)
        pts = []
        for opt, extra in (("lamb", {"weight_decay": 0.01}), ("sgd", {})):
            for B in (8, 16):
                cfg = {"optimizer": opt, "global_batch_size": B, "lr": 0.01, "seed": 1, "train_iters": 8, **extra}
                pts.append(write_point(d, f"{opt}-bs{B}-s1", cfg, 9.0 - np.arange(8) / 8, valid=7.0 + B / 100))
        with open(os.path.join(d, "sweep.json"), "w") as f:
            json.dump({"name": "unset", "file": "/nonexistent.json", "points": pts}, f)
        shown = plotted(d)
        self.assertEqual(sorted(shown["scaling"]["legend"]), ["lamb, weight_decay=0.01", "sgd"])
        self.assertIn("B=8, weight_decay=0.01", shown["loss_vs_samples"]["legend"])
        self.assertIn("B=8", shown["loss_vs_samples"]["legend"])
        with open(report.report(d)) as f:
            page = f.read()
        self.assertIn("<td>lamb (weight_decay=0.01)</td><td>", page)
        self.assertIn("<td>sgd</td><td>", page)
        self.assertNotIn("weight_decay=None", page)
        points = page[page.find("<h2>Points</h2>"):]  # the points table: sgd's weight decay is train's
        self.assertIn("<td>sgd</td><td>8</td><td>(default)</td>", points)

    def test_noise_scale_runs_of_every_batch_size_share_the_samples_axis(self):
        # batch 8, 16 and 32 over the same 256 samples: their lines end together, where by
        # iteration they ended at 32, 16 and 8
        ends = plotted(self.root)["noise_scale"]["line_x_ends"]
        self.assertEqual(len(ends), 3)
        self.assertEqual(ends, [256.0] * 3)

    def test_trust_ratio_panels_share_one_color_scale(self):
        # batch 8 logs ratios from 0.01 to 1, batch 32 from 1 to 10: one scale spans both
        for B, (lo, hi) in ((8, (0.01, 1.0)), (32, (1.0, 10.0))):
            with h5py.File(os.path.join(self.root, f"lamb-bs{B}-s1", "metrics.h5"), "a") as f:
                f["optimizer/trust_ratio"] = np.array([[lo, hi], [hi, lo]])
                f["optimizer/iteration"] = np.array([1.0, 2.0])
                f["optimizer/tensor_names"] = np.array([b"layers.0.weight", b"layers.0.bias"])
        clims = plotted(self.root)["trust_ratio"]["clims"]
        self.assertEqual(len(clims), 2)
        for clim in clims:
            self.assertAlmostEqual(clim[0], -2.0)
            self.assertAlmostEqual(clim[1], 1.0)

    def test_report_has_the_result_table_critical_batch_and_diverged_points(self):
        with open(report.report(self.root)) as f:
            page = f.read()
        self.assertIn("Result: final validation loss", page)
        self.assertIn("Critical batch size", page)
        self.assertIn("lamb-bs64-s1</code>: iteration 3: lm loss is nan", page)
        self.assertIn("1/1 diverged", page)
        self.assertIn("2 seeds", page)
        # losses with three decimals, so a column lines up; rates as whole numbers
        self.assertIn("7.260 <small>(7.160-7.360, 2 seeds)</small>", page)
        self.assertIn("<td>152,340</td>", page)
        self.assertNotIn("e+05", page)
        # the peak memory column: in MiB where a point wrote it, "-" for a run from before
        self.assertIn("<th>peak memory (MiB)</th>", page)
        self.assertIn("<td>152,340</td><td>3,584</td></tr>", page)
        self.assertIn("<td>152,340</td><td>-</td></tr>", page)
        self.assertIn("<td>1e+08</td>", page)  # the diverged point's final train loss, not 100000000.000
        # bold marks the best per batch size: one optimizer here, so every cell with a result
        self.assertEqual(page.count("<b>"), 3)

    def test_a_setting_with_a_diverged_seed_says_its_mean_is_of_fewer_seeds_and_is_not_the_best(self):
        # adamw at batch 8, two seeds, one diverged: its one result (6.5) beats lamb's mean (7.18),
        # and the cell said "(6.500-6.500, 2 seeds)" in bold, the best at batch 8
        root = os.path.join(self.tmp.name, "two")
        os.makedirs(root)
        pts = []
        for opt, seed, valid in (("lamb", 1, 7.08), ("lamb", 2, 7.28), ("adamw", 1, 6.5), ("adamw", 2, None)):
            cfg = {"optimizer": opt, "global_batch_size": 8, "lr": 0.01, "seed": seed, "train_iters": 4}
            pts.append(write_point(root, f"{opt}-bs8-s{seed}", cfg, [10.0, 9.0, 8.0, 7.5], valid=valid,
                                   diverged_at=None if valid else 3))
        with open(os.path.join(root, "sweep.json"), "w") as f:
            json.dump({"name": "two", "file": "/nonexistent.json", "points": pts}, f)
        with open(report.report(root)) as f:
            page = f.read()
        self.assertIn("6.500 <small>(6.500-6.500, 1 of 2 seeds)</small> <span class='diverged'>1/2 diverged</span>",
                      page)
        self.assertIn("<b>7.180 <small>(7.080-7.280, 2 seeds)</small></b>", page)
        self.assertEqual(page.count("<b>"), 1)

    def test_one_budget_counted_in_iterations_and_in_samples_is_not_an_axis(self):
        def point(config):
            return runs.Point(self.tmp.name, {"id": "p", "config": config})
        constant = point({"global_batch_size": 16, "train_iters": 16, "optimizer": "lamb"})
        ramped = point({"global_batch_size": 16, "train_samples": 256, "rampup_batch_size": [8, 8, 64],
                        "optimizer": "lamb"})
        self.assertEqual((constant.sample_budget, ramped.sample_budget), (256, 256))
        self.assertEqual(runs.swept_keys([constant, ramped]), ["rampup_batch_size"])
        # two budgets: the length is an axis
        longer = point({"global_batch_size": 16, "train_samples": 512, "rampup_batch_size": [8, 8, 64],
                        "optimizer": "lamb"})
        self.assertEqual(sorted(runs.swept_keys([constant, longer])),
                         ["rampup_batch_size", "train_iters", "train_samples"])

    def test_points_counted_in_samples_report_their_train_samples_as_the_budget(self):
        # a ramped batch counts samples: its config has train_samples, no train_iters (before, the
        # report multiplied the batch by a missing train_iters and said "0 samples"); the
        # critical-batch section names it as left out of the fit, as sweep analyze does
        d = os.path.join(self.tmp.name, "ramped")
        cfg = {"optimizer": "lamb", "global_batch_size": 16, "lr": 0.01, "seed": 1, "train_samples": 256,
               "rampup_batch_size": [8, 8, 64]}
        pts = [write_point(d, "lamb-bs16-s1", cfg, [10.0, 9.0, 8.0])]
        with open(os.path.join(d, "sweep.json"), "w") as f:
            json.dump({"name": "ramped", "file": "/nonexistent.json", "points": pts}, f)
        with open(report.report(d)) as f:
            page = f.read()
        self.assertIn("Sample budget per point:\n256 samples.", page)
        self.assertIn("Left out of the fit: 1 point(s) that ramp their batch (rampup_batch_size), so their steps "
                      "are not those of one batch size: <code>lamb-bs16-s1</code>.", page)

    def test_an_exported_sweeps_wall_time_is_read_from_its_launchers_done_record(self):
        # a Slurm or EKS point: sweep.json (written by sweep export-points) has no wall time; its
        # launcher's sweep finish --wall-s put it in DONE. sweep run's own record comes first.
        for pid, text in (("lamb-bs8-s1", '{"iteration": 32, "wall_s": 90}\n'), ("lamb-bs16-s1", '2026-11-26\n')):
            with open(os.path.join(self.root, pid, "DONE"), "w") as f:
                f.write(text)  # the second: the date an older point.sbatch wrote
        with open(os.path.join(self.root, "sweep.json")) as f:
            sweep = json.load(f)
        for p in sweep["points"]:
            p["wall_s"] = 30.0 if p["id"] == "lamb-bs32-s1" else 0.0
        with open(os.path.join(self.root, "sweep.json"), "w") as f:
            json.dump(sweep, f)
        with open(os.path.join(self.root, "lamb-bs32-s1", "DONE"), "w") as f:
            f.write('{"wall_s": 90}\n')
        _, points = runs.load_points(self.root)
        wall = {p.id: p.wall_s for p in points}
        self.assertEqual(wall["lamb-bs8-s1"], 90.0)
        self.assertEqual(wall["lamb-bs16-s1"], 0.0)
        self.assertEqual(wall["lamb-bs32-s1"], 30.0)
        with open(report.report(self.root)) as f:
            self.assertIn("<td>1.5</td>", f.read())  # 90 s in the points table's wall (min)

    def test_a_point_that_failed_under_its_launcher_is_failed_with_its_reason(self):
        # sweep finish --exit-status N (a Slurm task, an EKS job) wrote FAILED; sweep.json,
        # written by sweep export-points, still says pending
        d = os.path.join(self.root, "lamb-bs8-s1")
        os.remove(os.path.join(d, "DONE"))
        with open(os.path.join(d, "FAILED"), "w") as f:
            json.dump({"reason": "train (rank 0): error: out of memory"}, f)
        _, points = runs.load_points(self.root)
        failed = {p.id: p for p in points}["lamb-bs8-s1"]
        self.assertEqual((failed.state, failed.reason), ("failed", "train (rank 0): error: out of memory"))
        with open(report.report(self.root)) as f:
            self.assertIn("failed: train (rank 0): error: out of memory", f.read())

    def test_the_report_says_where_the_points_ran_and_when_kernels_differ(self):
        def log(pid, *devices):
            with open(os.path.join(self.root, pid, "stdout.log"), "w") as f:
                for d in devices:
                    f.write(f"> device: {d}\n> memory: about 93.2 MiB per rank\n iteration 1/ 4 | lm loss: 1\n")
        haswell = "cpu (no GPU visible), f32; AMD EPYC; OpenBLAS 0.3.21 sgemm kernel Haswell"
        cooperlake = haswell.replace("Haswell", "Cooperlake")
        for pid in ("lamb-bs8-s1", "lamb-bs8-s2", "lamb-bs16-s1", "lamb-bs16-s2", "lamb-bs32-s1", "lamb-bs32-s2",
                    "lamb-bs64-s1"):
            log(pid, haswell, haswell)  # a resumed point: the same line twice, counted once
        with open(report.report(self.root)) as f:
            page = f.read()
        self.assertIn(f"All 7 points ran on <code>{haswell}</code>.", page)
        log("lamb-bs16-s2", haswell, cooperlake)  # resumed after OpenBLAS picked another kernel
        os.remove(os.path.join(self.root, "lamb-bs32-s1", "stdout.log"))
        with open(report.report(self.root)) as f:
            page = f.read()
        self.assertIn("ran on 3 different devices or sgemm kernels", page)
        self.assertIn(f"<li><code>{cooperlake}</code>: 1 point(s): <code>lamb-bs16-s2</code></li>", page)
        self.assertIn(f"<li><code>{haswell}</code>: 6 point(s): ", page)
        self.assertIn("not recorded (no stdout.log)</code>: 1 point(s): "
                      "<code>lamb-bs32-s1</code>", page)

    def test_a_damaged_metrics_file_is_named_once_and_its_point_kept(self):
        # before: 400 silent retries (two minutes per read) and no word of the file
        bad = os.path.join(self.root, "lamb-bs8-s2", "metrics.h5")
        with open(bad, "w") as f:
            f.write("not an HDF5 file\n")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            _, points = runs.load_points(self.root)
            runs.load_points(self.root)
        self.assertEqual(err.getvalue().count(f"warning: {bad}: unreadable (Unable to open file"), 1, err.getvalue())
        damaged = [p for p in points if p.id == "lamb-bs8-s2"][0]
        self.assertEqual(len(damaged.series("train/lm_loss")), 0)
        self.assertTrue(math.isnan(damaged.result()))
        self.assertEqual(len([p for p in points if len(p.series("train/lm_loss"))]), 6)


if __name__ == "__main__":
    unittest.main()
