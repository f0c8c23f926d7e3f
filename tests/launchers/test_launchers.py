"""The launchers' rendered output: EKS MPIJob manifests (structure, resources per instance
type; a point's job run here as its launcher pod would run it), and the EC2 and Slurm
command lines (their --dry-run)."""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import unittest

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "launchers", "eks"))
import render  # noqa: E402

with open(os.path.join(ROOT, "launchers", "instances.json")) as _f:
    INSTANCES = {k: v for k, v in json.load(_f).items() if not k.startswith("_")}


MPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# the smallest GPT the launchers' sweeps train (a few iterations of it take about a second)
TINY_GPT = {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "seq_length": 16}


def preprocess_brown(test, d):
    """The default dataset, made in d/data by this build's preprocess; its prefix."""
    r = subprocess.run([os.path.join(os.environ["MEGABATCH_BIN"], "preprocess"), "brown", "--output-dir",
                        os.path.join(d, "data")], capture_output=True, text=True)
    test.assertEqual(r.returncode, 0, r.stdout + r.stderr)
    return os.path.join(d, "data", "brown_gpt2_text_document")


def launcher_command(job):
    return job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]


def mpirun_argv(job):
    """The mpirun command line of a point's job (its launcher runs it in /bin/bash -c)."""
    cmd = launcher_command(job)
    assert cmd[:2] == ["/bin/bash", "-c"], cmd
    return shlex.split(re.search(r"(mpirun .*?) 2>&1 \| tee", cmd[2]).group(1))


