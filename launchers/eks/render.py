#!/usr/bin/python3
"""Renders a Kubeflow MPIJob (kubeflow.org/v2beta1) that runs one sweep point on EKS.

  render.py --instance-type p4d.24xlarge --nodes 2 --image <registry>/megabatch:latest \\
            --point /fsx/runs/bert4_lamb_bsz/lamb-bs4096-lr0.0141-s1 [--fsx-claim fsx-claim] > job.yaml
  kubectl apply -f job.yaml
  render.py --instance-type p4d.24xlarge --nodes 2 --image ... --selftest /fsx/selftest > job.yaml
  render.py --image <registry>/megabatch:latest --sweep /fsx/runs/bert4_lamb_bsz > jobs.yaml

--sweep DIR renders the job of every point of a sweep that `sweep export-points FILE --runs-dir
/fsx/runs` wrote (each of its points not yet done or diverged: export with --rerun damaged first
to run again the points whose result is lost, as `sweep status` names them; --rerun diverged,
those that diverged), one YAML document each; the
instance type and nodes default to the sweep file's "cluster" (`sweep export-points --ranks N`
checks that every point runs as a job of N = nodes x GPUs ranks). A point whose layout the job
cannot run (its TP, micro and global batch against nodes x GPUs ranks, as train checks them),
or whose memory estimate exceeds the GPUs' (launchers/plan.py, the model's sizes from this
machine's train: $MEGABATCH_BIN, else this checkout's build), is refused before anything is
rendered, with every such point named.

--selftest DIR (run it first on a new cluster) renders a job that runs launchers/selftest.sh
through the same mpirun instead of a point: a short TP x DP run checked against one GPU, in
DIR on the FSx volume; the launcher pod's log holds the table and its exit status the verdict.

Workers: one pod per node of the instance type, requesting every GPU (nvidia.com/gpu), every
EFA interface (vpc.amazonaws.com/efa) and 5 GiB of 2 MiB hugepages (libfabric's EFA
buffers), with /dev/shm as a memory-backed volume (NCCL) and the FSx for Lustre claim at
/fsx, where the point's directory lives. The launcher runs mpirun with one rank per GPU,
`train` with the point.json `sweep export-points` wrote (a checkpoint every tenth of the point's
iterations); `train --load` makes a restarted job continue from the point's last
checkpoint. As in a Slurm array task (launchers/slurm/point.sbatch): a point already DONE or
DIVERGED is not run again, and `sweep finish` records how it ended, so that `sweep status`,
`plot` and `report` read the sweep: done (its checkpoints pruned as the sweep says, DONE),
diverged (train's exit status 4: a result, the job succeeds rather than being retried) or
failed (FAILED with the error; the job fails, and MPIJob's retries run it again).
"""
import argparse
import hashlib
import json
import os
import re
import shlex
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import plan  # noqa: E402  (launchers/plan.py: the layout and memory checks of plan.py check and ec2/launch.sh)

def local_train():
    """This machine's train program, for the memory estimate of the points' models ($MEGABATCH_BIN,
    else this checkout's build), or None where there is none (said on stderr once)."""
    train = os.path.join(os.environ.get("MEGABATCH_BIN") or os.path.join(HERE, "..", "..", "build", "bin"), "train")
    if os.access(train, os.X_OK):
        return train
    print(f"render.py: no {train} here, so the points' memory is not estimated (build megabatch, or set "
          "MEGABATCH_BIN to its bin directory)", file=sys.stderr)
    return None


def refuse_misfits(misfits, instance_type, nodes, inst):
    """Stops with every point that cannot run as the job (id, problems), and what to do."""
    if not misfits:
        return
    ranks = nodes * inst["gpus"]
    lines = "\n".join(f"  {point}: {'; '.join(problems)}" for point, problems in misfits)
    raise SystemExit(f"render.py: {len(misfits)} point(s) cannot run as a job of {nodes} x {instance_type} = {ranks} "
                     f"ranks:\n{lines}\nrender them for a size they fit (--instance-type, --nodes; with --sweep, the "
                     f"sweep's cluster by default), or change the sweep's layout and export it for this size (sweep "
                     f"export-points FILE --ranks {ranks})")


