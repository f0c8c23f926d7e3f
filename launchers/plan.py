#!/usr/bin/python3
"""Sizing jobs for AWS instance types (launchers/instances.json).

  plan.py check   --instance p4d.24xlarge --nodes 2 --model bert4 --tp 2 --micro-batch 64 [--global-batch 4096]
                  [--use-distributed-optimizer]
  plan.py scaling --instance p4d.24xlarge --nodes 2 --model bert4 --tp 2 --micro-batch 64 --global-batch 4096
                  [--efficiency 0.4] [--overlap-grad-reduce] [--use-distributed-optimizer]
  plan.py check-sweep --instance p4d.24xlarge --nodes 2 --sweep FILE.json|RUNS/<sweep>
  plan.py validate   (the model against published Megatron-LM figures)

check, check-sweep and scaling take --ranks-per-node K and --gpus-per-node G for a job that
runs K ranks on G of a node's GPUs (default: all its GPUs, one rank each). More ranks than GPUs
share them: check and check-sweep then check the layout only (the memory estimate is for one
rank per GPU).

`check` refuses layouts that do not fit: nodes x GPUs not a multiple of TP, TP spanning
nodes, a global batch that micro batch x data parallelism does not divide, or a per-GPU
memory estimate (bf16 weights, fp32 gradients, master weights and Adam moments: 18 bytes
per parameter of the rank's shard, plus activations per sample times the micro batch, plus
10% for workspace; with --use-distributed-optimizer 6 + 12/DP bytes) above the GPU's memory,
saying what alone would make it fit. The model's sizes come from
`train --model M --tensor-model-parallel-size T --print-params`; --params/--layers/--hidden/
--seq/--state-bytes/--act-bytes give them directly.

`check-sweep` makes these checks for every point of a sweep file (or of a sweep that `sweep
export-points FILE --runs-dir RUNS` wrote), each point's sizes from `train --config` of its
configuration, and names each point that does not fit.

`scaling` estimates one optimizer step:
  compute = (6 N + 12 L S H) FLOPs per token x tokens per step / (GPUs x peak x efficiency)
  TP      = per micro-batch and layer, 4 all-reduces (2 forward, 2 backward) of micro x S x H
            bf16 values inside a node: 2 (T-1)/T x bytes / GPU-link bandwidth each
  DP      = one all-reduce of the rank's fp32 gradients (4 N / T bytes): 2 (D-1)/D x bytes
            / bandwidth, over the GPU links inside one node, over EFA (the node's network
            bandwidth shared by its GPUs) across nodes
With --overlap-grad-reduce the gradient buckets (Megatron's default size, max(40M, 1M x DP)
elements) are summed during the last micro-batch's backward pass (2/3 of its compute): only
what does not fit behind it is exposed, and never less than the last bucket's own time.
With --use-distributed-optimizer the fp32 gradients are reduce-scattered and the bf16
parameters all-gathered (3/4 of the bytes of the fp32 all-reduce), and each rank keeps
1/DP of the fp32 masters and Adam moments: 6 + 12/DP bytes per parameter instead of 18. Otherwise communication is not overlapped (an upper bound
on step time). It says which term dominates and the smallest global batch for which compute
is at least all communication ("keeps the GPUs busy").

`validate` sets the model beside the GPT weak-scaling runs of Narayanan et al. 2021
(Megatron-LM on DGX A100 nodes: 8 x A100 per node, NVLink, 8 x 200 Gbit/s InfiniBand; the
runs without pipeline parallelism; FLOPs counted as the paper does, with activation
recomputation): the GEMM efficiency is calibrated on the first row and the others predicted.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "build", "bin", "train")  # the train program, unless --train names another


def instances():
    with open(os.path.join(HERE, "instances.json")) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def train_sizes(args, train=None, what=None):
    """Sizes from `train ARGS --print-params`: parameters, per-rank parameters, per-rank bytes of
    weights + optimizer state (bf16 mixed precision), activation bytes per sample per rank,
    layers, hidden, seq. `what` names the model in an error (default: the arguments)."""
    train = train or TRAIN
    out = subprocess.run([train, *args, "--print-params"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"plan.py: {train} {what or ' '.join(args)} failed: {out.stderr.strip()}")
    text = out.stdout

    def grab(pattern):
        m = re.search(pattern, text)
        if not m:
            sys.exit(f"plan.py: unexpected output of train --print-params:\n{text}")
        return m.group(1)
    unit = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    mixed = re.search(r"bf16 mixed precision \+ Adam per rank: ([\d.]+) (\w+)", text)
    act = re.search(r"activations per sample per rank: ([\d.]+) (\w+)", text)
    head = re.search(r"\((\d+)(?: \+ (\d+))? layers, hidden (\d+), .*seq (\d+)", text)
    return {
        "params": int(grab(r"parameters:\s+(\d+)")),
        "params_per_rank": int(grab(r"parameters per rank:\s+(\d+)")),
        "state_bytes": float(mixed.group(1)) * unit[mixed.group(2)],
        "act_bytes": float(act.group(1)) * unit[act.group(2)],
        "layers": int(head.group(1)) + int(head.group(2) or 0),
        "hidden": int(head.group(3)),
        "seq": int(head.group(4)),
    }


def model_sizes(model, tp, train=None):
    """The sizes (train_sizes) of a preset at TP `tp`."""
    return train_sizes(["--model", model, "--tensor-model-parallel-size", str(tp)], train)


def memory_remedies(inst, nodes, tp, micro, sizes, distributed):
    """What would bring a layout that does not fit under its GPU's memory, of what it has left to
    change: each remedy alone, by the same estimate as check()'s (TP only by name: its sizes come
    from train at that TP). A job of fewer ranks than a node's GPUs (on_ranks: "node_gpus") is
    also told what a rank on every GPU would give."""
    room = inst["gpu_memory_GiB"] * 2**30 / 1.1  # for weights, optimizer state and activations
    state, act = sizes["state_bytes"], sizes["act_bytes"]
    node = inst.get("node_gpus", inst["gpus"])
    every_gpu = f"{node} ranks per node (one on each GPU)"
    dp, dp_all = inst["gpus"] * nodes // tp, node * nodes // tp

    def sharded_fits(ranks):
        return distributed_state_bytes(state, ranks, dp if distributed else 1) + act * micro <= room
    remedies = []
    if tp < inst["gpus"]:
        remedies.append(f"raise TP (up to {inst['gpus']}, the {inst.get('unit', 'GPUs')} of a node)")
    elif tp < node:
        remedies.append(f"{every_gpu} with TP up to {node}")
    if micro > 1 and state + act <= room:
        remedies.append(f"lower the micro batch to {min(micro - 1, int((room - state) // act))} or less")
    shard = "the fp32 masters and Adam moments sharded over"
    if not distributed and dp > 1 and sharded_fits(dp):
        remedies.append(f"shard the fp32 masters and Adam moments over the {dp} data-parallel ranks "
                        "(--use-distributed-optimizer)")
    elif dp_all > dp and sharded_fits(dp_all):
        remedies.append(f"{every_gpu} with {shard} their {dp_all} data-parallel ranks"
                        + ("" if distributed else " (--use-distributed-optimizer)"))
    elif sharded_fits(2**20):
        remedies.append(f"add nodes ({shard} more data-parallel ranks)" if distributed else
                        "add nodes and shard the fp32 masters and Adam moments over their data-parallel ranks "
                        "(--use-distributed-optimizer)")
    roomier = sorted({(t["gpu_memory_GiB"], t["gpu"]) for t in instances().values()
                      if t["gpu_memory_GiB"] * 2**30 / 1.1 >= state + act * micro})
    if roomier:
        remedies.append("GPUs with more memory (" + ", ".join(f"{gpu}, {gib} GiB" for gib, gpu in roomier) + ")")
    if not remedies:
        return "no micro batch, optimizer sharding or instance type makes it fit at TP " + str(tp) + \
            " (megabatch has no pipeline parallelism): a smaller model"
    return "; or ".join(remedies)


def layout_problems(inst, nodes, tp, micro, global_batch):
    """Why TP x DP over nodes of this instance type cannot run the batch (empty: it can)."""
    problems = []
    gpus = inst["gpus"] * nodes
    if gpus % tp:
        problems.append(f"nodes x {inst.get('unit', 'GPUs')} = {nodes} x {inst['gpus']} = {gpus} is not a multiple of "
                        f"TP {tp}")
    if tp > inst["gpus"]:
        problems.append(f"TP {tp} would span nodes ({inst['gpus']} {inst.get('unit', 'GPUs')} per node); keep tensor "
                        "parallelism inside a node (NVLink/PCIe), use data parallelism across nodes")
    dp = max(1, gpus // tp)
    if global_batch and global_batch % (micro * dp):
        problems.append(f"global batch {global_batch} is not a multiple of micro batch x data parallelism = "
                        f"{micro} x {dp}")
    return problems


def memory_problems(inst, nodes, tp, micro, sizes, distributed=False):
    """Whether the memory estimate fits the GPU: ([the problem, with its remedies] or [], the
    per-GPU estimate in bytes); `distributed`: sizes["state_bytes"] is already the distributed
    optimizer's."""
    memory = 1.1 * (sizes["state_bytes"] + sizes["act_bytes"] * micro)
    if memory <= inst["gpu_memory_GiB"] * 2**30:
        return [], memory
    return [f"estimated {memory / 2**30:.1f} GiB per GPU (weights + optimizer state "
            f"{sizes['state_bytes'] / 2**30:.1f} GiB, activations {sizes['act_bytes'] * micro / 2**30:.1f} GiB "
            f"for micro batch {micro}, +10%) exceeds the {inst['gpu']}'s {inst['gpu_memory_GiB']} GiB"
            + "; " + memory_remedies(inst, nodes, tp, micro, sizes, distributed)], memory


