"""Collective benchmarks with nccl-tests' table: all-reduce, all-gather, reduce-scatter, broadcast,
all-to-all, for several backends side by side in the same processes.

Sizes and bandwidths follow nccl-tests (NVIDIA/nccl-tests, doc/PERFORMANCE.md): ``size`` S is the
whole array in bytes (for all-gather and reduce-scatter n x the per-rank block, for all-to-all
the bytes each rank sends including its own block), ``algbw = S / t`` in GB/s (1e9 B/s), and
``busbw = algbw x factor`` with factor 2(n-1)/n for all-reduce, (n-1)/n for all-gather,
reduce-scatter and all-to-all, and 1 for broadcast. busbw of an ideal algorithm does not depend on
n, so it is compared with the single-stream TCP goodput measured in the same run.

For each (collective, size, backend) a rank runs, in order:

1. a **check pass** (not timed): integer-valued inputs small enough that every reduction is exact in
   the dtype, one call, and a comparison of every output element with the exactly computed
   expectation; ``#wrong`` is the number of differing elements summed over all ranks;
2. ``--warmup`` untimed iterations, then a barrier on the control group (gloo);
3. the timed iterations, back to back, each a blocking call; iteration k on a rank lasts from the
   end of iteration k-1 (or the barrier) to its own end, and its time is the slowest rank's;
   ``time`` is the median over iterations (the mean is reported too, and in the JSON), and
   ``time_loop`` is nccl-tests' figure, the slowest rank's whole timed loop over the number of
   iterations: the period the backend sustains back to back, in which one slow iteration on one
   rank counts once rather than as that iteration's maximum (in the JSON, with ``busbw_loop``,
   and with ``--rounds`` in the every-round table, beside the median: when the slowest rank
   changes from iteration to iteration, each iteration's maximum is long while the loop is not,
   and bench/late_rank.py shows which rank it was);
4. CPU use over the timed interval (the backend's engine threads when they have a name, else
   the whole process) and memory: peak RSS (VmHWM, reset before the warm-up) and ``+RSS``, the
   peak minus the RSS just before the warm-up, when the tensors were already resident: what the
   backend itself needed on top of the process and the tensors (the JSON's ``per_rank.rss_grown``
   names the mappings of /proc/self/smaps that grew most from then to the end of the timing).

``--skew-ms N`` delays rank ``--skew-rank`` by a random 0..N ms before every warm-up and timed
iteration, so its neighbours run ahead (the parking/credits memory test); times then include the
delays.

``--device cuda`` puts the tensors under test on the GPU (rank r on CUDA device
LOCAL_RANK % device_count, so ranks may share one): the check pass copies each output to the CPU
to compare it, and every timed iteration ends with ``torch.cuda.synchronize()``, so its time runs
until the result is usable on the device (a backend whose call returns before the data is there,
ordered on the stream, is charged for the whole transfer). Where a backend other than mccl
refuses a collective on CUDA tensors (gloo has no CUDA reduce-scatter, for one) the row says
``unsupported`` instead of failing the run; mccl refusing one is an error.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from .. import _cli
from . import report, runtime

KIB = 1024

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64, "int8": torch.int8,
          "uint8": torch.uint8}
#: Largest integer every value up to which the dtype holds exactly (and which sums may reach).
EXACT_LIMIT = {torch.float32: 2 ** 24, torch.float64: 2 ** 53, torch.float16: 2 ** 11, torch.bfloat16: 2 ** 8,
               torch.int32: 2 ** 31 - 1, torch.int64: 2 ** 63 - 1, torch.int8: 127, torch.uint8: 255}
REDOPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
CHECK_CHUNK = 1 << 20  # elements per step of the check pass (bounds its temporary memory)
#: What torch's backends say when they refuse a collective for a device type or dtype (gloo:
#: "ProcessGroupGloo::reduce_scatter: unsupported device type cuda"; c10d: "No backend type
#: associated with device type cuda"; ...).
REFUSAL = re.compile(r"unsupported|not supported|does not support|not implemented|no backend type associated|"
                     r"only supports", re.IGNORECASE)


class Unsupported(Exception):
    """The backend refused the collective when it was called (before any byte moved)."""


def refusal(exc: BaseException) -> str | None:
    """The first line of ``exc`` when it reads as a backend refusing the call, else None."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, NotImplementedError) or REFUSAL.search(text):
        return text or type(exc).__name__
    return None