def job_name(dir_name):
    """A Kubernetes name for a point's job (DNS-1123: lowercase letters, digits and '-', at most
    50 characters so that its pods' names fit 63), distinct for distinct points: a name that had
    to be cut or changed ends in a hash of the whole."""
    base = "megabatch-" + dir_name.lower()
    name = "-".join(p for p in re.split(r"[^a-z0-9]+", base) if p)
    if name != base or len(name) > 50:
        digest = hashlib.sha1(dir_name.encode()).hexdigest()[:8]
        name = name[:41].rstrip("-") + "-" + digest
    return name


def instance(instance_type):
    """instances.json's entry of an instance type."""
    table = plan.instances()
    if instance_type not in table:
        raise SystemExit(f"render.py: unknown instance type '{instance_type}'; known: {', '.join(table)}")
    return table[instance_type]


def render(instance_type, nodes, image, point, fsx_claim="fsx-claim", train="/opt/megabatch/build/bin/train",
           selftest=None):
    """The MPIJob of one point, or with selftest=DIR the cluster self-test in DIR."""
    inst = instance(instance_type)
    gpus, efa = inst["gpus"], inst["efa_interfaces"]
    name = job_name(os.path.basename((selftest or point).rstrip("/")))
    rdma = "1" if instance_type.split(".")[0] in ("p4d", "p4de", "p5", "p5en") else "0"
    env = {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "1"}
    if efa > 0:  # NCCL over EFA; sizes without EFA use NCCL's sockets and ask for no EFA device
        env.update({"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": rdma, "FI_EFA_FORK_SAFE": "1"})
    command = ["mpirun", "--allow-run-as-root", "-np", str(nodes * gpus), "--map-by", f"ppr:{gpus}:node",
               "--bind-to", "none"]
    for k, v in env.items():
        command += ["-x", f"{k}={v}"]
    if selftest:  # launchers/selftest.sh over this mpirun: TP 2 where a node has 2 GPUs
        root = os.path.dirname(os.path.dirname(os.path.dirname(train)))
        command = [f"{root}/launchers/selftest.sh", "--tp", str(2 if gpus >= 2 else 1), "--dir", selftest, "--"] + command
    else:
        command += [train, "--config", f"{point}/point.json", "--run-dir", point, "--save", f"{point}/checkpoints",
                    "--load", f"{point}/checkpoints"]
        sweep = os.path.join(os.path.dirname(train), "sweep")
        p = shlex.quote(point)
        # train's output in the pod's log and, as sweep run and Slurm keep it, in the point's stdout.log
        command = ["/bin/bash", "-c", f"if [ -e {p}/DONE ] || [ -e {p}/DIVERGED ]; then echo {p}: finished already; exit 0; fi; "
                   f"rm -f {p}/FAILED; "
                   f"{shlex.join(command)} 2>&1 | tee -a {p}/stdout.log; rc=${{PIPESTATUS[0]}}; "
                   # the point's wall time over the job's attempts, as in point.sbatch
                   f"w=$(cat {p}/launcher_wall_s 2>/dev/null); [[ $w =~ ^[0-9]+$ ]] || w=0; w=$((w + SECONDS)); "
                   f"echo $w > {p}/launcher_wall_s; "
                   # stopped at a checkpoint (evicted): the job's restart resumes it
                   f"[ $rc -eq 3 ] && exit 3; "
                   f"exec {shlex.join([sweep, 'finish', point])} --exit-status $rc --wall-s $w"]
    resources = {"nvidia.com/gpu": gpus, "memory": f"{int(inst['memory_GiB'] * 0.9)}Gi"}
    if efa > 0:  # the EFA interfaces and libfabric's 2 MiB hugepages
        resources.update({"vpc.amazonaws.com/efa": efa, "hugepages-2Mi": "5120Mi"})
    worker = {
        "replicas": nodes,
        "template": {"spec": {
            "nodeSelector": {"node.kubernetes.io/instance-type": instance_type},
            "containers": [{
                "name": "worker", "image": image, "imagePullPolicy": "IfNotPresent",
                "resources": {"limits": dict(resources), "requests": dict(resources)},
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "fsx", "mountPath": "/fsx"}],
            }],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{inst['memory_GiB'] // 4}Gi"}},
                        {"name": "fsx", "persistentVolumeClaim": {"claimName": fsx_claim}}],
        }},
    }
    launcher = {
        "replicas": 1,
        "template": {"spec": {
            "containers": [{"name": "launcher", "image": image, "command": command,
                            "volumeMounts": [{"name": "fsx", "mountPath": "/fsx"}]}],
            "volumes": [{"name": "fsx", "persistentVolumeClaim": {"claimName": fsx_claim}}],
        }},
    }
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name, "labels": {"app": "megabatch"}},
        "spec": {"slotsPerWorker": gpus, "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
                 "mpiImplementation": "OpenMPI", "mpiReplicaSpecs": {"Launcher": launcher, "Worker": worker}},
    }


