"""launchers/plan.py against hand-computed cases."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "launchers"))
import plan  # noqa: E402

GiB = 2**30


class Scaling(unittest.TestCase):
    def test_two_p4d_nodes_tp2(self):
        # 1e9 parameters, 24 layers, hidden 2048, seq 1024; micro 4, global 64, 50% of peak.
        # By hand: 16 GPUs, DP 8. FLOPs per token 6e9 + 12*24*1024*2048 = 6,603,979,776;
        # x 65,536 tokens = 4.327984e14; / (16 x 312e12 x 0.5 = 2.496e15) = 0.1733968 s.
        # TP: 64 / (4 x 8) = 2 micro-batches x 24 layers x 4 all-reduces x 2(1/2) x
        # (4 x 1024 x 2048 x 2 = 16,777,216 B) / 300e9 B/s = 0.0107374 s.
        # DP: 2 x 7/8 x (4e9 / 2 = 2e9 B) / (400e9 / 8 / 8 = 6.25e9 B/s) = 0.56 s.
        # Busy: 0.56 / ((0.1733968 - 0.0107374) / 64) = 220.3 -> next multiple of 32: 224.
        inst = plan.instances()["p4d.24xlarge"]
        sizes = {"params": 10**9, "layers": 24, "hidden": 2048, "seq": 1024}
        r = plan.scaling(inst, 2, 2, 4, 64, sizes, 0.5)
        self.assertEqual(r["gpus"], 16)
        self.assertEqual(r["dp"], 8)
        self.assertAlmostEqual(r["terms"]["compute"], 0.1733968, places=6)
        self.assertAlmostEqual(r["terms"]["tensor-parallel all-reduces"], 0.0107374, places=6)
        self.assertAlmostEqual(r["terms"]["data-parallel gradient all-reduce"], 0.56, places=9)
        self.assertEqual(r["dominant"], "data-parallel gradient all-reduce")
        self.assertEqual(r["busy_global_batch"], 224)

    def test_one_p5_node_all_tensor_parallel(self):
        # TP 8 on one node: DP 1, no gradient all-reduce; TP traffic over NVLink (450 GB/s).
        # compute: (6 x 2e8 + 12 x 12 x 512 x 1024) x (32 x 512) / (8 x 989e12 x 0.4)
        #        = 1,275,497,472 x 16,384 / 3.1648e15 = 20,897,750,581,248 / 3.1648e15 = 6.60318 ms
        # TP: 32 / 8 = 4 micro-batches x 12 layers x 4 x 2(7/8) x (8 x 512 x 1024 x 2) / 450e9
        #        = 4 x 12 x 4 x 1.75 x 8,388,608 / 450e9 = 6.26349 ms
        inst = plan.instances()["p5.48xlarge"]
        sizes = {"params": 2 * 10**8, "layers": 12, "hidden": 1024, "seq": 512}
        r = plan.scaling(inst, 1, 8, 8, 32, sizes, 0.4)
        self.assertEqual(r["dp"], 1)
        self.assertAlmostEqual(r["terms"]["compute"] * 1e3, 6.60318, places=4)
        self.assertAlmostEqual(r["terms"]["tensor-parallel all-reduces"] * 1e3, 6.26349, places=4)
        self.assertEqual(r["terms"]["data-parallel gradient all-reduce"], 0.0)
        self.assertEqual(r["dominant"], "compute")
        self.assertEqual(r["busy_global_batch"], 8)  # no fixed cost: any batch keeps it busy


    def test_overlapped_buckets_hide_behind_the_last_backward_pass(self):
        # The two-p4d case with --overlap-grad-reduce: 5e8 gradients per rank in buckets of
        # max(40M, 8M) -> 13 buckets. Last micro-batch's backward: (0.1733968 + 0.0107374) / 2
        # x 2/3 = 0.0613781 s; exposed = max(0.56 / 13, 0.56 - 0.0613781) = 0.4986219 s.
        inst = plan.instances()["p4d.24xlarge"]
        sizes = {"params": 10**9, "layers": 24, "hidden": 2048, "seq": 1024}
        r = plan.scaling(inst, 2, 2, 4, 64, sizes, 0.5, overlap=True)
        self.assertAlmostEqual(r["terms"]["data-parallel gradient all-reduce (exposed)"], 0.4986219, places=6)
        self.assertAlmostEqual(r["dp_total_s"], 0.56, places=9)
        # micro batch 64, global 1024: 2 micro-batches of backward (2.774349 + 0.171799) / 2 x
        # 2/3 = 0.98205 s > 0.56 s: only the last bucket shows, 0.56 / 13 = 0.0430769 s
        r = plan.scaling(inst, 2, 2, 64, 1024, sizes, 0.5, overlap=True)
        self.assertAlmostEqual(r["terms"]["data-parallel gradient all-reduce (exposed)"], 0.0430769, places=6)
        self.assertEqual(r["dominant"], "compute")


    def test_the_distributed_optimizer_moves_three_quarters_of_the_bytes_and_shards_masters_and_moments(self):
        # The two-p4d case (DP 8): the all-reduce of 2 x 7/8 x 4 N/T bytes took 0.56 s; a
        # reduce-scatter of the fp32 gradients and an all-gather of the bf16 parameters move
        # 7/8 x (4 + 2) N/T bytes: 0.56 x 6/8 = 0.42 s.
        inst = plan.instances()["p4d.24xlarge"]
        sizes = {"params": 10**9, "layers": 24, "hidden": 2048, "seq": 1024}
        r = plan.scaling(inst, 2, 2, 4, 64, sizes, 0.5, distributed=True)
        self.assertAlmostEqual(r["terms"]["data-parallel reduce-scatter + all-gather"], 0.42, places=9)
        # 18 bytes per parameter -> 2 (bf16 weight) + 4 (fp32 gradient) + 12 / DP (master, moments)
        self.assertAlmostEqual(plan.distributed_state_bytes(18.0, 8), 7.5)
        self.assertAlmostEqual(plan.distributed_state_bytes(18.0, 1), 18.0)


class Validate(unittest.TestCase):
    def test_the_model_is_within_15_percent_of_published_megatron_figures(self):
        # Narayanan et al. 2021, Table 1 (1.7B to 18.4B, TP 1 to 8, 32 to 256 A100s): the GEMM
        # efficiency is fitted on the first row, the other three are predictions.
        efficiency, rows = plan.validate()
        self.assertGreater(efficiency, 0.3)
        self.assertLess(efficiency, 0.8)
        self.assertAlmostEqual(rows[0]["modelled"], rows[0]["published"], places=3)
        for r in rows[1:]:
            ratio = r["modelled"] / r["published"]
            self.assertGreater(ratio, 0.85, r)
            self.assertLess(ratio, 1.15, r)

    def test_validate_prints_the_table(self):
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(plan.main(["validate"]), 0)
        self.assertIn("| 18.4B | 8 | 256 | 1024 | 135 |", out.getvalue())


class Arguments(unittest.TestCase):
    def test_counts_and_fractions_are_range_checked(self):
        # before: "0 x p4d.24xlarge = 0 A100-40GB", "-2 x ... = -16", efficiency nan or 2 taken
        import contextlib
        import io
        for flag, value, message in [("--nodes", "0", "expected a whole number >= 1, got '0'"),
                                     ("--nodes", "-2", "expected a whole number >= 1, got '-2'"),
                                     ("--tp", "x", "expected a whole number >= 1, got 'x'"),
                                     ("--micro-batch", "0", "expected a whole number >= 1"),
                                     ("--global-batch", "-8", "expected a whole number >= 1"),
                                     ("--efficiency", "nan", "expected a number > 0 and <= 1, got 'nan'"),
                                     ("--efficiency", "2", "expected a number > 0 and <= 1, got '2'"),
                                     ("--act-bytes", "inf", "expected a number > 0, got 'inf'")]:
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as e:
                plan.main(["check", "--instance", "p4d.24xlarge", "--params", "1000", "--layers", "2", "--hidden", "64",
                           "--seq", "128", "--state-bytes", "1e9", "--act-bytes", "1e6", flag, value])
            self.assertEqual(e.exception.code, 2, flag)
            self.assertIn(f"argument {flag}: {message}", err.getvalue())


class Check(unittest.TestCase):
    sizes = {"params": 3 * 10**8, "layers": 24, "hidden": 1024, "seq": 128,
             "state_bytes": 6 * GiB, "act_bytes": 0.25 * GiB}

    def test_a_fitting_layout(self):
        problems, memory = plan.check(plan.instances()["p4d.24xlarge"], 2, 2, 16, 1024, self.sizes)
        self.assertEqual(problems, [])
        self.assertAlmostEqual(memory / GiB, 1.1 * (6 + 4), places=9)  # 11 GiB

    def test_layouts_that_do_not_fit_are_refused_with_the_reason(self):
        g4 = plan.instances()["g4dn.12xlarge"]
        problems, _ = plan.check(g4, 1, 8, 16, 0, self.sizes)
        self.assertTrue(any("4 x 4 = 4" in p or "= 4 is not a multiple of TP 8" in p for p in problems), problems)
        self.assertTrue(any("would span nodes" in p for p in problems), problems)
        problems, memory = plan.check(g4, 1, 2, 64, 0, self.sizes)  # 1.1 x (6 + 16) = 24.2 GiB > 16
        self.assertAlmostEqual(memory / GiB, 24.2, places=9)
        self.assertTrue(any("exceeds the T4's 16 GiB" in p for p in problems), problems)
        problems, _ = plan.check(plan.instances()["p4d.24xlarge"], 1, 2, 16, 1000, self.sizes)
        self.assertTrue(any("1000 is not a multiple of micro batch x data parallelism = 16 x 4" in p for p in problems),
                        problems)

    def test_a_layout_that_does_not_fit_is_told_what_alone_would_make_it_fit(self):
        # before: "raise TP or lower the micro batch" whatever the layout, also where TP was a
        # node's GPUs already and the micro batch 1
        g4, p4d = plan.instances()["g4dn.12xlarge"], plan.instances()["p4d.24xlarge"]
        room = 16 * GiB / 1.1  # a T4's memory less check()'s 10% for workspace: 14.55 GiB
        # state 6 GiB, activations 0.25 GiB a sample: micro 64 needs 22 GiB; (14.55 - 6) / 0.25 = 34.2
        problems, _ = plan.check(g4, 1, 2, 64, 0, self.sizes)
        self.assertTrue(any(p.endswith("; raise TP (up to 4, the GPUs of a node); or lower the micro batch to 34 or less"
                                       "; or GPUs with more memory (A100-40GB, 40 GiB, A100-80GB, 80 GiB, H100-80GB, "
                                       "80 GiB, H200-141GB, 141 GiB)") for p in problems), problems)
        # TP at a node's GPUs, micro batch 1: state 30 GiB at DP 2, 12 of its 18 bytes a parameter
        # sharded -> 30 x (6 + 6) / 18 = 20 GiB > room; at any DP 30 x 6 / 18 = 10 GiB fits
        big = dict(self.sizes, state_bytes=30 * GiB, act_bytes=0.5 * GiB)
        self.assertGreater(30 * 12 / 18 + 0.5, room / GiB)
        remedy = plan.memory_remedies(g4, 2, 4, 1, big, distributed=False)
        self.assertEqual(remedy, "add nodes and shard the fp32 masters and Adam moments over their data-parallel ranks "
                         "(--use-distributed-optimizer); or GPUs with more memory (A100-40GB, 40 GiB, A100-80GB, 80 GiB, "
                         "H100-80GB, 80 GiB, H200-141GB, 141 GiB)")
        # at DP 4 (4 nodes) sharding alone is enough for state 60 GiB: 60 x (6 + 3) / 18 = 30 GiB; 40 GiB GPUs:
        # 36.4 GiB of room
        remedy = plan.memory_remedies(p4d, 4, 8, 1, dict(big, state_bytes=60 * GiB), distributed=False)
        self.assertTrue(remedy.startswith("shard the fp32 masters and Adam moments over the 4 data-parallel ranks"),
                        remedy)
        self.assertIn("GPUs with more memory (A100-80GB, 80 GiB, H100-80GB, 80 GiB, H200-141GB, 141 GiB)", remedy)
        # sharded already over the one DP rank of a node at TP 8: 60 x 6 / 18 = 20 GiB at many ranks
        self.assertTrue(plan.memory_remedies(p4d, 1, 8, 1, dict(big, state_bytes=60 * GiB), distributed=True)
                        .startswith("add nodes (the fp32 masters and Adam moments sharded over more data-parallel "
                                    "ranks); or GPUs with more memory"))
        # a job of 4 ranks on a node's 8 GPUs (TP 4, DP 1), its state sharded over its one DP rank:
        # 36 + 1 > 36.4 GiB; a rank on each GPU makes TP 8 possible, or DP 2: 36 x (6 + 6) / 18 + 1 = 25
        half, _, _ = plan.on_ranks(p4d, "p4d.24xlarge", 1, 4, 4)
        self.assertEqual(plan.memory_remedies(half, 1, 4, 1, dict(big, state_bytes=36 * GiB, act_bytes=GiB),
                                              distributed=True),
                         "8 ranks per node (one on each GPU) with TP up to 8; or 8 ranks per node (one on each GPU) "
                         "with the fp32 masters and Adam moments sharded over their 2 data-parallel ranks; or GPUs "
                         "with more memory (A100-80GB, 80 GiB, H100-80GB, 80 GiB, H200-141GB, 141 GiB)")
        # nothing left: TP at 8, micro batch 1, sharded already, more than the largest GPU holds
        self.assertEqual(plan.memory_remedies(p4d, 1, 8, 1, dict(big, state_bytes=200 * GiB), distributed=True),
                         "no micro batch, optimizer sharding or instance type makes it fit at TP 8 (megabatch has no "
                         "pipeline parallelism): a smaller model")

    def test_every_instance_type_is_described(self):
        table = plan.instances()
        for name in ["g4dn.12xlarge", "g4dn.metal", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5en.48xlarge"]:
            for key in ["gpus", "gpu_memory_GiB", "vcpus", "efa_interfaces", "network_Gbps", "gpu_link", "gpu_link_GBps",
                        "peak_tflops"]:
                self.assertIn(key, table[name], f"{name}.{key}")


if __name__ == "__main__":
    unittest.main()