@dataclass(frozen=True)
class Collective:
    """One benchmarked collective: its nccl-tests busbw factor and how to run and check it."""

    name: str
    factor: Callable[[int], float]
    reduces: bool
    rooted: bool
    #: the array is split into n blocks (its count is rounded down to a multiple of n)
    split: bool
    #: (count, n) -> (input elements, output elements or 0 when in place); count divisible by n
    shapes: Callable[[int, int], tuple[int, int]]
    #: (rank, n, count, root) -> [(output offset, length, [(source rank, source offset), ...])]
    expected: Callable[[int, int, int, int], list]


def _per_rank_segments(rank, n, count, *, blocks_from_rank: bool):
    c = count // n
    # all-gather: block s of the output is rank s's whole input; all-to-all: block s is rank s's
    # block number `rank`.
    return [(s * c, c, [(s, 0 if blocks_from_rank else rank * c)]) for s in range(n)]


COLLECTIVES = {
    "all_reduce": Collective("all_reduce", lambda n: 2 * (n - 1) / n, True, False, False,
                             lambda count, n: (count, 0),
                             lambda r, n, count, root: [(0, count, [(s, 0) for s in range(n)])]),
    "all_gather": Collective("all_gather", lambda n: (n - 1) / n, False, False, True,
                             lambda count, n: (count // n, count),
                             lambda r, n, count, root: _per_rank_segments(r, n, count, blocks_from_rank=True)),
    "reduce_scatter": Collective("reduce_scatter", lambda n: (n - 1) / n, True, False, True,
                                 lambda count, n: (count, count // n),
                                 lambda r, n, count, root: [(0, count // n, [(s, r * (count // n)) for s in range(n)])]),
    "broadcast": Collective("broadcast", lambda n: 1.0, False, True, False,
                            lambda count, n: (count, 0),
                            lambda r, n, count, root: [(0, count, [(root, 0)])]),
    "all_to_all": Collective("all_to_all", lambda n: (n - 1) / n, False, False, True,
                             lambda count, n: (count, count),
                             lambda r, n, count, root: _per_rank_segments(r, n, count, blocks_from_rank=False)),
}
ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
           "bcast": "broadcast", "alltoall": "all_to_all"}


def run_op(coll: Collective, group, inp: torch.Tensor, out: torch.Tensor | None, redop, root: int) -> None:
    """One blocking call of ``coll`` on ``group`` (``root`` is a group rank)."""
    if coll.name == "all_reduce":
        dist.all_reduce(inp, op=redop, group=group)
    elif coll.name == "all_gather":
        dist.all_gather_into_tensor(out, inp, group=group)
    elif coll.name == "reduce_scatter":
        dist.reduce_scatter_tensor(out, inp, op=redop, group=group)
    elif coll.name == "broadcast":
        dist.broadcast(inp, src=dist.get_global_rank(group, root), group=group)
    elif coll.name == "all_to_all":
        dist.all_to_all_single(out, inp, group=group)


def pattern_modulus(dtype: torch.dtype, n: int, reduces: bool) -> int:
    """Values are 0..M-1: for sums, n x (M-1) must stay exact in ``dtype``; at most 61."""
    limit = EXACT_LIMIT[dtype] // n if reduces else EXACT_LIMIT[dtype]
    return max(2, min(61, limit + 1))


def pattern(source: int, start: int, length: int, modulus: int, dtype: torch.dtype) -> torch.Tensor:
    """Element i of rank ``source``'s input is (i + 7 * source) mod M: integers, different per rank
    and position, so a misplaced block or a wrong sum shows."""
    idx = torch.arange(start, start + length, dtype=torch.int64)
    return ((idx + 7 * source) % modulus).to(dtype)


def fill_pattern(t: torch.Tensor, source: int, modulus: int) -> None:
    """Writes :func:`pattern` into ``t`` (on any device) chunk by chunk."""
    for i in range(0, t.numel(), CHECK_CHUNK):
        k = min(CHECK_CHUNK, t.numel() - i)
        t[i:i + k].copy_(pattern(source, i, k, modulus, t.dtype))


def _reduce(a: torch.Tensor, b: torch.Tensor, redop: str) -> torch.Tensor:
    if redop == "sum":
        return a + b
    return torch.maximum(a, b) if redop == "max" else torch.minimum(a, b)


def count_wrong(coll: Collective, result: torch.Tensor, rank: int, n: int, count: int, root: int, redop: str,
                modulus: int) -> int:
    """Elements of ``result`` (this rank's output, on any device) that differ from the exact
    expectation; the comparison runs on the CPU, chunk by chunk."""
    wrong = 0
    for out_off, length, sources in coll.expected(rank, n, count, root):
        for i in range(0, length, CHECK_CHUNK):
            k = min(CHECK_CHUNK, length - i)
            want = None
            for src, src_off in sources:
                part = pattern(src, src_off + i, k, modulus, result.dtype)
                want = part if want is None else _reduce(want, part, redop)
            wrong += int((result[out_off + i:out_off + i + k].cpu() != want).sum())
    return wrong


def check_pass(coll: Collective, group, inp, out, rank, n, count, root, redop: str) -> int:
    """One exact call; returns this rank's #wrong. Raises :class:`Unsupported` when the backend
    refuses the call itself (every rank refuses alike, so none waits for the others)."""
    modulus = pattern_modulus(inp.dtype, n, coll.reduces)
    fill_pattern(inp, rank, modulus)
    if out is not None:  # a value no result has, so an output the call never wrote shows
        out.fill_(255 if inp.dtype == torch.uint8 else -1)
    try:
        run_op(coll, group, inp, out, REDOPS[redop], root)
    except Exception as exc:
        if reason := refusal(exc):
            raise Unsupported(reason) from exc
        raise
    runtime.sync(inp.device)
    return count_wrong(coll, inp if out is None else out, rank, n, count, root, redop, modulus)


def parse_size(text: str) -> int:
    """``1K``, ``256M``, ``1G`` (powers of 1024) or plain bytes: at least 1. Raises
    argparse.ArgumentTypeError (a ValueError) naming the text otherwise."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": KIB, "M": KIB ** 2, "G": KIB ** 3}.get(t[-1:], 1)
    try:
        size = int(float(t[:-1] if mult > 1 else t) * mult)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"size {text!r}: expected bytes such as 4096, 64K, 256M, 1G") from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"size {text!r}: must be at least 1 byte")
    return size


def parse_sizes(text: str) -> list[int]:
    """``--sizes``: comma-separated sizes (see :func:`parse_size`), at least one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("--sizes: give one or more sizes, e.g. 1K,1M,64M")
    return [parse_size(s) for s in text.split(",")]


def size_list(args) -> list[int]:
    if args.sizes:
        return args.sizes
    lo, hi, f = args.minbytes, args.maxbytes, args.stepfactor
    if hi < lo:
        raise SystemExit(f"-b/--minbytes {lo} is above -e/--maxbytes {hi}")
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= f
    return sizes


def iterations(args, size: int) -> int:
    """``--iters`` when given, else enough to move ``--bytes-per-size`` bytes, clamped."""
    if args.iters:
        return args.iters
    return max(args.min_iters, min(args.max_iters, int(args.bytes_per_size // max(size, 1))))


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to measure")
    g.add_argument("--ops", default=",".join(COLLECTIVES),
                   help="comma-separated collectives (all_reduce, all_gather, reduce_scatter, broadcast, all_to_all)")
    g.add_argument("-b", "--minbytes", type=parse_size, default="1K", help="smallest size S (bytes; K, M, G suffixes)")
    g.add_argument("-e", "--maxbytes", type=parse_size, default="256M", help="largest size S")
    g.add_argument("-f", "--stepfactor", type=_cli.int_at_least(2), default=2, help="multiply the size by this each step")
    g.add_argument("--sizes", type=parse_sizes, default=None, help="explicit comma-separated sizes, instead of -b/-e/-f")
    g.add_argument("--dtype", default="float32", choices=list(DTYPES), help="element type")
    g.add_argument("--op", dest="redop", default="sum", choices=list(REDOPS), help="reduction of all_reduce/reduce_scatter")
    g.add_argument("--root", type=int, default=0, help="broadcast root")
    g.add_argument("--device", default="cpu", choices=list(runtime.DEVICES),
                   help="where the tensors under test live (cuda: device LOCAL_RANK %% device_count; the check "
                        "compares on the CPU, every timed iteration ends with torch.cuda.synchronize())")
    g = p.add_argument_group("iterations")
    g.add_argument("--rounds", type=_cli.int_at_least(1), default=1,
                   help="measure everything this many times, the backends alternating round by round; "
                        "tables show each size's median round, and every round with the spread")
    g.add_argument("-w", "--warmup", type=_cli.int_at_least(0), default=3, help="untimed iterations before timing")
    g.add_argument("-n", "--iters", type=_cli.int_at_least(1), default=None,
                   help="timed iterations per size (default: scaled by size, see --bytes-per-size)")
    g.add_argument("--bytes-per-size", type=parse_size, default="1G",
                   help="scaled iterations move about this many bytes of S")
    g.add_argument("--min-iters", type=_cli.int_at_least(1), default=5, help="scaled iterations: at least this many")
    g.add_argument("--max-iters", type=_cli.int_at_least(1), default=200, help="scaled iterations: at most this many")
    g.add_argument("--skew-ms", type=_cli.number_at_least(0, what="number of ms"), default=0.0,
                   help="delay --skew-rank by a random 0..N ms before every iteration (parking/credits test)")
    g.add_argument("--skew-rank", type=int, default=-1, help="the delayed rank (-1: the last)")
    g = p.add_argument_group("output (rank 0)")
    g.add_argument("--json", type=_cli.output_file, default=None, help="write every result and the run's metadata to this file")
    g.add_argument("--plot", type=_cli.output_file, default=None, help="write a PNG of busbw vs size per collective, goodput line")
    g.add_argument("--quiet", action="store_true", help="no line per finished size while running")
    runtime.add_goodput_args(p)


def resolve_ops(text: str) -> list[Collective]:
    ops = []
    for name in text.split(","):
        name = ALIASES.get(name.strip(), name.strip())
        if name not in COLLECTIVES:
            raise SystemExit(f"--ops: unknown collective {name!r}; choose from {', '.join(COLLECTIVES)}")
        ops.append(COLLECTIVES[name])
    return ops


def check_args(args, world_size: int | None) -> tuple[list[Collective], list[int]]:
    """The collectives and sizes to measure; SystemExit naming the problem for arguments no rank
    could run: an unknown collective, an empty size range, a root or skewed rank outside a world of
    ``world_size`` (None: not known yet). The driver calls it before starting any rank; every rank
    calls it too (torchrun)."""
    ops, sizes = resolve_ops(args.ops), size_list(args)
    if world_size is not None:
        if not 0 <= args.root < world_size:
            raise SystemExit(f"--root {args.root}: a world of {world_size} has ranks 0 to {world_size - 1}")
        if args.skew_ms > 0 and not -world_size <= args.skew_rank < world_size:
            raise SystemExit(f"--skew-rank {args.skew_rank}: a world of {world_size} has ranks 0 to "
                             f"{world_size - 1} (or -1 to -{world_size} from the last)")
    return ops, sizes


def measure(coll: Collective, backend: str, group, groups: runtime.Groups, size: int, args, rng: random.Random,
            dev: torch.device | None = None) -> dict:
    """Check, warm up and time one (collective, size, backend) with tensors on ``dev`` (the CPU by
    default); every rank returns the same row. A row has ``error`` when a rank failed,
    ``unsupported`` when every rank's backend refused the call (see :func:`refusal`)."""
    dev = dev or torch.device("cpu")
    n, rank = groups.world, groups.rank
    dtype = DTYPES[args.dtype]
    esize = torch.empty(0, dtype=dtype).element_size()
    count = size // esize // n * n if coll.split else size // esize
    row = {"op": coll.name, "backend": backend, "size": count * esize, "count": count, "type": args.dtype,
           "redop": args.redop if coll.reduces else "none", "root": args.root if coll.rooted else -1,
           "nranks": n}
    if count == 0:  # the requested size stays in the row, so that two such sizes stay apart
        row["size"] = size
        row["error"] = (f"size {size} B holds fewer than {n} elements of {args.dtype} ({esize} B each): "
                        f"{coll.name} needs one per rank" if coll.split else
                        f"size {size} B holds no element of {args.dtype} ({esize} B each)")
        return row
    n_in, n_out = coll.shapes(count, n)
    iters = iterations(args, row["size"])
    skew_rank = args.skew_rank % n
    delay = args.skew_ms > 0 and rank == skew_rank
    error = unsupported = None
    local = {}
    inp = out = None
    try:
        runtime.trim_heap()
        inp = torch.empty(n_in, dtype=dtype, device=dev)
        out = torch.empty(n_out, dtype=dtype, device=dev) if n_out else None
        wrong = check_pass(coll, group, inp, out, rank, n, count, args.root, args.redop)
        inp.zero_()
        if out is not None:
            out.zero_()
        redop = REDOPS[args.redop]
        runtime.trim_heap()
        maps_before = runtime.rss_by_mapping()  # what grew, for the JSON (per_rank.rss_grown): read
        rss_before = runtime.current_rss()      # first, so that its own memory is not counted as +RSS
        peak_reset = runtime.reset_peak_rss()
        for _ in range(args.warmup):
            if delay:
                time.sleep(rng.uniform(0, args.skew_ms) / 1000)
            run_op(coll, group, inp, out, redop, args.root)
        runtime.sync(dev)
        dist.barrier(group=groups.control)
        probe = runtime.CpuProbe(backend)
        probe.start()
        times = []
        t_prev = time.perf_counter()
        for _ in range(iters):
            if delay:
                time.sleep(rng.uniform(0, args.skew_ms) / 1000)
            run_op(coll, group, inp, out, redop, args.root)
            runtime.sync(dev)  # the result is usable on the device from here
            t = time.perf_counter()
            times.append(t - t_prev)
            t_prev = t
        local = {"times": times, "wrong": wrong, "rss_before": rss_before, "rss_peak": runtime.peak_rss(),
                 "rss_grown": runtime.rss_growth(maps_before, runtime.rss_by_mapping()),
                 "peak_reset": peak_reset, "tensor_bytes": inp.nbytes + (out.nbytes if out is not None else 0),
                 **probe.stop()}
    except Unsupported as exc:
        unsupported = str(exc)
    except Exception as exc:  # reported in the row; the other ranks report theirs
        error = f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        del inp, out
    parts = runtime.gather_objects({"error": error, "unsupported": unsupported, **local}, groups)
    errors = [p["error"] for p in parts if p["error"]]
    refused = [p["unsupported"] for p in parts if p["unsupported"]]
    if refused and len(refused) == len(parts) and not errors and backend != "mccl":
        row["unsupported"] = f"{backend} refuses {coll.name} on {dev.type} {args.dtype} tensors: {refused[0]}"
        return row
    errors += [f"rank {i}: refused: {p['unsupported']}" for i, p in enumerate(parts) if p["unsupported"]]
    if errors:
        row["error"] = "; ".join(errors)
        return row
    per_iter = [max(p["times"][k] for p in parts) for k in range(iters)]
    t_med, t_mean = statistics.median(per_iter), statistics.fmean(per_iter)
    t_loop = max(sum(p["times"]) for p in parts) / iters  # every rank's loop starts at the barrier
    factor = coll.factor(n)
    row.update({
        "iters": iters, "warmup": args.warmup,
        "time_us": t_med * 1e6, "time_us_mean": t_mean * 1e6, "time_us_min": min(per_iter) * 1e6,
        "time_us_max": max(per_iter) * 1e6,
        "algbw": row["size"] / t_med / 1e9, "busbw": row["size"] / t_med / 1e9 * factor,
        "algbw_mean": row["size"] / t_mean / 1e9, "busbw_mean": row["size"] / t_mean / 1e9 * factor,
        "time_us_loop": t_loop * 1e6, "busbw_loop": row["size"] / t_loop / 1e9 * factor,
        "busbw_factor": factor,
        "wrong": sum(p["wrong"] for p in parts),
        "rss_peak_mib": max(p["rss_peak"] for p in parts) / 2 ** 20,
        "rss_extra_mib": max(p["rss_peak"] - p["rss_before"] for p in parts) / 2 ** 20,
        "rss_peak_reset": all(p["peak_reset"] for p in parts),
        "tensor_mib": parts[0]["tensor_bytes"] / 2 ** 20,
        "cpu_engine_pct": None if any(p["cpu_engine_pct"] is None for p in parts)
        else max(p["cpu_engine_pct"] for p in parts),
        "cpu_proc_pct": max(p["cpu_proc_pct"] for p in parts),
        "per_rank": {"cpu_engine_pct": [p["cpu_engine_pct"] for p in parts],
                     "cpu_proc_pct": [p["cpu_proc_pct"] for p in parts],
                     "rss_peak_mib": [p["rss_peak"] / 2 ** 20 for p in parts],
                     "rss_extra_mib": [(p["rss_peak"] - p["rss_before"]) / 2 ** 20 for p in parts],
                     "rss_grown": [p.get("rss_grown", []) for p in parts],
                     "times_us": [[round(t * 1e6, 1) for t in p["times"]] for p in parts]},
        "skew_ms": args.skew_ms, "skew_rank": skew_rank if args.skew_ms > 0 else None,
    })
    return row


def combine_rounds(every: list[dict]) -> list[dict]:
    """One row per (collective, size, backend) from several rounds: the round of median time
    (the lower median for an even count), with every round's time and busbw, the spread
    (max - min) / median of the times in percent, and the wrong elements of all rounds."""
    groups: dict[tuple, list[dict]] = {}
    for r in every:
        groups.setdefault((r["op"], r["size"], r["backend"]), []).append(r)
    out = []
    for rs in groups.values():
        timed = [r for r in rs if "time_us" in r]
        if len(timed) < len(rs):  # an error or a refusal in some round: report that round
            out.append(next(r for r in rs if "time_us" not in r))
            continue
        timed.sort(key=lambda r: r["time_us"])
        row = dict(timed[(len(timed) - 1) // 2])
        times = [r["time_us"] for r in rs]
        row["rounds_time_us"] = times
        row["rounds_busbw"] = [r["busbw"] for r in rs]
        if "busbw_pct_goodput" in row:
            row["rounds_busbw_pct_goodput"] = [r["busbw_pct_goodput"] for r in rs]
            row["rounds_busbw_loop_pct_goodput"] = [r.get("busbw_loop_pct_goodput") for r in rs]
        row["rounds_time_us_loop"] = [r.get("time_us_loop") for r in rs]
        row["rounds_busbw_loop"] = [r.get("busbw_loop") for r in rs]
        loops = sorted(t for t in row["rounds_time_us_loop"] if t is not None)
        row["time_us_loop_median"] = loops[(len(loops) - 1) // 2] if len(loops) == len(rs) else None
        row["spread_pct"] = 100 * (max(times) - min(times)) / row["time_us"]
        row["wrong"] = sum(r.get("wrong", 0) for r in rs)
        del row["round"]
        out.append(row)
    return out


def main(args) -> int:
    """Rank mode: run every (collective, size, backend); rank 0 prints the tables and writes files."""
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    torch.set_num_threads(args.threads)
    backends = runtime.split_backends(args.backends)
    ops, sizes = check_args(args, int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else None)
    dev = runtime.rank_device(args.device)
    groups = runtime.init_groups(backends, args.pg_timeout)
    goodput = runtime.resolve_goodput(args, groups)
    meta = runtime.run_metadata(groups, backends)
    meta["goodput"] = goodput
    meta.update(runtime.device_meta(dev, groups))
    rank0 = groups.rank == 0
    if rank0:
        report.print_header(meta, args)
    rng = random.Random(1234 + groups.rank)
    every = []
    meta["rounds"] = args.rounds
    for rnd in range(args.rounds):
        # Backends alternate round by round (and take turns going first), so that a drift of the
        # machine or the link over the run falls on each of them alike.
        order = backends if rnd % 2 == 0 else backends[::-1]
        for coll in ops:
            for size in sizes:
                for backend in order:
                    row = measure(coll, backend, groups.by_backend[backend], groups, size, args, rng, dev)
                    row["round"] = rnd
                    if goodput and "busbw" in row:
                        row["busbw_pct_goodput"] = 100 * row["busbw"] * 1e9 * 8 / goodput["bits_per_s"]
                        row["busbw_loop_pct_goodput"] = 100 * row["busbw_loop"] * 1e9 * 8 / goodput["bits_per_s"]
                    every.append(row)
                    if rank0 and not args.quiet:
                        report.print_progress_row(row)
    rows = combine_rounds(every) if args.rounds > 1 else every
    meta["loadavg_end"] = os.getloadavg()
    if rank0:
        report.print_tables(rows, backends, meta)
        if args.rounds > 1:
            report.print_rounds(rows, backends)
        if args.json:
            out = {"meta": meta, "results": rows}
            if args.rounds > 1:
                out["rounds"] = every
            runtime.write_json(args.json, out)
            print(f"# wrote {args.json}")
        if args.plot:
            report.plot(rows, backends, meta, args.plot)
            print(f"# wrote {args.plot}")
    dist.barrier(group=groups.control)
    dist.destroy_process_group()
    return 1 if any(r.get("wrong") or r.get("error") for r in rows) else 0