def render_sweep(sweep_dir, image, instance_type=None, nodes=None, fsx_claim="fsx-claim",
                 train="/opt/megabatch/build/bin/train"):
    """The jobs of the points of an exported sweep that are not done or diverged yet, sized by
    instance_type and nodes, else by the sweep's "cluster"; (jobs, what was skipped)."""
    path = os.path.join(sweep_dir, "sweep.json")
    try:
        with open(path) as f:
            sweep = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"render.py: {path}: {e}; export the sweep first (sweep export-points FILE --runs-dir /fsx/runs)")
    cluster = sweep.get("cluster") or {}
    instance_type = instance_type or cluster.get("instance_type")
    nodes = nodes or cluster.get("nodes")
    if not instance_type or not nodes:
        raise SystemExit(f"render.py: {path} names no cluster; give --instance-type and --nodes")
    inst = instance(instance_type)
    train = local_train()
    jobs, skipped, misfits = [], [], []
    for p in sweep.get("points", []):
        point = os.path.join(os.path.abspath(sweep_dir), p["id"])
        if os.path.exists(os.path.join(point, "DONE")) or os.path.exists(os.path.join(point, "DIVERGED")):
            skipped.append(p["id"])
            continue
        problems = plan.point_problems(inst, nodes, p.get("config", {}), train, p["id"])
        if problems:
            misfits.append((p["id"], problems))
        jobs.append(render(instance_type, nodes, image, point, fsx_claim, train))
    refuse_misfits(misfits, instance_type, nodes, inst)
    return jobs, skipped


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instance-type", help="required but with --sweep of a sweep that names its cluster")
    p.add_argument("--nodes", type=int, help="default 1, or with --sweep the sweep's cluster's")
    p.add_argument("--image", required=True)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--point", help="the point's directory on the FSx volume (sweep export-points writes it)")
    what.add_argument("--selftest", metavar="DIR", help="the cluster self-test instead, in DIR on the FSx volume")
    what.add_argument("--sweep", metavar="DIR", help="every unfinished point of an exported sweep, a document each")
    p.add_argument("--fsx-claim", default="fsx-claim")
    a = p.parse_args(argv)
    if a.nodes is not None and a.nodes < 1:
        p.error(f"--nodes: expected a whole number >= 1, got {a.nodes}")
    if a.sweep:
        jobs, skipped = render_sweep(a.sweep, a.image, a.instance_type, a.nodes, a.fsx_claim)
        if skipped:
            print(f"render.py: {len(skipped)} point(s) done or diverged already, not rendered: {', '.join(skipped)}",
                  file=sys.stderr)
        yaml.safe_dump_all(jobs, sys.stdout, sort_keys=False)
        return
    if not a.instance_type:
        p.error("--instance-type is required (but with --sweep of a sweep that names its cluster)")
    if a.point:  # its layout, where the point's directory is readable here
        path = os.path.join(a.point, "point.json")
        try:
            with open(path) as f:
                config = json.load(f)
        except OSError as e:
            print(f"render.py: {path} is not readable here ({e.strerror}): the point's layout is not checked against "
                  "the job", file=sys.stderr)
        except ValueError as e:
            raise SystemExit(f"render.py: {path}: {e}; export the sweep again (sweep export-points FILE --runs-dir ...)")
        else:
            inst = instance(a.instance_type)
            problems = plan.point_problems(inst, a.nodes or 1, config, local_train(), a.point)
            refuse_misfits([(a.point, problems)] if problems else [], a.instance_type, a.nodes or 1, inst)
    yaml.safe_dump(render(a.instance_type, a.nodes or 1, a.image, a.point, a.fsx_claim, selftest=a.selftest), sys.stdout,
                   sort_keys=False)


if __name__ == "__main__":
    main()