def check(inst, nodes, tp, micro, global_batch, sizes, distributed=False):
    """Problems of a layout (empty: it fits) and the per-GPU memory estimate in bytes;
    `distributed`: sizes["state_bytes"] is already the distributed optimizer's."""
    too_big, memory = memory_problems(inst, nodes, tp, micro, sizes, distributed)
    return layout_problems(inst, nodes, tp, micro, global_batch) + too_big, memory


TRAIN_MICRO_BATCH = 8  # train's --micro-batch-size default, for a point that does not set it


def point_problems(inst, nodes, config, train=None, name="the point"):
    """Why a sweep point's train (its configuration, as sweep export-points wrote it) cannot run
    as a job of nodes x GPUs ranks of this instance type, as train itself would refuse it
    (empty: it can). With `train` (this machine's program, for the model's sizes), its memory
    estimate too, as check() makes it."""
    tp = config.get("tensor_model_parallel_size", 1)
    micro = config.get("micro_batch_size", TRAIN_MICRO_BATCH)
    problems = layout_problems(inst, nodes, tp, micro, config.get("global_batch_size"))
    ranks = inst["gpus"] * nodes
    dp = max(1, ranks // tp)
    if config.get("data_parallel_size", dp) != dp:
        problems.append(f"data_parallel_size {config['data_parallel_size']}, but {ranks} ranks at TP {tp} are DP {dp}")
    ramp = config.get("rampup_batch_size")
    if isinstance(ramp, list) and len(ramp) == 3 and any(isinstance(b, int) and b % (micro * dp) for b in ramp[:2]):
        problems.append(f"rampup_batch_size {ramp}: its start and increment are not multiples of micro batch x data "
                        f"parallelism = {micro} x {dp}")
    if train and not problems:
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(config, f)
            f.flush()
            sizes = train_sizes(["--config", f.name], train, f"--config ({name}'s configuration)")
        distributed = bool(config.get("use_distributed_optimizer"))
        if distributed:
            sizes["state_bytes"] = distributed_state_bytes(sizes["state_bytes"], dp)
        problems += memory_problems(inst, nodes, tp, micro, sizes, distributed)[0]
    return problems


def default_bucket_elems(dp):
    """Megatron's default bucket size with overlap (core/train/grad_buckets.cc)."""
    return max(40_000_000, 1_000_000 * dp)


def distributed_state_bytes(state_bytes, dp, from_dp=1):
    """Weights and optimizer state per GPU with the distributed optimizer: of the 18 bytes per
    parameter (bf16 weight, fp32 gradient, fp32 master, two fp32 moments) the master and the
    moments (12) are split over the DP ranks. `state_bytes`: the state as split over `from_dp`
    ranks (1: unsplit)."""
    return state_bytes * (6 + 12 / max(1, dp)) / (6 + 12 / max(1, from_dp))


def scaling(inst, nodes, tp, micro, global_batch, sizes, efficiency, overlap=False, flops_per_token=None,
            tp_collectives_per_layer=4, network_Gbps=None, distributed=False):
    gpus = inst["gpus"] * nodes
    dp = gpus // tp
    N, L, H, S = sizes["params"], sizes["layers"], sizes["hidden"], sizes["seq"]
    tokens = global_batch * S
    flops = (flops_per_token or (6 * N + 12 * L * S * H)) * tokens
    compute = flops / (gpus * inst["peak_tflops"] * 1e12 * efficiency)
    link = inst["gpu_link_GBps"] * 1e9  # bytes/s per GPU inside a node
    micro_batches = global_batch // (micro * dp)  # per rank per step
    tp_bytes = micro * S * H * 2
    tp_time = 0.0 if tp == 1 else micro_batches * L * tp_collectives_per_layer * (2 * (tp - 1) / tp) * tp_bytes / link
    grad_bytes = 4 * N / tp
    if dp == 1:
        dp_time = 0.0
        dp_bw = float("inf")
    else:
        dp_bw = link if nodes == 1 else (network_Gbps or inst["network_Gbps"]) / 8 * 1e9 / inst["gpus"]
        if distributed:  # reduce-scatter of the fp32 gradients, all-gather of the bf16 parameters
            dp_time = ((dp - 1) / dp) * (grad_bytes + grad_bytes / 2) / dp_bw
        else:
            dp_time = (2 * (dp - 1) / dp) * grad_bytes / dp_bw
    exposed = dp_time
    if overlap and dp > 1:
        # buckets of whole parameters; all but the last (the first layers) can hide behind the
        # last micro-batch's backward pass (2/3 of its compute, TP time included)
        buckets = max(1, math.ceil((N / tp) / default_bucket_elems(dp)))
        backward = (compute + tp_time) / max(1, micro_batches) * 2 / 3
        exposed = max(dp_time / buckets, dp_time - backward)
    dp_name = "data-parallel reduce-scatter + all-gather" if distributed else "data-parallel gradient all-reduce"
    terms = {"compute": compute, "tensor-parallel all-reduces": tp_time, dp_name + (" (exposed)" if overlap else ""): exposed}
    # compute and TP time grow with the global batch, the gradient all-reduce does not:
    # a G + b G >= c -> smallest G with compute >= communication
    a, b = compute / global_batch, tp_time / global_batch
    step = micro * dp
    if a <= b:
        busy = None
    else:
        busy = max(step, math.ceil(exposed / (a - b) / step) * step)
    return {"gpus": gpus, "dp": dp, "terms": terms, "step_s": sum(terms.values()), "dp_total_s": dp_time,
            "dominant": max(terms, key=terms.get), "busy_global_batch": busy, "dp_bandwidth_Bps": dp_bw}


# Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM"), Table 1, the rows without pipeline parallelism: GPT, seq 2048, vocabulary
# 51200, on DGX A100 nodes; achieved teraFLOP/s per GPU as published.
PUBLISHED = [
    # (billions of parameters, heads, hidden, layers, TP, GPUs, global batch, TFLOP/s per GPU)
    (1.7, 24, 2304, 24, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 256, 1024, 135),
]
DGX_A100 = {"gpu": "A100", "gpus": 8, "gpu_link": "NVLink", "gpu_link_GBps": 300, "peak_tflops": 312,
            "network_Gbps": 1600}


def validate(overlap=True):
    """Rows of (published, modelled) TFLOP/s per GPU; the GEMM efficiency fitted on row one."""
    def model(row, efficiency):
        _, _, h, l, tp, gpus, batch, _ = row
        s, v = 2048, 51200
        params = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))
        # the paper's FLOPs per token, activation recomputation included (a second forward)
        per_token = 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        sizes = {"params": params, "layers": l, "hidden": h, "seq": s}
        r = scaling(DGX_A100, gpus // 8, tp, 1, batch, sizes, efficiency, overlap=overlap, flops_per_token=per_token,
                    tp_collectives_per_layer=6)
        return per_token * batch * s / (r["step_s"] * gpus) / 1e12, r
    lo, hi = 0.05, 1.0  # efficiency that reproduces row one
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if model(PUBLISHED[0], mid)[0] < PUBLISHED[0][7] else (lo, mid)
    efficiency = (lo + hi) / 2
    rows = []
    for row in PUBLISHED:
        tflops, r = model(row, efficiency)
        rows.append({"params_b": row[0], "tp": row[4], "gpus": row[5], "batch": row[6], "published": row[7],
                     "modelled": tflops, "dominant_comm": max((k for k in r["terms"] if k != "compute"),
                                                              key=r["terms"].get)})
    return efficiency, rows