class EksManifest(unittest.TestCase):
    def test_every_instance_type_renders_a_valid_mpijob(self):
        for itype, inst in INSTANCES.items():
            with self.subTest(itype):
                text = yaml.safe_dump(render.render(itype, 3, "reg/megabatch:1", "/fsx/runs/s/lamb-bs8-lr0.04-s1"))
                job = yaml.safe_load(text)  # what kubectl would read
                self.assertEqual(job["apiVersion"], "kubeflow.org/v2beta1")
                self.assertEqual(job["kind"], "MPIJob")
                self.assertEqual(job["spec"]["slotsPerWorker"], inst["gpus"])
                specs = job["spec"]["mpiReplicaSpecs"]
                self.assertEqual(specs["Launcher"]["replicas"], 1)
                self.assertEqual(specs["Worker"]["replicas"], 3)
                pod = specs["Worker"]["template"]["spec"]
                self.assertEqual(pod["nodeSelector"]["node.kubernetes.io/instance-type"], itype)
                res = pod["containers"][0]["resources"]
                for kind in ("limits", "requests"):
                    self.assertEqual(res[kind]["nvidia.com/gpu"], inst["gpus"])
                    if inst["efa_interfaces"]:
                        self.assertEqual(res[kind]["vpc.amazonaws.com/efa"], inst["efa_interfaces"])
                        self.assertIn("hugepages-2Mi", res[kind])
                    else:  # nothing EFA-specific where the size has no EFA
                        self.assertNotIn("vpc.amazonaws.com/efa", res[kind])
                        self.assertNotIn("hugepages-2Mi", res[kind])
                vols = {v["name"]: v for v in pod["volumes"]}
                self.assertEqual(vols["shm"]["emptyDir"]["medium"], "Memory")
                self.assertEqual(vols["fsx"]["persistentVolumeClaim"]["claimName"], "fsx-claim")
                mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
                self.assertEqual(mounts, {"/dev/shm", "/fsx"})
                cmd = mpirun_argv(job)
                self.assertEqual(cmd[cmd.index("-np") + 1], str(3 * inst["gpus"]))
                self.assertIn("/fsx/runs/s/lamb-bs8-lr0.04-s1/point.json", cmd)
                self.assertIn("--load", cmd)
                rdma = "FI_EFA_USE_DEVICE_RDMA=" + ("0" if itype.startswith("g4dn") else "1")
                if inst["efa_interfaces"]:
                    self.assertIn(rdma, cmd)
                    self.assertIn("FI_PROVIDER=efa", cmd)
                else:
                    self.assertFalse([a for a in cmd if a.startswith("FI_")], cmd)

    def test_a_point_job_runs_its_point_to_done_once_and_records_divergence_and_failure(self):
        """The launcher pod's command, run here with this build's train and sweep on points of
        exported sweeps: one finishes (checkpointed every tenth of its iterations as sweep
        export wrote it, marked DONE by sweep finish, only its final checkpoint kept), one
        diverges (train's exit status 4 ends the job as a result: not a failure MPIJob would
        retry, no DONE), and neither runs again when the job does; one fails (FAILED, shown by
        sweep status)."""
        bin_dir = os.environ["MEGABATCH_BIN"]
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, **MPI_AS_ROOT, TMPDIR=d)  # (launch.sh's mpirun script goes with d)
            data = preprocess_brown(self, d)
            sweep_file = os.path.join(d, "eks.json")
            with open(sweep_file, "w") as f:
                json.dump({"name": "eks", "base": {
                    **TINY_GPT, "micro_batch_size": 4, "global_batch_size": 4, "train_iters": 20, "lr": 0.002, "log_interval": 1,
                    "eval_iters": 0, "threads": 1, "divergence_intervals": 2,
                    "data_path": [data]},
                    "zip": {"divergence_loss": [100, 5]}}, f)
            r = subprocess.run([os.path.join(bin_dir, "sweep"), "export-points", sweep_file, "--runs-dir",
                                os.path.join(d, "runs")], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(os.path.join(d, "runs", "eks", "points.txt")) as f:
                finishing, diverging = [os.path.join(d, "runs", "eks", i) for i in f.read().split()]

            def run_job(point):
                job = render.render("g4dn.2xlarge", 1, "img", point, train=os.path.join(bin_dir, "train"))
                return subprocess.run(launcher_command(job), capture_output=True, text=True, env=env)

            r = run_job(finishing)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(os.path.join(finishing, "DONE")) as f:
                self.assertIn('"iteration":20', f.read())
            with open(os.path.join(finishing, "stdout.log")) as f:
                log = f.read()
            self.assertIn("saved checkpoint at iteration        2 ", log)
            self.assertEqual(sorted(n for n in os.listdir(os.path.join(finishing, "checkpoints")) if n.endswith(".h5")),
                             ["iter_0000020.h5"])
            r = run_job(diverging)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("diverged", r.stdout)
            self.assertTrue(os.path.exists(os.path.join(diverging, "DIVERGED")))
            self.assertFalse(os.path.exists(os.path.join(diverging, "DONE")))
            for point in (finishing, diverging):  # a job applied again (or restarted) does not run it again
                r = run_job(point)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn("finished already", r.stdout)
            with open(os.path.join(finishing, "stdout.log")) as f:
                self.assertEqual(f.read(), log)
            r = subprocess.run([os.path.join(bin_dir, "sweep"), "status", os.path.join(d, "runs", "eks")],
                               capture_output=True, text=True)
            self.assertIn("sweep: 1 done, 1 diverged, 0 running, 0 failed, 0 waiting", r.stdout, r.stdout + r.stderr)
            # a point whose train fails: the job fails (MPIJob retries it), FAILED says why, and
            # sweep status shows it (before: a point that never finished, with no reason anywhere)
            with open(sweep_file) as f:
                spec = json.load(f)
            spec.update(name="eksbad", zip={"divergence_loss": [100]})
            spec["base"]["data_path"] = [os.path.join(d, "nowhere", "brown_gpt2_text_document")]
            with open(sweep_file, "w") as f:
                json.dump(spec, f)
            r = subprocess.run([os.path.join(bin_dir, "sweep"), "export-points", sweep_file, "--runs-dir",
                                os.path.join(d, "runs")], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            failing = os.path.join(d, "runs", "eksbad", "dl100")
            r = run_job(failing)
            self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("dl100: failed: ", r.stdout)
            with open(os.path.join(failing, "FAILED")) as f:
                reason = json.load(f)["reason"]
            self.assertIn("nowhere", reason)
            r = subprocess.run([os.path.join(bin_dir, "sweep"), "status", os.path.join(d, "runs", "eksbad")],
                               capture_output=True, text=True)
            self.assertIn("0 done, 0 diverged, 0 running, 1 failed", r.stdout)
            self.assertIn(reason, r.stdout)

    def test_a_sweep_renders_a_job_per_unfinished_point_sized_by_its_cluster(self):
        """render.py --sweep: every point of an exported paper sweep in one file (before: one
        render.py call per point, each given the cluster's size again), sized as the sweep's
        "cluster" says, a finished point left out; every job name a valid, distinct
        Kubernetes name."""
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([os.path.join(os.environ["MEGABATCH_BIN"], "sweep"), "export-points",
                                os.path.join(ROOT, "experiments", "paper", "bert4_lamb_bsz.json"), "--runs-dir", d,
                                "--ranks", "16"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            sweep_dir = os.path.join(d, "bert4_lamb_bsz")
            with open(os.path.join(sweep_dir, "lamb-bs512-lr0.01-s1", "DONE"), "w") as f:
                f.write("{}\n")
            jobs, skipped = render.render_sweep(sweep_dir, "img")
            self.assertEqual(skipped, ["lamb-bs512-lr0.01-s1"])
            self.assertEqual(len(jobs), 17)
            names = [j["metadata"]["name"] for j in jobs]
            self.assertEqual(len(set(names)), 17, names)
            for name, job in zip(names, jobs):
                self.assertRegex(name, r"^[a-z0-9]([a-z0-9-]{0,48}[a-z0-9])?$")
                cmd = mpirun_argv(job)
                self.assertEqual(cmd[cmd.index("-np") + 1], "16")
                self.assertIn("ppr:8:node", cmd)
                self.assertEqual(job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"], 2)
                pod = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
                self.assertEqual(pod["nodeSelector"]["node.kubernetes.io/instance-type"], "p4d.24xlarge")
            self.assertIn(os.path.join(sweep_dir, "lamb_embscale-bs16384-lr0.02-s1", "point.json"), mpirun_argv(jobs[-1]))
            # the flags win over the cluster; a long id is cut to a name that stays distinct
            jobs, _ = render.render_sweep(sweep_dir, "img", "p5.48xlarge", 2)
            self.assertEqual(mpirun_argv(jobs[0])[mpirun_argv(jobs[0]).index("-np") + 1], "16")
            pod = jobs[0]["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
            self.assertEqual(pod["nodeSelector"]["node.kubernetes.io/instance-type"], "p5.48xlarge")
            # a size some points cannot run is refused with each of them named (before: 32 ranks
            # rendered jobs whose train refuses a global batch of 512 at micro batch 32 x DP 32)
            with self.assertRaises(SystemExit) as e:
                render.render_sweep(sweep_dir, "img", "p5.48xlarge", 4)
            self.assertIn("render.py: 5 point(s) cannot run as a job of 4 x p5.48xlarge = 32 ranks:\n"
                          "  lamb-bs1024-lr0.01-s1: global batch 1024 is not a multiple of micro batch x data "
                          "parallelism = 64 x 32\n  lamb_noise-bs512-lr0.01-s1: global batch 512 is not a multiple of "
                          "micro batch x data parallelism = 32 x 32\n", str(e.exception))
            self.assertIn("sweep export-points FILE --ranks 32", str(e.exception))
            # one point: its TP against the job's GPUs, where its directory is readable here
            point = os.path.join(sweep_dir, "lamb-bs4096-lr0.0141-s1")
            with open(os.path.join(point, "point.json")) as f:
                config = json.load(f)
            with open(os.path.join(point, "point.json"), "w") as f:
                json.dump(dict(config, tensor_model_parallel_size=8), f)
            r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "launchers", "eks", "render.py"), "--image", "img",
                                "--instance-type", "g4dn.12xlarge", "--point", point], capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn(f"  {point}: nodes x GPUs = 1 x 4 = 4 is not a multiple of TP 8; TP 8 would span nodes",
                          r.stderr)
            self.assertEqual(r.stdout, "")
            with open(os.path.join(point, "point.json"), "w") as f:
                json.dump(config, f)
            long_a, long_b = render.job_name("x" * 60 + "-a"), render.job_name("x" * 60 + "-b")
            self.assertNotEqual(long_a, long_b)
            self.assertLessEqual(max(len(long_a), len(long_b)), 50)
            # the CLI: one YAML document per job; a sweep without a cluster needs the size
            r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "launchers", "eks", "render.py"), "--image", "img",
                                "--sweep", sweep_dir], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(len([doc for doc in yaml.safe_load_all(r.stdout)]), 17)
            self.assertIn("1 point(s) done or diverged already, not rendered: lamb-bs512-lr0.01-s1", r.stderr)
            with open(os.path.join(sweep_dir, "sweep.json")) as f:
                state = json.load(f)
            del state["cluster"]
            with open(os.path.join(sweep_dir, "sweep.json"), "w") as f:
                json.dump(state, f)
            with self.assertRaises(SystemExit) as e:
                render.render_sweep(sweep_dir, "img")
            self.assertIn("names no cluster; give --instance-type and --nodes", str(e.exception))

    def test_selftest_job_runs_selftest_over_the_same_mpirun(self):
        job = render.render("p5.48xlarge", 2, "img", None, selftest="/fsx/selftest")
        cmd = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
        self.assertEqual(cmd[0], "/opt/megabatch/launchers/selftest.sh")
        self.assertEqual(cmd[cmd.index("--tp") + 1], "2")
        self.assertEqual(cmd[cmd.index("--dir") + 1], "/fsx/selftest")
        self.assertEqual(cmd[cmd.index("--") + 1], "mpirun")
        self.assertEqual(cmd[cmd.index("-np") + 1], "16")
        self.assertNotIn("--config", cmd)
        self.assertEqual(job["metadata"]["name"], "megabatch-selftest")

    def test_unknown_instance_type_is_refused_with_the_known_ones(self):
        with self.assertRaises(SystemExit) as e:
            render.render("p3.16xlarge", 1, "img", "/fsx/p")
        self.assertIn("p4d.24xlarge", str(e.exception))


class Launching:
    def launch(self, itype, hostfile, *args):
        """launchers/ec2/launch.sh --instance-type ITYPE --hostfile HOSTFILE ARGS..."""
        return self.run_([os.path.join(ROOT, "launchers", "ec2", "launch.sh"), "--instance-type", itype,
                          "--hostfile", hostfile, *args])

    def run_(self, args):
        return subprocess.run(args, capture_output=True, text=True)


class CommandLines(Launching, unittest.TestCase):
    def test_ec2_launch_builds_mpirun_over_the_hostfile(self):
        with tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False) as f:
            f.write("10.0.0.1\n# a comment\n10.0.0.2\n")
        r = self.launch("p5.48xlarge", f.name, "--dry-run", "--", "--model", "bert4", "--tensor-model-parallel-size", "4")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("-np 16", r.stdout)
        self.assertIn("ppr:8:node", r.stdout)
        self.assertIn("FI_EFA_USE_DEVICE_RDMA=1", r.stdout)
        # a g4dn size without EFA: NCCL over sockets, no libfabric settings
        r = self.launch("g4dn.2xlarge", f.name, "--dry-run", "--")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("-np 2", r.stdout)
        self.assertNotIn("FI_", r.stdout)
        self.assertIn("NCCL_SOCKET_IFNAME", r.stdout)
        r = self.launch("g4dn.12xlarge", f.name, "--dry-run", "--", "--tensor-model-parallel-size", "8")
        self.assertEqual(r.returncode, 2)
        self.assertIn("TP 8 would span nodes", r.stderr)
        # the layout as train reads it, in every spelling train takes: --flag=value (skipped
        # by the check before), underscores, a --config file
        with tempfile.TemporaryDirectory() as d:
            config = os.path.join(d, "run.json")
            with open(config, "w") as c:
                json.dump({"tensor_model_parallel_size": 8}, c)
            for spelling in (["--tensor-model-parallel-size=8"], ["--tensor_model_parallel_size", "8"],
                             ["--config", config]):
                r = self.launch("g4dn.12xlarge", f.name, "--dry-run", "--", *spelling)
                self.assertEqual(r.returncode, 2, spelling)
                self.assertIn("TP 8 would span nodes", r.stderr, spelling)
                self.assertNotIn("mpirun", r.stdout)
            r = self.launch("g4dn.12xlarge", f.name, "--dry-run", "--", "--model=bert-large", "--micro-batch-size=256",
                            "--tensor-model-parallel-size=2")
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertIn("exceeds the T4's 16 GiB", r.stderr)
        # a model that does not fit in the GPUs' memory is refused before anything starts
        r = self.launch("g4dn.12xlarge", f.name, "--dry-run", "--", "--model", "bert-large", "--micro-batch-size", "256",
                        "--tensor-model-parallel-size", "2")
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("exceeds the T4's 16 GiB", r.stderr)
        self.assertNotIn("mpirun", r.stdout)

    def test_the_memory_check_counts_the_distributed_optimizers_shards(self):
        # before: launch.sh checked memory as if every rank held all the fp32 masters and Adam
        # moments, and refused a layout that fits with --use-distributed-optimizer
        with tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False) as f:
            f.write("".join(f"10.0.0.{i}\n" for i in range(1, 5)))
        layout = ["--dry-run", "--", "--model", "gpt-18.4b", "--tensor-model-parallel-size", "8",
                  "--micro-batch-size", "1", "--global-batch-size", "8"]
        r = self.launch("p4d.24xlarge", f.name, *layout)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("exceeds the A100-40GB's 40 GiB; shard the fp32 masters and Adam moments over the 4 "
                      "data-parallel ranks (--use-distributed-optimizer)", r.stderr)
        self.assertNotIn("mpirun", r.stdout)
        for spelling in (["--use-distributed-optimizer"], ["--use_distributed_optimizer"]):
            r = self.launch("p4d.24xlarge", f.name, *layout, *spelling)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("fits", r.stderr)
            self.assertIn("-np 32", r.stdout)

    def test_each_point_of_a_sweep_is_checked_for_memory_with_its_own_configuration(self):
        """plan.py check-sweep, render.py --sweep, launch.sh --sweep and submit.sh (on the
        sweep's cluster) estimate each point's memory from its own configuration (its layers,
        its optimizer sharding), as plan.py check does for one run. Before, only launch.sh's
        single runs were estimated: a sweep point too big for the GPUs became a job whose train
        refused it at start (on EKS, three times; on Slurm, after its wait in the queue)."""
        with tempfile.TemporaryDirectory() as d:
            sweep = os.path.join(d, "big.json")
            big = {"name": "big", "base": {
                "model": "gpt-18.4b", "tensor_model_parallel_size": 8, "micro_batch_size": 1,
                "global_batch_size": 32, "train_iters": 10, "lr": 1e-4, "data_path": [os.path.join(d, "none")]},
                "grid": {"num_layers": [40, 8], "use_distributed_optimizer": [False, True]}}
            with open(sweep, "w") as f:
                json.dump(big, f)
            r = subprocess.run([os.path.join(os.environ["MEGABATCH_BIN"], "sweep"), "export-points", sweep,
                                "--runs-dir", os.path.join(d, "runs")], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            sweep_dir = os.path.join(d, "runs", "big")
            plan = os.path.join(ROOT, "launchers", "plan.py")
            train = os.path.join(os.environ["MEGABATCH_BIN"], "train")
            # the preset's 40 layers without the distributed optimizer, as plan.py check sees them
            r = subprocess.run(["/usr/bin/python3", plan, "check", "--instance", "p4d.24xlarge", "--nodes", "4",
                                "--model", "gpt-18.4b", "--tp", "8", "--micro-batch", "1", "--global-batch", "32",
                                "--train", train], capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, r.stdout)
            too_big = r.stdout.split("does not fit: ")[1].strip()
            self.assertIn("exceeds the A100-40GB's 40 GiB", too_big)
            r = subprocess.run(["/usr/bin/python3", plan, "check-sweep", "--instance", "p4d.24xlarge", "--nodes", "4",
                                "--sweep", sweep_dir, "--train", train], capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            misfit = f"1 of 4 point(s) do not fit 4 x p4d.24xlarge = 32 A100-40GB:\n  nl40-udooff: {too_big}\n"
            self.assertEqual(r.stdout, misfit)
            for where in (sweep_dir, sweep):  # the exported sweep, or its file (exported on the way)
                r = subprocess.run(["/usr/bin/python3", plan, "check-sweep", "--instance", "p5.48xlarge", "--nodes", "4",
                                    "--sweep", where, "--train", train], capture_output=True, text=True)
                self.assertEqual((r.returncode, r.stdout), (0, "all 4 point(s) fit 4 x p5.48xlarge = 32 H100-80GB\n"),
                                 r.stderr)
            r = subprocess.run(["/usr/bin/python3", plan, "check-sweep", "--instance", "p4d.24xlarge", "--nodes", "4",
                                "--sweep", sweep, "--train", train], capture_output=True, text=True)
            self.assertEqual((r.returncode, r.stdout), (1, misfit), r.stderr)
            # EKS: the same refusal before anything is rendered, with this build's train
            with self.assertRaises(SystemExit) as e:
                render.render_sweep(sweep_dir, "img", "p4d.24xlarge", 4)
            self.assertIn(f"render.py: 1 point(s) cannot run as a job of 4 x p4d.24xlarge = 32 ranks:\n"
                          f"  nl40-udooff: {too_big}\n", str(e.exception))
            self.assertEqual(len(render.render_sweep(sweep_dir, "img", "p5.48xlarge", 4)[0]), 4)
            # EC2: launch.sh --sweep refuses before its dry run lists the points
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write("".join(f"10.0.0.{i}\n" for i in range(1, 5)))
            r = self.launch("p4d.24xlarge", os.path.join(d, "hosts"), "--sweep", sweep, "--dry-run", "--",
                            "--runs-dir", os.path.join(d, "ec2"))
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertIn(f"  nl40-udooff: {too_big}\n", r.stderr)
            self.assertIn("launch.sh: the sweep's points do not all fit (above)", r.stderr)
            self.assertEqual(r.stdout, "")
            self.assertFalse(os.path.exists(os.path.join(d, "ec2")))
            r = self.launch("p5.48xlarge", os.path.join(d, "hosts"), "--sweep", sweep, "--dry-run", "--",
                            "--runs-dir", os.path.join(d, "ec2"))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("all 4 point(s) fit 4 x p5.48xlarge = 32 H100-80GB", r.stderr)
            self.assertIn("--ranks 32 --jobs 1", r.stdout)
            # Slurm: a sweep that names its cluster, sized by it, is refused before anything is
            # written; on p5 nodes it fits
            submit = os.path.join(ROOT, "launchers", "slurm", "submit.sh")
            for instance_type, fits in (("p4d.24xlarge", False), ("p5.48xlarge", True)):
                with open(sweep, "w") as f:
                    json.dump(dict(big, cluster={"instance_type": instance_type, "nodes": 4, "gpus_per_node": 8}), f)
                r = self.run_([submit, sweep, "--runs-dir", os.path.join(d, "slurm"), "--dry-run"])
                if fits:
                    self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                    self.assertIn("all 4 point(s) fit 4 x p5.48xlarge = 32 H100-80GB\n", r.stdout)
                    self.assertIn("--array=0-3%4", r.stdout)
                else:
                    self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
                    self.assertIn(misfit + "submit.sh: the sweep's points do not all fit (above); nothing submitted",
                                  r.stderr)
                    self.assertNotIn("sbatch", r.stdout)
            self.assertFalse(os.path.exists(os.path.join(d, "slurm")))

    def test_a_job_with_its_own_ranks_per_node_is_checked_for_memory_at_those_ranks(self):
        """launch.sh --ranks-per-node and submit.sh --ntasks-per-node/--gpus-per-node size a job
        otherwise than one rank per GPU of each node. Before, both then skipped the memory
        estimate silently: a point that fits with its optimizer state sharded over 8 ranks a node
        (DP 2 at TP 4) but not over 4 (DP 1) was started, and refused by train on the cluster."""
        with tempfile.TemporaryDirectory() as d:
            sweep = os.path.join(d, "sharded.json")
            with open(sweep, "w") as f:
                json.dump({"name": "sharded", "cluster": {"instance_type": "p4d.24xlarge", "nodes": 1, "gpus_per_node": 8},
                           "base": {"model": "gpt-7.5b", "tensor_model_parallel_size": 4, "micro_batch_size": 1,
                                    "global_batch_size": 8, "train_iters": 10, "lr": 1e-4,
                                    "use_distributed_optimizer": True, "data_path": [os.path.join(d, "none")]},
                           "seeds": [1]}, f)
            plan = os.path.join(ROOT, "launchers", "plan.py")
            train = os.path.join(os.environ["MEGABATCH_BIN"], "train")

            def check_sweep(*args):
                return subprocess.run(["/usr/bin/python3", plan, "check-sweep", "--instance", "p4d.24xlarge",
                                       "--nodes", "1", "--sweep", sweep, "--train", train, *args],
                                      capture_output=True, text=True)
            r = check_sweep()
            self.assertEqual((r.returncode, r.stdout), (0, "all 1 point(s) fit 1 x p4d.24xlarge = 8 A100-40GB\n"),
                             r.stderr)
            r = check_sweep("--ranks-per-node", "4", "--gpus-per-node", "4")
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertRegex(r.stdout, r"^1 of 1 point\(s\) do not fit 1 x p4d.24xlarge at 4 ranks per node = 4 ranks "
                             r"on 4 A100-40GB:\n  s1: estimated [\d.]+ GiB per GPU .* exceeds the A100-40GB's 40 GiB")
            # more ranks than GPUs share them: the layout is checked (TP 4 x DP 2 runs the batch),
            # the per-GPU estimate is not made
            r = check_sweep("--ranks-per-node", "8", "--gpus-per-node", "4")
            self.assertEqual((r.returncode, r.stdout), (0, "all 1 point(s) fit 1 x p4d.24xlarge at 8 ranks per node = "
                             "8 ranks sharing 4 A100-40GB per node (the layout only: the memory estimate is for one "
                             "rank per GPU)\n"), r.stderr)
            r = check_sweep("--gpus-per-node", "9")
            self.assertEqual(r.returncode, 1)
            self.assertIn("plan.py: --gpus-per-node 9, but a p4d.24xlarge has 8", r.stderr)

            with open(os.path.join(d, "hosts"), "w") as f:
                f.write("10.0.0.1\n")
            r = self.launch("p4d.24xlarge", os.path.join(d, "hosts"), "--ranks-per-node", "4", "--sweep", sweep,
                            "--dry-run", "--", "--runs-dir", os.path.join(d, "ec2"))
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertIn("1 of 1 point(s) do not fit 1 x p4d.24xlarge at 4 ranks per node", r.stderr)
            self.assertIn("launch.sh: the sweep's points do not all fit (above)", r.stderr)
            r = self.launch("p4d.24xlarge", os.path.join(d, "hosts"), "--sweep", sweep, "--dry-run", "--",
                            "--runs-dir", os.path.join(d, "ec2"))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("--ranks 8 --jobs 1", r.stdout)
            # the same for a single run: launch.sh's plan.py check at its ranks per node
            single = ["--", "--model", "gpt-7.5b", "--tensor-model-parallel-size", "4", "--micro-batch-size", "1",
                      "--use-distributed-optimizer"]
            r = self.launch("p4d.24xlarge", os.path.join(d, "hosts"), "--ranks-per-node", "4", "--dry-run", *single)
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertIn("does not fit: estimated", r.stderr)
            r = self.launch("p4d.24xlarge", os.path.join(d, "hosts"), "--dry-run", *single)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("mpirun --hostfile", r.stdout)

            submit = os.path.join(ROOT, "launchers", "slurm", "submit.sh")

            def submit_(*args):
                return self.run_([submit, sweep, "--runs-dir", os.path.join(d, "slurm"), "--dry-run", *args])
            r = submit_("--ntasks-per-node", "4", "--gpus-per-node", "4")
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("do not fit 1 x p4d.24xlarge at 4 ranks per node = 4 ranks on 4 A100-40GB", r.stderr)
            self.assertIn("submit.sh: the sweep's points do not all fit (above); nothing submitted", r.stderr)
            self.assertNotIn("sbatch", r.stdout)
            r = submit_()
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("all 1 point(s) fit 1 x p4d.24xlarge = 8 A100-40GB\n", r.stdout)
            self.assertIn("--ntasks-per-node=8", r.stdout)
            r = submit_("--gpus-per-node", "0")  # no GPUs asked: nothing to estimate against, and it says so
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("submit.sh: no GPUs asked (--gpus-per-node 0): the points are not checked against the "
                          "p4d.24xlarge's GPU memory", r.stdout)
            self.assertFalse(os.path.exists(os.path.join(d, "slurm")))

    def test_counts_are_whole_numbers_and_an_empty_hostfile_is_named(self):
        # before: an empty hostfile ended launch.sh silently (grep -c's status under set -e),
        # TP 0 or abc in a bash "division by 0", --ranks-per-node 0 in "mpirun -np 0"; submit.sh
        # handed 0 nodes to sbatch and render.py rendered "-np 0"
        with tempfile.TemporaryDirectory() as d:
            empty, hosts = os.path.join(d, "empty"), os.path.join(d, "hosts")
            with open(empty, "w") as f:
                f.write("# no host yet\n\n")
            with open(hosts, "w") as f:
                f.write("10.0.0.1\n")
            r = self.launch("p4d.24xlarge", empty, "--dry-run", "--")
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertIn(f"launch.sh: {empty} lists no host", r.stderr)
            tp = ["--dry-run", "--", "--tensor-model-parallel-size"]
            r = self.launch("p4d.24xlarge", hosts, "--ranks-per-node", "0", "--dry-run", "--")
            self.assertEqual(r.returncode, 2)
            self.assertIn("launch.sh: --ranks-per-node must be a whole number >= 1, got '0'", r.stderr)
            # train's own parser reads the train options, and its refusal is what launch.sh says
            for args, message in [(tp + ["0"], "--tensor-model-parallel-size: 0 is out of range"),
                                  (tp + ["abc"], "--tensor-model-parallel-size: expected an integer, got 'abc'"),
                                  (tp, "--tensor-model-parallel-size: expected a value")]:
                r = self.launch("p4d.24xlarge", hosts, *args)
                self.assertEqual(r.returncode, 2, args)
                self.assertIn("train: error: " + message, r.stderr)
                self.assertIn("launch.sh: train refuses these options (above)", r.stderr)
                self.assertNotIn("mpirun", r.stdout)
        submit = os.path.join(ROOT, "launchers", "slurm", "submit.sh")
        for args, message in [(["--selftest", "--nodes", "0"], "--nodes must be a whole number >= 1, got '0'"),
                              (["--selftest", "--ntasks-per-node", "x"], "--ntasks-per-node must be a whole number >= 1"),
                              (["--selftest", "--gpus-per-node", "-1"], "--gpus-per-node must be a whole number (0: no GPUs)"),
                              ([os.path.join(ROOT, "experiments", "lamb_bsz.json"), "--max-running", "0"],
                               "--max-running must be a whole number >= 1")]:
            r = self.run_([submit, *args, "--dry-run"])
            self.assertEqual(r.returncode, 2, args)
            self.assertIn("submit.sh: " + message, r.stderr)
            self.assertNotIn("sbatch", r.stdout)
        r = self.run_(["/usr/bin/python3", os.path.join(ROOT, "launchers", "eks", "render.py"), "--instance-type",
                       "p4d.24xlarge", "--nodes", "0", "--image", "img", "--point", "/fsx/p"])
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertIn("--nodes: expected a whole number >= 1, got 0", r.stderr)

    def test_each_launcher_answers_help_with_its_own_usage(self):
        # before: submit.sh --help took "--help" for the sweep file and printed sweep's usage
        # (exit 2), and launch.sh and selftest.sh answered --help with exit 2
        for script, usage in [(["launchers/ec2/launch.sh"], "launchers/ec2/launch.sh --instance-type"),
                              (["launchers/slurm/submit.sh"], "launchers/slurm/submit.sh experiments/"),
                              (["launchers/selftest.sh"], "launchers/selftest.sh [--tp T]"),
                              (["/usr/bin/python3", "launchers/eks/render.py"], "usage: render.py")]:
            path = [os.path.join(ROOT, a) if a.startswith("launchers") else a for a in script]
            r = self.run_([*path, "--help"])
            self.assertEqual(r.returncode, 0, script)
            self.assertIn(usage, r.stdout)
            self.assertNotIn("sweep run FILE.json", r.stdout)
        # an option before the sweep file is named, not taken for the file
        r = self.run_([os.path.join(ROOT, "launchers", "slurm", "submit.sh"), "--nodes", "2",
                       os.path.join(ROOT, "experiments", "lamb_bsz.json"), "--dry-run"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("submit.sh: the sweep file (or --selftest) comes first, before --nodes", r.stderr)
        self.assertNotIn("sbatch", r.stdout)

    def test_submit_sizes_jobs_by_the_sweeps_cluster_and_refuses_points_that_do_not_fit(self):
        """A paper sweep names its cluster: submit.sh asks Slurm for those nodes, tasks and GPUs
        unless told otherwise (before: 1 node, 1 task and no GPU, each point then run on one
        CPU process), and refuses, before anything is submitted, a job size some point cannot
        run as (before: each array task failed after its wait in the queue)."""
        submit = os.path.join(ROOT, "launchers", "slurm", "submit.sh")
        paper = os.path.join(ROOT, "experiments", "paper")
        with tempfile.TemporaryDirectory() as d:
            r = self.run_([submit, os.path.join(paper, "bert4_lamb_bsz.json"), "--partition", "p4d", "--runs-dir", d,
                           "--dry-run"])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("sized as the sweep's cluster says (p4d.24xlarge): --nodes 2 --ntasks-per-node 8 "
                          "--gpus-per-node 8", r.stdout)
            sbatch = [l for l in r.stdout.splitlines() if l.startswith("sbatch ")]
            self.assertEqual(len(sbatch), 1, r.stdout)
            for arg in ("--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--partition=p4d", "--array=0-17%4"):
                self.assertIn(arg, sbatch[0].split())
            # flags win over the file, and the line says which (before: "sized as the sweep's
            # cluster says" also of the sizes the flags gave)
            r = self.run_([submit, os.path.join(paper, "bert4_lamb_bsz.json"), "--nodes", "1", "--runs-dir", d,
                           "--dry-run"])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("sized as the sweep's cluster says (p4d.24xlarge), but --nodes as given: --nodes 1 "
                          "--ntasks-per-node 8 --gpus-per-node 8", r.stdout)
            # --gpus-per-node 0 asks for none
            r = self.run_([submit, os.path.join(paper, "bert4_lamb_bsz.json"), "--nodes", "1", "--ntasks-per-node", "4",
                           "--gpus-per-node", "0", "--runs-dir", d, "--dry-run"])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            sbatch = [l for l in r.stdout.splitlines() if l.startswith("sbatch ")][0].split()
            self.assertIn("--ntasks-per-node=4", sbatch)
            self.assertFalse([a for a in sbatch if a.startswith("--gpus-per-node")], sbatch)
            # TP 8 does not fit a job of 4 ranks
            r = self.run_([submit, os.path.join(paper, "bert4_lamb_tp.json"), "--ntasks-per-node", "4", "--runs-dir", d,
                           "--dry-run"])
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertIn("1 point(s) cannot run as a job of 4 ranks", r.stderr)
            self.assertIn("lamb-bs4096-tp8-lr0.0141-s1: tensor_model_parallel_size 8 does not divide the job's 4 ranks",
                          r.stderr)
            self.assertNotIn("sbatch", r.stdout)
            self.assertFalse(os.path.exists(os.path.join(d, "bert4_lamb_tp")), "nothing written for a refused sweep")

    def test_ec2_sweep_runs_every_point_over_the_hostfiles_ranks(self):
        """launch.sh --sweep, run here over a hostfile of this machine at 2 ranks per node: each
        point of a sweep that sets no data_parallel_size runs as one job of every rank (DP 2)
        under the hostfile's mpirun, to DONE; a sweep with a point that cannot run as such a job
        is refused before anything runs. Before, plain EC2 had no way to run a sweep: launch.sh
        starts one train, and sweep run starts TP x DP ranks (1 here) on its own machine."""
        bin_dir = os.environ["MEGABATCH_BIN"]
        with tempfile.TemporaryDirectory() as d:
            # launch.sh's mpirun script goes in $XDG_CACHE_HOME/megabatch/mpirun; the assets stay
            assets = os.environ.get("MEGABATCH_ASSETS") or os.path.join(
                os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "megabatch")
            cache = os.path.join(d, "cache")
            env = dict(os.environ, **MPI_AS_ROOT, TMPDIR=d, XDG_CACHE_HOME=cache, MEGABATCH_ASSETS=assets)
            data = preprocess_brown(self, d)
            hosts = os.path.join(d, "hosts")
            with open(hosts, "w") as f:
                f.write("localhost\n")

            def sweep_file(name, batches):
                path = os.path.join(d, name + ".json")
                with open(path, "w") as f:
                    json.dump({"name": name, "base": {
                        **TINY_GPT, "micro_batch_size": 2, "train_iters": 3, "lr": 0.002, "log_interval": 1, "eval_iters": 0,
                        "data_path": [data]},
                        "zip": {"global_batch_size": batches}}, f)
                return path

            def launch(path):
                # two ranks of one host talk over loopback (the launcher allows only TCP between ranks)
                return subprocess.run([os.path.join(ROOT, "launchers", "ec2", "launch.sh"), "--instance-type",
                                       "g4dn.2xlarge", "--hostfile", hosts, "--ranks-per-node", "2",
                                       "--mpirun-arg", "--mca", "--mpirun-arg", "btl_tcp_if_include",
                                       "--mpirun-arg", "lo", "--sweep", path, "--", "--runs-dir",
                                       os.path.join(d, "runs")], capture_output=True, text=True, env=env)

            r = launch(sweep_file("ec2", [4, 8]))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            # two ranks on g4dn.2xlarge's one GPU: the points' layouts checked, no per-GPU estimate
            self.assertIn("all 2 point(s) fit 1 x g4dn.2xlarge at 2 ranks per node = 2 ranks sharing 1 T4 per node "
                          "(the layout only", r.stderr)
            for point in ("bs4", "bs8"):
                pd = os.path.join(d, "runs", "ec2", point)
                self.assertTrue(os.path.exists(os.path.join(pd, "DONE")), r.stdout)
                with open(os.path.join(pd, "config.json")) as f:
                    config = json.load(f)
                self.assertEqual((config["world_size"], config["data_parallel_size"]), (2, 2), point)
            scripts = os.listdir(os.path.join(cache, "megabatch", "mpirun"))
            self.assertEqual(len(scripts), 1, scripts)
            self.assertRegex(scripts[0], r"^[0-9a-f]{16}$")
            script = os.path.join(cache, "megabatch", "mpirun", scripts[0])
            for point in ("bs4", "bs8"):
                with open(os.path.join(d, "runs", "ec2", point, "stdout.log")) as f:
                    self.assertIn(f"> sweep: 2 ranks: {script} -np 2", f.read())
            # the same launch again (its points done, skipped) reuses the script: one a launch
            # (before, each launch left a new one in $TMPDIR)
            # (a rewrite renames a new file into place: another inode, whatever the clock's grain)
            before = (os.stat(script).st_ino, os.stat(script).st_mtime_ns)
            r = launch(os.path.join(d, "ec2.json"))
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual((os.listdir(os.path.join(cache, "megabatch", "mpirun")),
                              (os.stat(script).st_ino, os.stat(script).st_mtime_ns)), (scripts, before))
            r = launch(sweep_file("ec2bad", [2, 4]))
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("1 point(s) cannot run as a job of 2 ranks (--ranks: nodes x ranks per node): bs2: "
                          "global_batch_size 2 is not a multiple of micro_batch_size x DP (2 x 2)", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "runs", "ec2bad")))

    def test_ec2_launch_takes_the_programs_from_megabatch_bin(self):
        with tempfile.TemporaryDirectory() as d:
            hosts = os.path.join(d, "hosts")
            with open(hosts, "w") as f:
                f.write("10.0.0.1\n")
            env = dict(os.environ, MEGABATCH_BIN=os.path.join(d, "empty"))
            r = subprocess.run([os.path.join(ROOT, "launchers", "ec2", "launch.sh"), "--instance-type", "g4dn.2xlarge",
                                "--hostfile", hosts, "--dry-run", "--"], capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 2, r.stdout)
            self.assertIn(os.path.join(d, "empty", "train") + " is needed", r.stderr)
            # the build the tests run from (CMake sets MEGABATCH_BIN) is the one launched
            r = self.launch("g4dn.2xlarge", hosts, "--dry-run", "--")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(os.path.join(os.environ["MEGABATCH_BIN"], "train"), r.stdout)

    def test_slurm_submit_dry_run_says_what_it_would_submit_and_writes_nothing(self):
        # before: --dry-run wrote points.txt, every point.json and sweep.json
        with tempfile.TemporaryDirectory() as tmp:
            runs = os.path.join(tmp, "runs, it's $HOME")  # a comma, a space, a quote and a $
            r = self.run_([os.path.join(ROOT, "launchers", "slurm", "submit.sh"),
                           os.path.join(ROOT, "experiments", "lamb_bsz.json"), "--nodes", "1", "--ntasks-per-node", "2",
                           "--max-running", "3", "--runs-dir", runs, "--dry-run", "--container", "img:1"])
            self.assertEqual(r.returncode, 2, r.stderr + r.stdout)  # pyxis cannot mount a path with a comma
            self.assertIn("pyxis cannot mount", r.stderr)
            r = self.run_([os.path.join(ROOT, "launchers", "slurm", "submit.sh"),
                           os.path.join(ROOT, "experiments", "lamb_bsz.json"), "--nodes", "1", "--ntasks-per-node", "2",
                           "--max-running", "3", "--runs-dir", runs, "--dry-run"])
            self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
            self.assertEqual(os.listdir(tmp), [], "a dry run writes nothing")
            self.assertIn("/lamb_bsz/points.txt: 10 points (--dry-run: nothing written)", r.stdout)
            self.assertIn("--array=0-9%3", r.stdout)
            self.assertIn("point.sbatch", r.stdout)
            # the environment file the tasks would source: every value survives bash's reading
            env = r.stdout.split("slurm.env would hold:\n", 1)[1].split("\nsbatch", 1)[0]
            sweep_dir = os.path.join(os.path.realpath(tmp), "runs, it's $HOME", "lamb_bsz")
            out = subprocess.run(["bash", "-c", env + '\nprintf "%s\\n" "$SWEEP_DIR" "${#CONTAINER_ARGS[@]}"'],
                                 capture_output=True, text=True)
            self.assertEqual(out.stdout, sweep_dir + "\n0\n", env)
        with open(os.path.join(ROOT, "launchers", "slurm", "point.sbatch")) as f:
            sbatch = f.read()
        for line in ("#SBATCH --requeue", "#SBATCH --signal=B:USR1@120", "srun --mpi=pmix", "scontrol requeue"):
            self.assertIn(line, sbatch)


class Selftest(Launching, unittest.TestCase):
    def test_selftest_compares_a_layout_with_one_process_and_the_launchers_start_it(self):
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        selftest = os.path.join(ROOT, "launchers", "selftest.sh")
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([selftest, "--tp", "2", "--device", "cpu", "--iters", "4", "--dir", d, "--",
                                "mpirun", "-np", "4"], capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("4 ranks: TP 2 x DP 2 (MPI) against one process", r.stdout)
            rows = [l for l in r.stdout.splitlines() if l.split() and l.split()[0].isdigit()]
            self.assertEqual(len(rows), 4, r.stdout)  # four iterations compared
            self.assertIn("selftest: passed", r.stdout)
            # a layout that does not reproduce one process (here: another seed) fails, saying where
            r = subprocess.run([selftest, "--tp", "2", "--device", "cpu", "--iters", "4", "--dir", d, "--",
                                "bash", "-c", 'exec mpirun -np 2 "$@" --seed 7', "_"], capture_output=True, text=True,
                               env=env)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("FAILED: the layout does not reproduce one process", r.stdout)
            self.assertIn("<-", r.stdout)
            # a layout run that fails says train's error once, not mpirun's last lines (before:
            # "MPI_ABORT ... with errorcode 1" and its advice, the reason left in the log)
            r = subprocess.run([selftest, "--tp", "2", "--device", "cpu", "--iters", "1", "--dir", d, "--",
                                "mpirun", "-np", "3"], capture_output=True, text=True, env=env)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertEqual(r.stderr, f"selftest: the layout run failed: {d}/layout.log\ntrain: error: "
                             "tensor_model_parallel_size 2 does not divide the 3 ranks of this job; launch a multiple "
                             "of it\n")
        # bad arguments are refused before anything runs (before: --tp 0 was a bash "division by
        # 0", then a Python traceback over a missing metrics.h5, and exit status 1: "does not match")
        for args, message in [(["--tp", "0"], "--tp must be 1, 2, 4 or 8 (it splits 8 attention heads), got '0'"),
                              (["--tp", "3"], "--tp must be 1, 2, 4 or 8 (it splits 8 attention heads), got '3'"),
                              (["--iters", "0"], "--iters must be a whole number >= 1, got '0'"),
                              (["--device", "gpu"], "--device must be cuda or cpu, got 'gpu'"),
                              (["--tp"], "--tp needs a value")]:
            r = subprocess.run([selftest, *args, "--", "mpirun", "-np", "2"], capture_output=True, text=True, env=env)
            self.assertEqual((r.returncode, r.stderr), (2, f"selftest: {message}\n"), args)
        with tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False) as f:
            f.write("10.0.0.1\n10.0.0.2\n")
        r = self.launch("p4d.24xlarge", f.name, "--selftest", "--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("selftest.sh --tp 2", r.stdout)
        self.assertIn("-- mpirun --hostfile", r.stdout)
        self.assertIn("-np 16", r.stdout)
        with tempfile.TemporaryDirectory() as runs:
            r = self.run_([os.path.join(ROOT, "launchers", "slurm", "submit.sh"), "--selftest", "--nodes", "2",
                           "--ntasks-per-node", "8", "--gpus-per-node", "8", "--runs-dir", runs, "--dry-run"])
            self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
            self.assertIn("--nodes=2", r.stdout)
            self.assertIn("selftest.sh --tp 2", r.stdout)
            self.assertIn("srun --mpi=pmix", r.stdout)


if __name__ == "__main__":
    unittest.main()
