"""sweep analyze on synthetic runs whose steps to a loss follow S(B) = S_min (1 + B_crit / B)
with known S_min and E_min = S_min B_crit: the fit recovers them."""
import math
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "analysis"))
import critical_batch as cb  # noqa: E402

TAU = 40.0  # loss(u) = 3 + 7 exp(-u / TAU) after u "ideal steps"


def ideal_steps(target, tau=TAU):
    return -tau * math.log((target - 3.0) / 7.0)


class FakePoint:
    """A run as the trainer logs it: at iteration k the loss of its forward pass, on the
    weights of k - 1 updates, each update worth 1 / (1 + B_crit / B) ideal steps."""

    def __init__(self, optimizer, batch, b_crit, seed, noise, budget, tau=TAU, overflows=0, left_out=()):
        """overflows: its first iterations skipped as fp16 overflows (train/skipped 1);
        left_out: iterations of --iterations-to-skip (no row). Neither updates the weights."""
        self.optimizer, self.batch, self.state = optimizer, batch, "done"
        self.config = {"optimizer": optimizer, "global_batch_size": batch, "seed": seed}  # as a Point's
        steps = int(budget / batch)
        it = np.array([k for k in range(1, steps + 1) if k not in left_out], dtype=float)
        skipped = (it <= overflows).astype(float)
        updates = np.concatenate([[0.0], np.cumsum(1.0 - skipped)[:-1]])  # before each logged loss
        u = updates / (1.0 + b_crit / batch)
        loss = 3.0 + 7.0 * np.exp(-u / tau)
        rng = np.random.default_rng(seed * 1000 + batch)
        loss = loss * (1.0 + noise * math.sqrt(8.0 / batch) * rng.standard_normal(len(it)))
        self._s = {"train/iteration": it, "train/lm_loss": loss, "train/consumed_samples": it * batch,
                   "noise_scale/iteration": it, "noise_scale/b_simple": np.full(len(it), b_crit * 1.5)}
        if overflows:
            self._s["train/skipped"] = skipped

    def series(self, name):
        return np.asarray(self._s.get(name, []), dtype=float)


def sweep(b_crit, batches, seeds=(1,), noise=0.0, budget=200000, optimizer="lamb", tau=TAU):
    return [FakePoint(optimizer, B, b_crit, s, noise, budget, tau) for B in batches for s in seeds]