def positive(kind, at_most=math.inf):
    """An argparse type: a finite number > 0 read with kind (int: a whole number), at most at_most."""
    what = "a whole number >= 1" if kind is int else "a number > 0" + (f" and <= {at_most:g}" if at_most < math.inf else "")

    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            v = None
        if v is None or not (math.isfinite(v) and 0 < v <= at_most):
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'")
        return v
    return parse


def on_ranks(inst, instance_type, nodes, ranks_per_node=None, gpus_per_node=None):
    """The instance as a job of `ranks_per_node` ranks on `gpus_per_node` of a node's GPUs sees it
    (default: all its GPUs, one rank each): the copy whose "gpus" are the ranks a node runs, what
    the checks read; whether those ranks share GPUs (more ranks than GPUs: the per-GPU memory
    estimate, made for one rank per GPU, does not apply); and the job in words."""
    gpus = gpus_per_node or inst["gpus"]
    if gpus > inst["gpus"]:
        sys.exit(f"plan.py: --gpus-per-node {gpus}, but a {instance_type} has {inst['gpus']}")
    per_node = ranks_per_node or gpus
    ranks = per_node * nodes
    if per_node == inst["gpus"] == gpus:
        return dict(inst), False, f"{nodes} x {instance_type} = {ranks} {inst['gpu']}"
    layout = dict(inst, gpus=per_node, unit="ranks", node_gpus=inst["gpus"])
    where = f"{nodes} x {instance_type} at {per_node} ranks per node = {ranks} ranks"
    if per_node > gpus:
        return layout, True, where + f" sharing {gpus} {inst['gpu']} per node (the layout only: the memory " \
            "estimate is for one rank per GPU)"
    return layout, False, where + f" on {ranks} {inst['gpu']}"


