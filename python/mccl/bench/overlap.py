"""How much communication hides behind backward compute: the paper's Fig. 3 (right).

A synthetic training step has ``--buckets`` gradient buckets of ``--bucket-mb`` MiB (DDP's
``bucket_cap_mb`` unit; 25 by default, as in DDP and the paper). "Backward" for each bucket is a
fixed number of ``--matmul`` x ``--matmul`` matrix products, calibrated on rank 0 to last
``--compute-ms`` and then identical on every rank, whose result is written into the bucket. The
step is timed four ways, the modes interleaved step by step so that drifting machine load
touches all of them alike:

- ``compute``: the buckets' compute only;
- ``comm``: all buckets' all-reduces only, all issued asynchronously, then waited for;
- ``overlap``: DDP-style: each bucket's all-reduce is issued asynchronously as soon as its
  compute is done, and all are waited for at the end of the step;
- ``serial``: each bucket's compute, then its blocking all-reduce.

A step's time is the slowest rank's, after a barrier on the control group; the table shows the
median over ``--steps`` steps. ``hidden = (compute + comm - overlap) / comm``: the share of the
communication time that the overlapped step did not add to the compute time (100% when the
step costs no more than its compute, 0% when it costs as much as the serialized step).

With ``--device cuda`` the compute runs on the GPU (rank r on CUDA device
LOCAL_RANK % device_count) and the buckets live there too: each bucket's all-reduce is issued on
the GPU tensor right after the kernels that write it were queued (the backend orders itself after
them on the stream, as DDP relies on), and every step ends with ``torch.cuda.synchronize()``, so
it lasts until the results are on the device. "Backward done" is then when the last bucket's
kernels finished on the GPU (CUDA events), not when the host queued them.
``--stage-to-cpu`` keeps the buckets in host memory instead: each finished bucket is copied to
its CPU bucket (the copy waits for the kernels) before its all-reduce, the staging a CPU-only
backend needs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch
import torch.distributed as dist

from .. import _cli
from . import runtime

MODES = ("compute", "comm", "overlap", "serial")


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("synthetic step")
    g.add_argument("--buckets", type=_cli.int_at_least(1), default=18,
                   help="gradient buckets per step (the paper's ViT: 18)")
    g.add_argument("--bucket-mb", type=_cli.number_at_least(0, above=True, what="size in MiB"), default=25.0,
                   help="bucket size in MiB (memory: buckets x this per rank)")
    g.add_argument("--compute-ms", type=_cli.number_at_least(0, above=True, what="number of ms"), default=60.0,
                   help="compute per bucket, in ms (calibrated on rank 0)")
    g.add_argument("--matmul", type=_cli.int_at_least(1), default=256,
                   help="side of the square matrices the compute multiplies")
    g.add_argument("--device", default="cpu", choices=list(runtime.DEVICES),
                   help="where the compute runs and (unless --stage-to-cpu) where the buckets live and are "
                        "all-reduced; cuda: device LOCAL_RANK %% device_count")
    g.add_argument("--stage-to-cpu", action="store_true",
                   help="with --device cuda: copy each finished bucket to a CPU tensor and all-reduce that "
                        "(what a CPU-only backend needs; the old behaviour); no effect with --device cpu")
    g.add_argument("--steps", type=_cli.int_at_least(1), default=5, help="timed steps per mode")
    g.add_argument("--warmup-steps", type=_cli.int_at_least(0), default=1, help="untimed steps per mode first")
    g.add_argument("--json", type=_cli.output_file, default=None, help="write the results and metadata to this file (rank 0)")
    g.add_argument("--plot", type=_cli.output_file, default=None, help="write a PNG bar chart like the paper's Fig. 3 right (rank 0)")


class Step:
    """The buckets and the calibrated compute of one rank."""

    def __init__(self, args, groups: runtime.Groups, dev: torch.device | None = None):
        self.args = args
        self.dev = dev or runtime.rank_device(args.device)
        #: Buckets in host memory, each filled from the device's ``grad`` (--stage-to-cpu).
        self.staged = self.dev.type != "cpu" and args.stage_to_cpu
        #: Buckets on the accelerator, all-reduced there: backward's end is timed with events.
        self.on_device = self.dev.type != "cpu" and not self.staged
        numel = int(args.bucket_mb * 2 ** 20) // 4
        bucket_dev = torch.device("cpu") if self.staged else self.dev
        self.buckets = [torch.zeros(numel, device=bucket_dev) for _ in range(args.buckets)]
        m = args.matmul
        gen = torch.Generator().manual_seed(0)
        self.a = (torch.randn(m, m, generator=gen) / m).to(self.dev)
        self.b = torch.randn(m, m, generator=gen).to(self.dev)
        self.grad = torch.zeros(numel, device=self.dev) if self.staged else None
        self.reps, self.calibrated_ms = self._calibrate(groups)

    def _sync(self) -> None:
        runtime.sync(self.dev)

    def _calibrate(self, groups: runtime.Groups) -> tuple[int, float]:
        """Matmuls per bucket for --compute-ms, measured on rank 0 and the same on every rank, and
        the ms they took there (at least one matmul, so a tiny target can be exceeded)."""
        reps = [1, 0.0]
        if groups.rank == 0:
            for _ in range(3):
                self._matmuls(5)
            self._sync()
            t0 = time.perf_counter()
            n = 20
            self._matmuls(n)
            self._sync()
            per = (time.perf_counter() - t0) / n
            reps[0] = max(1, round(self.args.compute_ms / 1000 / per))
            reps[1] = reps[0] * per * 1e3
        dist.broadcast_object_list(reps, src=0, group=groups.control)
        return reps[0], reps[1]

    def _matmuls(self, n: int) -> torch.Tensor:
        c = self.a
        for _ in range(n):
            c = torch.mm(c, self.b)
            c = c / c.abs().max().clamp_min(1.0)  # keep values finite, the work the same
        return c

    def compute(self, k: int) -> None:
        """Bucket k's "backward": its matmuls, written into the bucket (queued on the GPU when the
        buckets live there; with --stage-to-cpu copied to the host, which waits for the kernels)."""
        c = self._matmuls(self.reps).view(-1)
        bucket = self.buckets[k]
        if self.staged:
            self.grad[:c.numel()].copy_(c[:self.grad.numel()])
            bucket.copy_(self.grad)  # device -> host: waits for the kernels, as a staged CPU backend must
        else:
            bucket[:c.numel()].copy_(c[:bucket.numel()])


def run_mode(mode: str, step: Step, group, t0: float) -> float:
    """Runs one step in ``mode``, begun at ``t0`` (time.perf_counter()). In ``overlap`` mode,
    returns the seconds from ``t0`` to the end of the last bucket's compute (this rank's backward
    is done, its all-reduces may still run; with the buckets on the GPU, when its kernels finished
    there); 0 in the other modes. Every mode ends when the results are on the device."""
    k_all = range(len(step.buckets))
    if mode == "compute":
        for k in k_all:
            step.compute(k)
    elif mode == "comm":
        works = [dist.all_reduce(step.buckets[k], group=group, async_op=True) for k in k_all]
        for w in works:
            w.wait()
    elif mode == "overlap":
        works = []
        if step.on_device:  # the previous step ended synchronized: the GPU is idle, `start` runs now
            t_start = time.perf_counter() - t0
            start, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        for k in k_all:
            step.compute(k)
            works.append(dist.all_reduce(step.buckets[k], group=group, async_op=True))
        if step.on_device:
            done.record()  # on the compute stream: after the last bucket's kernels
        backward_done = time.perf_counter() - t0
        for w in works:
            w.wait()  # with GPU buckets: the current stream waits for the result
        step._sync()
        if step.on_device:
            backward_done = t_start + start.elapsed_time(done) / 1e3
        return backward_done
    elif mode == "serial":
        for k in k_all:
            step.compute(k)
            dist.all_reduce(step.buckets[k], group=group)
    step._sync()
    return 0.0


def summarize(times: dict, parts: list[tuple[float, float]], world: int = 2) -> dict:
    """``parts``: per overlapped step, when the first and the last rank finished backward
    (seconds from the step's start, from :func:`run_mode`).

    The split is that of one step, the overlapped step of median time (the lower middle one of an
    even count), so that its parts add up: backward done (when the last rank finished its
    compute) + tail (the all-reduces still running after that) = that step's time. Against the
    compute-alone median, backward done - compute is the compute's slowdown beside
    communication (negative when that step's compute happened to run faster: the compute alone
    varies from step to step too). ``rank_skew_s`` is how much earlier the first rank finished
    backward than the last. The ranks' clocks start at the step's barrier, which they leave
    within about a millisecond of each other, so small tails are uncertain by that much."""
    med = {m: statistics.median(times[m]) for m in MODES}
    comm = med["comm"]
    # One rank communicates nothing: its "comm" is the call overhead, and a share of it is noise.
    hidden = 100 * (med["compute"] + comm - med["overlap"]) / comm if comm > 0 and world > 1 else None
    k = times["overlap"].index(statistics.median_low(times["overlap"]))
    first, last = parts[k]
    return {"median_s": med, "mean_s": {m: statistics.fmean(times[m]) for m in MODES}, "steps_s": times,
            "hidden_pct": hidden, "exposed_comm_s": med["overlap"] - med["compute"],
            "overhead_pct": 100 * (med["overlap"] - med["compute"]) / med["compute"],
            "split_step_s": times["overlap"][k], "backward_done_s": last, "compute_slowdown_s": last - med["compute"],
            "rank_skew_s": last - first, "overlap_tail_s": times["overlap"][k] - last}


def main(args) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    torch.set_num_threads(args.threads)
    backends = runtime.split_backends(args.backends)
    dev = runtime.rank_device(args.device)
    groups = runtime.init_groups(backends, args.pg_timeout)
    step = Step(args, groups, dev)
    meta = runtime.run_metadata(groups, backends)
    meta.update({"buckets": args.buckets, "bucket_mib": args.bucket_mb, "matmuls_per_bucket": step.reps,
                 "compute_ms_target": args.compute_ms, "compute_ms_calibrated": step.calibrated_ms,
                 "device": args.device, "matmul": args.matmul, "stage_to_cpu": step.staged,
                 "buckets_device": step.buckets[0].device.type})
    meta.update(runtime.device_meta(dev, groups))
    rank0 = groups.rank == 0
    if rank0:
        print(f"# mccl.bench overlap: {groups.world} ranks, {args.buckets} buckets x {args.bucket_mb:g} MiB, "
              f"{step.reps} matmuls ({args.matmul}x{args.matmul}, {args.device}) per bucket, {step.calibrated_ms:.1f} ms "
              f"when rank 0 calibrated them (target {args.compute_ms:g} ms), {args.threads} thread(s); load average "
              f"{meta['loadavg_start'][0]:.2f}", flush=True)
        where = ("in host memory, each copied there from the GPU before its all-reduce (--stage-to-cpu)" if step.staged
                 else f"on {dev.type}, all-reduced there" if step.on_device else "in host memory")
        print(f"# buckets {where}", flush=True)
        for line in runtime.cluster_lines(meta):
            print(line, flush=True)
        if dev.type != "cpu":
            print(runtime.device_line(meta), flush=True)
    results = {}
    for backend in backends:
        group = groups.by_backend[backend]
        times = {m: [] for m in MODES}
        parts = []
        for i in range(args.warmup_steps + args.steps):
            for mode in MODES:
                dist.barrier(group=groups.control)
                t0 = time.perf_counter()
                backward_done = run_mode(mode, step, group, t0)
                # The slowest rank sets the step's time. The ranks left the barrier within well
                # under a millisecond of each other, so their times from t0 compare.
                got = runtime.gather_objects((time.perf_counter() - t0, backward_done), groups)
                if i >= args.warmup_steps:
                    times[mode].append(max(e for e, _ in got))
                    if mode == "overlap":
                        parts.append((min(b for _, b in got), max(b for _, b in got)))
        results[backend] = summarize(times, parts, groups.world)
        if rank0:
            r = results[backend]
            print(f"# {backend}: " + ", ".join(f"{m} {r['median_s'][m] * 1e3:.1f} ms" for m in MODES)
                  + ("; hidden -" if r["hidden_pct"] is None else f"; hidden {r['hidden_pct']:.1f}%"), flush=True)
    if rank0:
        print_table(results, groups.world)
        if args.json:
            runtime.write_json(args.json, {"meta": meta, "results": results})
            print(f"# wrote {args.json}")
        if args.plot:
            plot(results, meta, args.plot)
            print(f"# wrote {args.plot}")
    dist.barrier(group=groups.control)
    dist.destroy_process_group()
    return 0


def print_table(results: dict, world: int) -> None:
    from rich.table import Table

    from .report import console

    t = Table(title=f"overlap: median step time over ranks ({world} ranks)", title_justify="left")
    for col in ("backend", "compute (ms)", "comm (ms)", "overlapped (ms)", "serialized (ms)", "exposed comm (ms)",
                "hidden %", "overhead vs compute %", "backward done (ms)", "rank skew (ms)", "tail (ms)"):
        t.add_column(col, justify="right")
    for b, r in results.items():
        med = r["median_s"]
        t.add_row(b, *(f"{med[m] * 1e3:.1f}" for m in MODES), f"{r['exposed_comm_s'] * 1e3:.1f}",
                  "-" if r["hidden_pct"] is None else f"{r['hidden_pct']:.1f}", f"{r['overhead_pct']:.1f}",
                  f"{r['backward_done_s'] * 1e3:.1f}", f"{r['rank_skew_s'] * 1e3:.1f}", f"{r['overlap_tail_s'] * 1e3:.1f}")
    console().print(t)
    console().print("# hidden = (compute + comm - overlapped) / comm (negative: the overlapped step took longer than "
                    "compute and communication one after the other); overhead = (overlapped - compute) / compute")
    for b, r in results.items():
        med = r["median_s"]
        if r["hidden_pct"] is None:
            console().print(f"# {b}: hidden % is '-': one rank has nothing to communicate")
        elif med["comm"] < 0.1 * med["compute"]:
            console().print(f"# WARNING {b}: communication ({med['comm'] * 1e3:.1f} ms) is under a tenth of the "
                            f"compute ({med['compute'] * 1e3:.1f} ms): the compute's step-to-step noise decides "
                            f"hidden %; use more or larger buckets")
    console().print("# split of the overlapped step of median time: backward done = when the last rank finished its "
                    "compute; rank skew = how much earlier the first rank did; tail = that step's time - backward "
                    "done (communication left once every rank had issued its last bucket; ideally about one "
                    "bucket's all-reduce). With an odd --steps, exposed comm = (backward done - compute) + tail")


def plot(results: dict, meta: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.8 + 2.2 * len(results), 4))
    width = 0.2
    labels = ["compute only", "communication only", "overlapped (DDP-style)", "serialized"]
    for j, mode in enumerate(MODES):
        xs = [i + (j - 1.5) * width for i in range(len(results))]
        ax.bar(xs, [r["median_s"][mode] for r in results.values()], width, label=labels[j])
    for i, r in enumerate(results.values()):
        if r["hidden_pct"] is not None:
            ax.annotate(f"{r['hidden_pct']:.0f}% hidden", (i, max(r["median_s"].values())), ha="center",
                        va="bottom", fontsize=9)
    ax.set_xticks(range(len(results)), [f"{b}, N={meta['world_size']}" for b in results])
    ax.set_ylabel("step time (s)")
    where = "staged to CPU" if meta.get("stage_to_cpu") else f"on {meta.get('buckets_device', 'cpu')}"
    ax.set_title(f"{meta['buckets']} x {meta['bucket_mib']:g} MiB buckets {where}, {meta['device']} compute")
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