class CriticalBatch(unittest.TestCase):
    def test_targets_are_finite_positive_losses(self):
        self.assertEqual(cb.parse_targets("7.5, 8,"), [7.5, 8.0])
        for bad in ("abc", "", ",", "nan", "inf", "1e999", "-1", "0", "7,nan", "7,,5", ",7"):
            with self.assertRaises(SystemExit, msg=bad) as caught:
                cb.parse_targets(bad)
            self.assertIn("expected comma-separated losses > 0", str(caught.exception))

    def test_exact_hyperbola_is_recovered_by_the_fit(self):
        batches = [8, 16, 32, 64, 128, 256]
        s_min, e_min = 120.0, 120.0 * 96
        fit = cb.fit_hyperbola(batches, [s_min + e_min / b for b in batches])
        self.assertAlmostEqual(fit[0], s_min, places=6)
        self.assertAlmostEqual(fit[1], e_min, places=3)

    def test_noisy_runs_recover_s_min_e_min_and_b_crit(self):
        b_crit, targets = 64.0, [4.0, 5.0]
        res = cb.analyze(sweep(b_crit, [8, 16, 32, 64, 128, 256, 512], seeds=(1, 2, 3), noise=0.02), targets)
        for row in res["optimizers"]["lamb"]:
            s_min = ideal_steps(row["target"])
            self.assertAlmostEqual(row["fit"]["s_min"] / s_min, 1.0, delta=0.1, msg=row)
            self.assertAlmostEqual(row["fit"]["e_min"] / (s_min * b_crit), 1.0, delta=0.1, msg=row)
            self.assertAlmostEqual(row["b_crit"] / b_crit, 1.0, delta=0.15, msg=row)
            lo, hi = row["b_crit_interval"]
            self.assertLess(lo, hi)
            self.assertTrue(lo <= row["b_crit"] * 1.05 and row["b_crit"] * 0.95 <= hi, msg=row)
            self.assertAlmostEqual(row["b_simple"], 1.5 * b_crit, places=6)
            self.assertEqual([p["batch"] for p in row["points"]], [8, 16, 32, 64, 128, 256, 512])
            self.assertEqual({p["seeds"] for p in row["points"]}, {3})

    def test_ramped_points_are_left_out_of_the_fit_and_named(self):
        b_crit, targets = 64.0, [4.0, 5.0]
        plain = sweep(b_crit, [8, 16, 32, 64, 128])
        ramped = FakePoint("lamb", 8, b_crit, 1, 0.0, 200000)  # a curve of batch 8, as a ramp to 256 starts
        ramped.id, ramped.batch = "lamb-ramp-bs256-s1", 256
        ramped.config.update({"global_batch_size": 256, "rampup_batch_size": [8, 8, 100000]})
        alone, mixed = cb.analyze(plain, targets), cb.analyze(plain + [ramped], targets)
        self.assertEqual(mixed["ramped_left_out"], ["lamb-ramp-bs256-s1"])
        self.assertNotIn("ramped_left_out", alone)
        self.assertEqual(mixed["optimizers"], alone["optimizers"])
        self.assertIn("left out: 1 point(s) ramp their batch (rampup_batch_size), so their steps are not those of "
                      "one batch size: lamb-ramp-bs256-s1", cb.text_table(mixed))

    def test_noise_scale_is_none_where_the_logged_estimate_is_undefined(self):
        # positive through iteration 10, then <= 0 (the |G|^2 estimate went negative) to the end:
        # a loss reached at iteration 20 has no B_simple, where the old lookup gave iteration 10's
        p = FakePoint("adamw", 16, 8.0, 1, 0.0, 16 * 40)
        b = np.linspace(4.0, 6.0, 40)
        b[10:] = -26.5
        p._s["noise_scale/b_simple"] = b
        self.assertAlmostEqual(cb.noise_scale_at(p, 5.5), float(np.interp(5.5, np.arange(1, 41), b)))
        self.assertAlmostEqual(cb.noise_scale_at(p, 10), b[9])
        self.assertIsNone(cb.noise_scale_at(p, 10.5))
        self.assertIsNone(cb.noise_scale_at(p, 20))
        self.assertIsNone(cb.noise_scale_at(p, 0.5), "before the first logged value")
        # in the analysis: a run whose estimate is undefined at the target is counted out, and said
        points = sweep(64.0, [8, 16, 32, 64, 128])
        points[1]._s["noise_scale/b_simple"] = np.full(len(points[1]._s["train/iteration"]), -3.0)
        res = cb.analyze(points, [4.0])
        row = res["optimizers"]["lamb"][0]
        self.assertEqual(row["b_simple_runs"], [4, 5])
        self.assertAlmostEqual(row["b_simple"], 1.5 * 64.0)
        self.assertIn("B_simple 96 (4 of 5 runs)", cb.text_table(res))

    def test_per_step_estimates_give_b_simple_centred_on_the_target(self):
        # |G|^2 = 1 at every step; tr(Sigma) = 10 before sample 1600, 40 from it on; one spike
        # step (|G|^2 1e4, tr 1e6) at sample 640. Batch 32, window 128: the steps within 64
        # samples of where the run is at the target, at a whole or a fractional iteration.
        p = FakePoint("lamb", 32, 64.0, 1, 0.0, 200000)
        it = p._s["train/iteration"]
        samples = it * 32
        g2, tr = np.ones(len(it)), np.where(samples < 1600, 10.0, 40.0)
        g2[19], tr[19] = 1e4, 1e6  # sample 640
        tr[60] = np.nan  # a step without an estimate (an fp16 skip) is left out
        p._s.update({"train/noise_grad_sq_norm": g2, "train/noise_trace_cov": tr})
        # iteration 40 = sample 1280: samples 1216..1344 (iterations 38..42), all 10
        self.assertAlmostEqual(cb.noise_scale_centred(p, 40, 128), 10.0)
        # iteration 50 = sample 1600: iterations 48..52 at 10, 10, 40, 40, 40
        self.assertAlmostEqual(cb.noise_scale_centred(p, 50, 128), (2 * 10 + 3 * 40) / 5)
        # iteration 50.5 = sample 1616: samples 1552..1680 (iterations 49..52)
        self.assertAlmostEqual(cb.noise_scale_centred(p, 50.5, 128), (10 + 3 * 40) / 4)
        # the NaN step at iteration 61 drops out of 59..63
        self.assertAlmostEqual(cb.noise_scale_centred(p, 61, 128), 40.0)
        # a window narrower than a step still takes the nearest step
        self.assertAlmostEqual(cb.noise_scale_centred(p, 40, 1), 10.0)
        # the spike counts only where it is in the window
        self.assertAlmostEqual(cb.noise_scale_centred(p, 20, 128), (4 * 10 + 1e6) / (4 + 1e4))
        del p._s["train/noise_grad_sq_norm"]
        self.assertIsNone(cb.noise_scale_centred(p, 40, 128), "no per-step estimates")

    def test_analyze_takes_the_centred_estimate_where_runs_have_per_step_ones(self):
        points = sweep(64.0, [8, 16, 32])
        for p in points:
            p.config["log_noise_scale"] = True
            n = len(p._s["train/iteration"])
            p._s["train/noise_grad_sq_norm"], p._s["train/noise_trace_cov"] = np.full(n, 2.0), np.full(n, 50.0)
        res = cb.analyze(points, [4.0])
        self.assertAlmostEqual(res["optimizers"]["lamb"][0]["b_simple"], 25.0)  # not the logged 96
        self.assertEqual(res["b_simple_smoothing"], "the per-step estimates summed over the 32 samples centred on "
                         "where the run reaches the target (sum of tr(Sigma) / sum of |G|^2)")

    def test_the_smoothing_of_b_simple_is_said(self):
        points = sweep(64.0, [8, 16, 32])
        self.assertIsNone(cb.analyze(points, [4.0])["b_simple_smoothing"], "no run logged it")
        for p in points:
            p.config["log_noise_scale"] = True
        self.assertEqual(cb.analyze(points, [4.0])["b_simple_smoothing"], "as logged, a moving average decaying by 0.99 a step")
        for p in points[1:]:
            p.config["noise_scale_window"] = 128
        res = cb.analyze(points, [4.0])
        self.assertEqual(res["b_simple_smoothing"],
                         "as logged, a moving average decaying by 0.99 a step; as logged, a moving average over 128 samples")
        self.assertIn("B_simple at the target: as logged, a moving average decaying", cb.text_table(res))

    def test_two_b_crits_are_told_apart(self):
        small = cb.analyze(sweep(16.0, [8, 16, 32, 64, 128, 256], optimizer="a"), [4.0])
        large = cb.analyze(sweep(256.0, [8, 16, 32, 64, 128, 256, 512, 1024], optimizer="b"), [4.0])
        self.assertAlmostEqual(small["optimizers"]["a"][0]["b_crit"] / 16.0, 1.0, delta=0.1)
        self.assertAlmostEqual(large["optimizers"]["b"][0]["b_crit"] / 256.0, 1.0, delta=0.1)

    def test_an_lr_grid_takes_each_batch_sizes_fastest_lr_and_other_axes_are_series(self):
        # at every batch size two learning rates: the tuned one follows B_crit 64, the other is
        # slower (as if B_crit were 512); the analysis takes the faster (McCandlish et al.'s
        # tuned hyperparameters), where averaging them bent the frontier
        batches = [8, 16, 32, 64, 128, 256, 512]
        points = []
        for lr, b_crit in ((0.01, 64.0), (0.1, 512.0)):
            for p in sweep(b_crit, batches):
                p.config["lr"] = lr
                points.append(p)
        row = cb.analyze(points, [4.0])["optimizers"]["lamb"][0]
        self.assertAlmostEqual(row["b_crit"] / 64.0, 1.0, delta=0.1, msg=row)
        self.assertEqual({p["seeds"] for p in row["points"]}, {1})
        self.assertEqual([p["chosen"] for p in row["points"]], [{"lr": 0.01}] * len(batches))
        # another swept axis (the model's width here) is a series of its own, each its own B_crit
        points = []
        for width, b_crit in ((64, 16.0), (128, 256.0)):
            for p in sweep(b_crit, batches + [1024]):
                p.config["hidden_size"] = width
                points.append(p)
        res = cb.analyze(points, [4.0])["optimizers"]
        self.assertEqual(sorted(res), ["lamb, hidden_size=128", "lamb, hidden_size=64"])
        self.assertAlmostEqual(res["lamb, hidden_size=64"][0]["b_crit"] / 16.0, 1.0, delta=0.1)
        self.assertAlmostEqual(res["lamb, hidden_size=128"][0]["b_crit"] / 256.0, 1.0, delta=0.1)

    def test_a_setting_some_of_whose_seeds_diverge_or_fall_short_is_not_counted(self):
        # two learning rates at every batch size, three seeds each: lr 0.1 is the faster (as if
        # B_crit were 16), lr 0.01 follows B_crit 64. At B=64 one seed of lr 0.1 diverged and at
        # B=256 one finished above the target: the mean of the seeds that got there made lr 0.1
        # the choice at both, as if it never failed. Now it is out there, and said.
        batches, target = [8, 16, 32, 64, 128, 256], 4.0
        points = []
        for lr, b_crit in ((0.01, 64.0), (0.1, 16.0)):
            for p in sweep(b_crit, batches, seeds=(1, 2, 3)):
                p.config["lr"] = lr
                points.append(p)
        fast = {(p.batch, p.config["seed"]): p for p in points if p.config["lr"] == 0.1}
        fast[(64, 2)].state = "diverged"
        short = FakePoint("lamb", 256, 16.0, 3, 0.0, 256 * 30)  # 30 iterations: ends above 4.0
        short.config["lr"] = 0.1
        points[points.index(fast[(256, 3)])] = short
        row = cb.analyze(points, [target])["optimizers"]["lamb"][0]
        chosen = {t["batch"]: t["chosen"]["lr"] for t in row["points"]}
        self.assertEqual(chosen, {8: 0.1, 16: 0.1, 32: 0.1, 64: 0.01, 128: 0.1, 256: 0.01})
        for t in row["points"]:  # each the steps of its setting's curve, B_crit 16 or 64
            b_crit = 16.0 if chosen[t["batch"]] == 0.1 else 64.0
            self.assertAlmostEqual(t["steps"], ideal_steps(target) * (1 + b_crit / t["batch"]), delta=1.0, msg=t)
            self.assertEqual(t["seeds"], 3)
        self.assertEqual(row["short"], [{"batch": 64, "reached": 2, "of": 3, "setting": {"lr": 0.1}},
                                        {"batch": 256, "reached": 2, "of": 3, "setting": {"lr": 0.1}}])
        self.assertIn("not counted: B=64 lr=0.1 (2 of 3 seeds reach it); B=256 lr=0.1 (2 of 3 seeds reach it): a "
                      "seed that diverged, or finished above the target, takes its setting out", cb.text_table(
                          {"method": "m", "optimizers": {"lamb": [row]}}))
        # a batch size whose one setting has a diverged seed has no S at the target
        points = sweep(64.0, batches, seeds=(1, 2))
        points[5].state = "diverged"  # B=32, seed 2
        row = cb.analyze(points, [target])["optimizers"]["lamb"][0]
        self.assertEqual([t["batch"] for t in row["points"]], [8, 16, 64, 128, 256])
        self.assertEqual(row["short"], [{"batch": 32, "reached": 1, "of": 2}])
        self.assertAlmostEqual(row["b_crit"] / 64.0, 1.0, delta=0.1, msg=row)
        # a seed that failed or is still running is not a finished one: its setting counts
        points[5].state = "failed"
        self.assertNotIn("short", cb.analyze(points, [target])["optimizers"]["lamb"][0])

    def test_a_batch_size_no_seed_brings_to_the_target_is_named(self):
        # B=512 stops after 20 iterations, far above loss 4.0: it was only absent from the table
        points = sweep(64.0, [8, 16, 32, 64, 128, 256]) + [FakePoint("lamb", 512, 64.0, 1, 0.0, 512 * 20)]
        res = cb.analyze(points, [4.0])
        row = res["optimizers"]["lamb"][0]
        self.assertEqual([t["batch"] for t in row["points"]], [8, 16, 32, 64, 128, 256])
        self.assertEqual(row["unreached"], [512])
        self.assertIn("    not reached: B=512 (no finished seed gets to loss 4.000)", cb.text_table(res))
        self.assertNotIn("unreached", cb.analyze(points[:-1], [4.0])["optimizers"]["lamb"][0])

    def test_too_few_points_are_said_plainly(self):
        res = cb.analyze(sweep(64.0, [8, 16]), [4.0])
        row = res["optimizers"]["lamb"][0]
        self.assertIsNone(row["fit"])
        self.assertIn("too few points for a fit: 2 batch size(s)", row["note"])
        self.assertIn("too few points", cb.text_table(res))

    def test_perfect_scaling_gives_a_lower_bound(self):
        # S proportional to 1/B over the range: B_crit is beyond the largest batch tested
        fit = cb.fit_hyperbola([8, 16, 32], [800.0, 400.0, 200.0])
        d = cb.describe_fit(fit[0] - 1.0, fit[1], [8, 16, 32])
        self.assertIsNone(d["b_crit"])
        self.assertEqual(d["bound"], "above 32")

    def test_the_first_crossing_is_interpolated(self):
        it = np.array([1.0, 2.0, 3.0, 4.0])
        self.assertAlmostEqual(cb.iteration_reaching(it, np.array([10.0, 8.0, 6.0, 7.0]), 7.0), 2.5)
        self.assertIsNone(cb.iteration_reaching(it, np.array([10.0, 9.0, 8.0, 7.5]), 7.0))
        self.assertEqual(cb.updates_before(sweep(48.0, [8])[0], 2.5), 1.5, "iteration 2.5's loss: after 1.5 updates")

    def test_the_smoothing_is_centred_on_each_step(self):
        # a straight line comes back unchanged away from the ends, whether the window is an
        # odd or an even number of steps (an even one of equal weights lagged half a step)
        loss = 20.0 - 0.5 * np.arange(24)
        for batch, window in ((64, 128), (32, 128), (16, 48), (8, 128)):  # 2, 4, 3, 16 steps
            samples = batch * np.arange(1, 25, dtype=float)
            w = window // batch
            got = cb.smoothed(samples, loss, window)
            inner = slice(w // 2, len(loss) - w // 2)
            np.testing.assert_allclose(got[inner], loss[inner], atol=1e-12, err_msg=f"{w} steps")
        np.testing.assert_allclose(cb.smoothed(64 * np.arange(1, 7.0), np.array([6.0, 5, 4, 3, 2, 1]), 128),
                                   [5.75, 5, 4, 3, 2, 1.25])  # the ends padded with the first and last

    def test_short_runs_count_the_updates_before_the_logged_loss(self):
        # the default sweep's regime: the lowest target a few ideal steps in (S_min 5.8), 20
        # steps at batch 128. Counting the iteration itself as the steps put S_min one step
        # high (6.8) and B_crit 15% low (41 for 48).
        tau, b_crit, target = 3.0, 48.0, 4.0
        row = cb.analyze(sweep(b_crit, [8, 16, 32, 64, 128], budget=2560, tau=tau), [target])["optimizers"]["lamb"][0]
        s_min = ideal_steps(target, tau)
        self.assertAlmostEqual(row["fit"]["s_min"] / s_min, 1.0, delta=0.05, msg=row)
        self.assertAlmostEqual(row["b_crit"] / b_crit, 1.0, delta=0.05, msg=row)
        # batch 128 reaches it after s_min (1 + 48 / 128) updates, at iteration one more
        self.assertAlmostEqual(row["points"][-1]["steps"], s_min * (1 + b_crit / 128), delta=0.05)
        self.assertAlmostEqual(row["points"][-1]["samples"], 128 * row["points"][-1]["steps"])

    def test_skipped_iterations_update_nothing_and_count_no_step(self):
        # an fp16 run's first iterations overflow and are skipped (train/skipped 1), and
        # --iterations-to-skip leaves iterations out of the log: neither updates the weights
        p = FakePoint("lamb", 16, 48.0, 1, 0.0, 16 * 40, overflows=3, left_out=(10, 11))
        self.assertEqual(cb.updates_before(p, 4.0), 0.0, "iterations 1-3 overflowed")
        self.assertEqual(cb.updates_before(p, 6.5), 2.5)
        self.assertEqual(cb.updates_before(p, 12.0), 6.0, "iterations 4-9 updated; 10 and 11 were left out")
        # a sweep whose runs all overflow at first, or skip iterations on the way, takes as many
        # steps to a target as one that does neither (counting iterations took 12 more at every
        # batch size: S_min 51 for 39, and B_crit 37 for 48)
        tau, b_crit, target, batches = 20.0, 48.0, 4.0, [8, 16, 32, 64, 128]
        clean = cb.analyze(sweep(b_crit, batches, budget=20000, tau=tau), [target])["optimizers"]["lamb"][0]
        rough = [FakePoint("lamb", B, b_crit, 1, 0.0, 20000, tau, overflows=10, left_out=(20, 21))
                 for B in batches]
        row = cb.analyze(rough, [target])["optimizers"]["lamb"][0]
        for a, b in zip(clean["points"], row["points"]):
            self.assertAlmostEqual(a["steps"], b["steps"], places=9, msg=(a, b))
        self.assertAlmostEqual(row["b_crit"], clean["b_crit"], places=6)
        self.assertAlmostEqual(clean["b_crit"] / b_crit, 1.0, delta=0.05, msg=clean)

    def test_the_training_time_to_a_target_sums_the_runs_step_times_before_it(self):
        # each step at batch B takes 2 B ms, the first 100 ms more (warm-up): after S updates
        # (S >= 1, fractional) 100 + 2 B S ms have passed
        points = sweep(64.0, [8, 16, 32, 64, 128], budget=20000)
        for p in points:
            ms = np.full(len(p.series("train/iteration")), 2.0 * p.batch)
            ms[0] += 100.0
            p._s["train/iteration_time_ms"] = ms
        row = cb.analyze(points, [4.0])["optimizers"]["lamb"][0]
        for t in row["points"]:
            self.assertAlmostEqual(t["seconds"], (100.0 + 2.0 * t["batch"] * t["steps"]) / 1000.0, places=9, msg=t)
        least = min(row["points"], key=lambda t: t["seconds"])
        self.assertEqual(row["fastest"], {"batch": least["batch"], "seconds": least["seconds"]})
        text = cb.text_table({"method": "m", "time": "t: ...", "optimizers": {"lamb": [row]}})
        self.assertIn(f"least time to it: B={least['batch']} ({cb.fmt_seconds(least['seconds'])})", text)
        self.assertIn(f"B=8: S={row['points'][0]['steps']:.1f} E=", text)
        # a run that logged no step times: its batch size has no time, and no batch size is the fastest
        del points[0]._s["train/iteration_time_ms"]
        row = cb.analyze(points, [4.0])["optimizers"]["lamb"][0]
        self.assertNotIn("seconds", row["points"][0])
        self.assertIn("seconds", row["points"][1])
        self.assertIsNone(row["fastest"])
        self.assertEqual([cb.fmt_seconds(s) for s in (0.0123, 59.4, 245.0, 7380.0)], ["0.0123s", "59.4s", "4m05s", "2h03m"])

    def test_a_target_runs_start_below_is_left_out_and_said(self):
        # every run starts at 10: a target of 12 is 'reached' before any update
        res = cb.analyze(sweep(64.0, [8, 16, 32, 64]), [12.0, 4.0])
        high, low = res["optimizers"]["lamb"]
        self.assertIsNone(high["fit"])
        self.assertEqual(high["starts_below"], 4)
        self.assertIn("too few points for a fit: 0 batch size(s) reach loss 12.0 from above", high["note"])
        self.assertIn("4 run(s) start at or below loss 12.0", high["note"])
        self.assertIn("choose a lower target", cb.text_table(res))
        self.assertNotIn("starts_below", low)
        self.assertEqual(len(low["points"]), 4)

    def test_a_frontier_no_run_reaches_is_drawn_without_a_warning(self):
        # matplotlib logged "No artists with labels found to put in legend" into sweep analyze's
        # output for a panel of no points
        import tempfile
        res = cb.analyze(sweep(64.0, [8, 16, 32, 64]), [12.0])
        with tempfile.TemporaryDirectory() as out, self.assertNoLogs("matplotlib", level="WARNING"):
            written = []
            cb.frontier_figure(res, out, "fake", written)
            self.assertTrue(os.path.exists(os.path.join(out, "critical_batch.png")), written)


if __name__ == "__main__":
    unittest.main()