def check_sweep(inst, instance_type, nodes, sweep, train=None, ranks_per_node=None, gpus_per_node=None):
    """plan.py check-sweep: every point of a sweep checked as a job of nodes x ranks_per_node
    ranks on gpus_per_node GPUs a node (on_ranks), layout and memory (point_problems; the layout
    alone where ranks share GPUs); 1 where one does not fit. `sweep`: the runs directory of a sweep that sweep
    export-points wrote (its sweep.json), or a sweep file, exported here first into a directory of
    its own (by the sweep program beside `train`, with --ranks: its refusals too)."""
    train = train or TRAIN
    layout, shared, where = on_ranks(inst, instance_type, nodes, ranks_per_node, gpus_per_node)
    ranks = layout["gpus"] * nodes
    if not sweep:
        sys.exit("plan.py check-sweep: give --sweep (a sweep file, or the directory sweep export-points wrote)")
    if os.path.isfile(sweep):
        with tempfile.TemporaryDirectory() as runs:
            out = subprocess.run([os.path.join(os.path.dirname(train), "sweep"), "export-points", sweep, "--runs-dir",
                                  runs, "--ranks", str(ranks)], capture_output=True, text=True)
            if out.returncode != 0:
                print(out.stderr.strip() or out.stdout.strip())
                return 1
            return check_sweep(inst, instance_type, nodes, out.stdout.strip().split("/points.txt: ")[0], train,
                               ranks_per_node, gpus_per_node)
    path = os.path.join(sweep, "sweep.json")
    try:
        with open(path) as f:
            points = json.load(f)["points"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"plan.py: {path}: {e!r}; export the sweep first (sweep export-points FILE --runs-dir DIR)")
    misfits = [(p["id"], problems) for p in points
               if (problems := point_problems(layout, nodes, p.get("config", {}), None if shared else train, p["id"]))]
    if misfits:
        print(f"{len(misfits)} of {len(points)} point(s) do not fit {where}:")
        for point, problems in misfits:
            print(f"  {point}: {'; '.join(problems)}")
        return 1
    print(f"all {len(points)} point(s) fit {where}")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["check", "check-sweep", "scaling", "validate"])
    p.add_argument("--sweep", help="check-sweep: a sweep file, or the runs directory sweep export-points wrote")
    p.add_argument("--instance")
    p.add_argument("--nodes", type=positive(int), default=1)
    p.add_argument("--ranks-per-node", type=positive(int), help="check, check-sweep, scaling: the ranks a node runs "
                   "(default: one per GPU; more than its GPUs share them, and only the layout is checked)")
    p.add_argument("--gpus-per-node", type=positive(int), help="check, check-sweep, scaling: the GPUs of a node the "
                   "job uses (default: all of the instance type's)")
    p.add_argument("--model")
    p.add_argument("--tp", type=positive(int), default=1)
    p.add_argument("--micro-batch", type=positive(int), default=8)
    p.add_argument("--global-batch", type=positive(int))
    p.add_argument("--efficiency", type=positive(float, at_most=1.0), default=0.4,
                   help="achieved fraction of peak FLOP/s (default 0.4)")
    for k in ["params", "layers", "hidden", "seq"]:
        p.add_argument(f"--{k}", type=positive(int))
    p.add_argument("--state-bytes", type=positive(float), help="per-rank bytes of weights + optimizer state")
    p.add_argument("--act-bytes", type=positive(float), help="per-rank activation bytes per sample")
    p.add_argument("--train", help="the train program (default: ../build/bin/train)")
    p.add_argument("--overlap-grad-reduce", action="store_true", help="gradient buckets overlap the backward pass")
    p.add_argument("--use-distributed-optimizer", action="store_true", help="fp32 masters and Adam moments sharded over DP")
    a = p.parse_args(argv)
    if a.command == "validate":
        efficiency, rows = validate()
        print("Megatron-LM GPT weak scaling (Narayanan et al. 2021, Table 1, no pipeline parallelism) on DGX A100, "
              f"against this model with overlapped gradient buckets; GEMM efficiency {efficiency:.3f} fitted on the "
              "first row:")
        print(f"| params | TP | GPUs | batch | published TFLOP/s/GPU | modelled | modelled / published | largest communication |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for r in rows:
            print(f"| {r['params_b']}B | {r['tp']} | {r['gpus']} | {r['batch']} | {r['published']} | {r['modelled']:.0f} | "
                  f"{r['modelled'] / r['published']:.2f} | {r['dominant_comm']} |")
        return 0
    if not a.instance:
        sys.exit("plan.py: give --instance")
    table = instances()
    if a.instance not in table:
        sys.exit(f"plan.py: unknown instance type '{a.instance}'; known: {', '.join(sorted(table))}")
    if a.command == "check-sweep":
        return check_sweep(table[a.instance], a.instance, a.nodes, a.sweep, a.train, a.ranks_per_node,
                           a.gpus_per_node)
    inst, shared, where = on_ranks(table[a.instance], a.instance, a.nodes, a.ranks_per_node, a.gpus_per_node)
    if shared:
        if a.command == "scaling":
            sys.exit(f"plan.py scaling: more ranks per node ({a.ranks_per_node}) than GPUs; the "
                     "model is for one rank per GPU")
        problems = layout_problems(inst, a.nodes, a.tp, a.micro_batch, a.global_batch)
        print(where)
        for pr in problems:
            print("does not fit: " + pr)
        return 1 if problems else 0
    if a.model:
        sizes = model_sizes(a.model, a.tp, a.train)
        if a.use_distributed_optimizer:
            sizes["state_bytes"] = distributed_state_bytes(sizes["state_bytes"], inst["gpus"] * a.nodes // a.tp)
    else:
        missing = [k for k in ["params", "layers", "hidden", "seq", "state_bytes", "act_bytes"] if getattr(a, k) is None]
        if missing:
            sys.exit(f"plan.py: give --model, or --{' --'.join(m.replace('_', '-') for m in missing)}")
        sizes = {"params": a.params, "layers": a.layers, "hidden": a.hidden, "seq": a.seq,
                 "state_bytes": a.state_bytes, "act_bytes": a.act_bytes}
    problems, memory = check(inst, a.nodes, a.tp, a.micro_batch, a.global_batch, sizes, a.use_distributed_optimizer)
    gpus = inst["gpus"] * a.nodes
    print(f"{where}; TP {a.tp} x DP {max(1, gpus // a.tp)}; "
          f"memory estimate {memory / 2**30:.1f} of {inst['gpu_memory_GiB']} GiB per GPU")
    if problems:
        for pr in problems:
            print("does not fit: " + pr)
        return 1
    if a.command == "scaling":
        if not a.global_batch:
            sys.exit("plan.py scaling: give --global-batch")
        r = scaling(inst, a.nodes, a.tp, a.micro_batch, a.global_batch, sizes, a.efficiency, overlap=a.overlap_grad_reduce,
                    distributed=a.use_distributed_optimizer)
        how = ("gradient buckets overlapped with the backward pass: " f"{r['dp_total_s'] * 1e3:.2f} ms of DP communication"
               if a.overlap_grad_reduce else "no overlap of communication with compute")
        print(f"step time estimate {r['step_s'] * 1e3:.1f} ms ({how}):")
        for k, v in r["terms"].items():
            print(f"  {k:36s} {v * 1e3:10.2f} ms")
        print(f"dominant: {r['dominant']}")
        if r["busy_global_batch"]:
            print(f"smallest global batch with compute >= communication: {r['busy_global_batch']}")
        else:
            print("tensor-parallel traffic alone exceeds compute at any global batch: lower TP")
        print(f"assumptions: {a.efficiency:.0%} of {inst['peak_tflops']} TFLOP/s {inst['precision']} peak per GPU; "
              f"TP all-reduces over {inst['gpu_link']} at {inst['gpu_link_GBps']} GB/s per GPU; DP communication "
              f"over {'EFA at ' + str(inst['network_Gbps']) + ' Gbit/s per node shared by ' + str(inst['gpus']) + ' GPUs' if a.nodes > 1 else inst['gpu_link']}; "
              f"ring collectives, fp32 gradients, bf16 activations, "
              f"{'fp32 gradients reduce-scattered and bf16 parameters all-gathered, ' if a.use_distributed_optimizer else ''}"
              f"{'bucket overlap' if a.overlap_grad_reduce else 'no overlap'}")
    else:
        print("fits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
