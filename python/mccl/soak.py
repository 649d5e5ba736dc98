"""mccl soak: back-to-back random collectives with exact checks, for a given duration.

Every rank draws the same sequence of (collective, dtype, op, size, root) from a seeded generator,
fills its input with small integers (so every result is exact in every dtype, bfloat16 and int8
included), runs the collective, and compares the result with an int64/float64 reference computed
from every rank's input (each rank can regenerate the others' inputs from the seed). Ranks also keep
a running checksum of the results that must be bitwise identical everywhere (all-reduce, broadcast,
all-gather) and compare it at every control point, where rank 0 prints ops, bytes, errors and each
rank's resident memory (RSS) over time.

Run it either way::

    python -m mccl.soak --duration 30                     # starts 4 local ranks itself
    torchrun --nproc-per-node 4 -m mccl.soak --duration 600   # one rank per process (env://)

Exit status: 0 when every result was exact and no collective failed, 1 otherwise, 2 for usage.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import warnings
import zlib
from datetime import timedelta

from . import _cli

COLLECTIVES = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"]
DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"]
# Largest integer each dtype holds exactly (and where its sums must stay).
EXACT = {"float32": 2**24, "float64": 2**53, "float16": 2048, "bfloat16": 256, "int8": 127,
         "uint8": 255, "int32": 2**31 - 1, "int64": 2**62, "bool": 1}
INTS = {"int8", "uint8", "int32", "int64"}


def _size(text: str) -> int:
    """'4MiB', '512KiB', '1000' -> bytes."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9, "b": 1}
    t = text.strip().lower()
    for unit, mult in units.items():
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * mult)
    return int(t)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mccl.soak",
        description="Soak test: back-to-back random-size, random-dtype collectives (all_reduce, broadcast, "
                    "reduce, all_gather, reduce_scatter, all_to_all, barrier) with exact integer-valued data, "
                    "checked against int64/float64 references and cross-rank checksums, for a given duration. "
                    "Rank 0 prints ops, bytes, errors and each rank's RSS over time.",
        epilog="Without RANK/WORLD_SIZE in the environment it starts --nproc local ranks itself (127.0.0.1); "
               "under torchrun each process is one rank. Exit status 0: every result exact, 1: errors or a "
               "failed collective. Example (the 10-minute run): python -m mccl.soak --nproc 4 --duration 600")
    p.add_argument("--duration", type=_cli.number_at_least(0, above=True, what="number of seconds"), default=30.0, help="seconds to run (default 30)")
    p.add_argument("--nproc", type=_cli.int_at_least(1), default=4, help="local ranks to start when not under torchrun (default 4)")
    p.add_argument("--backend", default="mccl", help="torch.distributed backend (default mccl; gloo to compare)")
    p.add_argument("--max-bytes", type=_size, default=_size("4MiB"),
                   help="largest buffer per collective, e.g. 64MiB (default 4MiB); sizes are log-uniform from 1 element")
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help=f"comma-separated subset of {','.join(COLLECTIVES)} (default all)")
    p.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma-separated subset of {','.join(DTYPES)} (default all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the op sequence (default 0)")
    p.add_argument("--report-every", type=_cli.number_at_least(0, above=True, what="number of seconds"), default=5.0, help="seconds between report lines (default 5)")
    p.add_argument("--check-every", type=_cli.int_at_least(1), default=16,
                   help="collectives between control points (checksum comparison, stop decision; default 16)")
    p.add_argument("--timeout", type=_cli.number_at_least(0, above=True, what="number of seconds"), default=300.0, help="process-group timeout in seconds (default 300)")
    p.add_argument("--json", metavar="PATH", type=_cli.output_file, help="rank 0 writes the samples and the summary here")
    p.add_argument("--corrupt", metavar="RANK:OP", default=None,
                   help="testing the tester: corrupt one element of RANK's first result from op number OP on; "
                        "the run must then report errors and exit 1")
    args = p.parse_args(argv)
    args.collectives = [c for c in args.collectives.split(",") if c]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    bad = [c for c in args.collectives if c not in COLLECTIVES] + [d for d in args.dtypes if d not in DTYPES]
    if bad or not args.collectives or not args.dtypes:
        p.error(f"unknown or empty collectives/dtypes: {bad}")
    if args.max_bytes < 1:
        p.error("--max-bytes must be positive")
    if args.corrupt is not None:
        try:
            r, k = args.corrupt.split(":")
            args.corrupt = (int(r), int(k))
        except ValueError:
            p.error("--corrupt takes RANK:OP, e.g. 1:20")
        if args.corrupt[0] < 0 or args.corrupt[1] < 0:
            p.error(f"--corrupt {r}:{k}: RANK and OP are 0 or more")
        world = int(os.environ.get("WORLD_SIZE", args.nproc))
        if args.corrupt[0] >= world:  # a rank that is not there would corrupt nothing and pass
            p.error(f"--corrupt {r}:{k}: there is no rank {r} in a world of {world}")
    from .bench.runtime import split_backends

    try:
        backends = split_backends(args.backend, "--backend")
    except SystemExit as exc:  # its message names the problem; argparse's form and exit status 2
        p.error(str(exc.code))
    if len(backends) != 1:
        p.error(f"--backend {args.backend}: one backend (mccl, or gloo to compare)")
    return args


def rss_bytes() -> int:
    """Resident set size now (Linux), else the peak (other systems)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


# ---- one rank --------------------------------------------------------------------------------------

class Plan:
    """The op sequence: the same on every rank, drawn from (seed, op number)."""

    def __init__(self, args, world: int):
        self.args, self.world = args, world

    def op(self, k: int) -> dict:
        import torch

        rng = random.Random(self.args.seed * 1_000_003 + k)
        n = self.world
        kind = rng.choice(self.args.collectives)
        dtype = rng.choice(self.args.dtypes)
        tdtype = getattr(torch, dtype)
        esize = torch.empty(0, dtype=tdtype).element_size()
        if kind in ("all_reduce", "reduce", "reduce_scatter"):
            if dtype == "bool":
                red = rng.choice(["max", "min"])
            elif dtype in INTS:
                red = rng.choice(["sum", "sum", "max", "min", "product", "band", "bor", "bxor"])
            else:
                red = rng.choice(["sum", "sum", "max", "min", "product"])
        else:
            red = None
        # Log-uniform element count; collectives that split a buffer get whole blocks per rank.
        max_elems = max(1, self.args.max_bytes // esize)
        elems = max(1, int(math.exp(rng.uniform(0, math.log(max_elems)))))
        if kind in ("all_gather", "reduce_scatter", "all_to_all"):
            elems = max(1, elems // n)  # the per-rank block; buffers are n blocks
        # Inputs repeat with a prime period (never a divisor of a power-of-two segment), different
        # for every op and rank, so a misplaced or swapped block shows; references are computed on
        # one period only, which keeps the checking cheap next to the collective itself.
        return {"k": k, "kind": kind, "dtype": dtype, "tdtype": tdtype, "esize": esize, "red": red,
                "elems": elems, "root": rng.randrange(n), "salt": rng.randrange(1 << 30),
                "period": rng.choice([1021, 2039, 4093, 8191])}

    def bounds(self, op: dict) -> tuple[int, int]:
        """Inclusive value range of every input element, so that every result is exact."""
        n, dtype, red = self.world, op["dtype"], op["red"]
        if dtype == "bool":
            return 0, 1
        limit = EXACT[dtype]
        if red == "product":
            return (-1, 2) if 2**n <= limit else (-1, 1)
        if red in ("band", "bor", "bxor"):
            return 0, min(limit, 2**15 - 1)
        hi = max(1, min(limit // max(n, 1) - 1, 1 << 20))
        lo = 0 if dtype == "uint8" else -hi
        return lo, hi

    def pattern(self, op: dict, rank: int):
        """Rank ``rank``'s input pattern for ``op``: int64 values, repeated to fill its buffers."""
        import torch

        lo, hi = self.bounds(op)
        g = torch.Generator().manual_seed(op["salt"] * 65537 + rank)
        v = torch.randint(lo, hi + 1, (op["period"],), generator=g, dtype=torch.int64)
        if op["red"] == "product" and lo == -1:  # no zeros: -1, 1 and (when exact) 2
            v = torch.where(v == 0, torch.ones_like(v), v)
        return v

    @staticmethod
    def tile(pattern, elems: int, start: int = 0):
        """Elements [start, start + elems) of ``pattern`` repeated forever."""
        p = pattern.numel()
        reps = (start % p + elems + p - 1) // p
        return pattern.repeat(reps)[start % p: start % p + elems]

    def input(self, op: dict, rank: int, elems: int):
        """Rank ``rank``'s input of ``elems`` elements, as int64 (a pure function of op and rank)."""
        return self.tile(self.pattern(op, rank), elems)


def _reduce(red: str, xs):
    import torch

    out = xs[0].clone()
    for x in xs[1:]:
        if red == "sum":
            out += x
        elif red == "product":
            out *= x
        elif red == "max":
            out = torch.maximum(out, x)
        elif red == "min":
            out = torch.minimum(out, x)
        elif red == "band":
            out &= x
        elif red == "bor":
            out |= x
        elif red == "bxor":
            out ^= x
    return out


def _run_one(dist, plan: Plan, op: dict, rank: int, world: int):
    """Run ``op``; returns (result tensor or None, int64 reference or None, replicated?, bytes)."""
    import torch

    kind, td, elems, root = op["kind"], op["tdtype"], op["elems"], op["root"]
    reds = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR,
            "bxor": dist.ReduceOp.BXOR}
    if kind == "barrier":
        dist.barrier()
        return None, None, False, 0
    patterns = [plan.pattern(op, r) for r in range(world)]
    if kind in ("all_reduce", "broadcast", "reduce"):
        t = plan.tile(patterns[rank], elems).to(td)
        moved = t.numel() * op["esize"]
        if kind == "all_reduce":
            dist.all_reduce(t, op=reds[op["red"]])
            return t, plan.tile(_reduce(op["red"], patterns), elems), True, moved
        if kind == "broadcast":
            dist.broadcast(t, root)
            return t, plan.tile(patterns[root], elems), True, moved
        dist.reduce(t, root, op=reds[op["red"]])
        if rank != root:  # only the root's buffer is defined afterwards
            return None, None, False, moved
        return t, plan.tile(_reduce(op["red"], patterns), elems), False, moved
    if kind == "all_gather":
        x = plan.tile(patterns[rank], elems).to(td)
        out = torch.empty(world * elems, dtype=td)
        dist.all_gather_into_tensor(out, x)
        return out, torch.cat([plan.tile(p, elems) for p in patterns]), True, out.numel() * op["esize"]
    if kind == "reduce_scatter":
        x = plan.tile(patterns[rank], world * elems).to(td)
        out = torch.empty(elems, dtype=td)
        dist.reduce_scatter_tensor(out, x, op=reds[op["red"]])
        return out, plan.tile(_reduce(op["red"], patterns), elems, start=rank * elems), False, x.numel() * op["esize"]
    if kind == "all_to_all":
        x = plan.tile(patterns[rank], world * elems).to(td)
        out = torch.empty(world * elems, dtype=td)
        dist.all_to_all_single(out, x)
        ref = torch.cat([plan.tile(p, elems, start=rank * elems) for p in patterns])
        return out, ref, False, x.numel() * op["esize"]
    raise ValueError(kind)


def _exact(out, ref) -> bool:
    """``out`` equals the int64 reference exactly. Every reference value is an integer that
    out's dtype represents exactly (Plan.bounds), so converting the reference is exact."""
    return bool(out.shape == ref.shape) and bool((out == ref.to(out.dtype)).all())


def run_rank(args, rank: int, world: int) -> int:
    import torch
    import torch.distributed as dist

    if args.backend == "mccl":
        import mccl  # noqa: F401

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch renaming *_tensor collectives
    dist.init_process_group(args.backend, rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout))
    plan = Plan(args, world)
    start = time.monotonic()
    ops = nbytes = errors = 0  # errors: this rank's results that differ from the reference
    split = 0  # control windows whose replicated results differed between ranks
    checksum = 0  # over results that every rank must hold bitwise identically
    samples, failure = [], None
    last_report = start
    rss0 = rss_bytes()
    if rank == 0:
        print(f"mccl soak: {world} ranks, backend {args.backend}, {args.duration:g} s, up to "
              f"{args.max_bytes} bytes per collective, seed {args.seed}", flush=True)
        print(f"{'time':>7} {'ops':>8} {'GiB':>9} {'errors':>6}  rss MiB per rank", flush=True)

    def control() -> bool:
        """Every rank: compare checksums, share stats; rank 0 reports and decides to stop."""
        nonlocal errors, split, checksum, last_report
        now = time.monotonic()
        stop = 1 if now - start >= args.duration else 0
        mine = torch.tensor([checksum, ops, nbytes, errors, rss_bytes(), stop], dtype=torch.int64)
        table = torch.empty(world * mine.numel(), dtype=torch.int64)
        dist.all_gather_into_tensor(table, mine)
        table = table.view(world, -1)
        if len(set(table[:, 0].tolist())) != 1:  # seen identically by every rank
            split += 1
            if rank == 0:
                print(f"ERROR: results that must be bitwise equal on every rank differ between ranks "
                      f"(ops {ops - args.check_every}..{ops - 1}; checksums {table[:, 0].tolist()})",
                      file=sys.stderr, flush=True)
        checksum = 0  # each window between control points is compared on its own
        total_errors = int(table[:, 3].sum()) + split
        rss = [int(v) for v in table[:, 4].tolist()]
        stopping = bool(table[0, 5])  # rank 0's clock decides, so every rank stops at the same op
        if rank == 0 and (stopping or now - last_report >= args.report_every):
            last_report = now
            sample = {"t": round(now - start, 2), "ops": ops, "bytes": nbytes, "errors": total_errors, "rss": rss}
            samples.append(sample)
            print(f"{now - start:6.1f}s {ops:8d} {nbytes / 2**30:9.3f} {total_errors:6d}  "
                  + " ".join(f"{v / 2**20:.0f}" for v in rss), flush=True)
        return stopping

    k = 0
    try:
        while True:
            op = plan.op(k)
            out, ref, replicated, moved = _run_one(dist, plan, op, rank, world)
            if args.corrupt is not None and args.corrupt[0] == rank and k >= args.corrupt[1] and out is not None:
                args.corrupt = None  # once, in the first result this rank holds from op OP on
                flat = out.view(-1)
                flat[0] = (not bool(flat[0])) if out.dtype == torch.bool else flat[0] + 1
            if out is not None:
                if not _exact(out, ref):
                    errors += 1
                    if errors <= 10:
                        bad = (out.to(torch.float64) != ref.to(torch.float64)).nonzero().flatten()
                        print(f"rank {rank}: ERROR op {k} {op['kind']} {op['dtype']} {op['red'] or ''} "
                              f"{op['elems']} elements (root {op['root']}): {bad.numel()} wrong, first at {bad[:1].tolist()}",
                              file=sys.stderr, flush=True)
                if replicated:
                    checksum = (checksum * 1_000_003 + zlib.crc32(out.view(torch.uint8).numpy().tobytes())) % (1 << 61)
            ops += 1
            nbytes += moved
            k += 1
            if k % args.check_every == 0 and control():
                break
    except Exception as exc:  # a failed collective: the group is dead, report and stop
        failure = f"{type(exc).__name__}: {exc}"
        print(f"rank {rank}: FAILED after {ops} ops: {failure}", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - start
    if rank == 0:
        total = samples[-1] if samples else {"ops": ops, "bytes": nbytes, "errors": errors + split, "rss": [rss_bytes()]}
        summary = {"ranks": world, "backend": args.backend, "duration_s": round(elapsed, 2), "ops": total["ops"],
                   "bytes": total["bytes"], "errors": total["errors"] + (1 if failure else 0),
                   "failure": failure, "rss_start": rss0, "rss_end": total["rss"],
                   "seed": args.seed, "max_bytes": args.max_bytes, "collectives": args.collectives,
                   "dtypes": args.dtypes, "kinds_run": sorted({plan.op(i)["kind"] for i in range(total["ops"])}),
                   "dtypes_run": sorted({plan.op(i)["dtype"] for i in range(total["ops"])})}
        print(f"summary: {summary['ops']} ops, {summary['bytes'] / 2**30:.3f} GiB, {summary['errors']} errors in "
              f"{elapsed:.1f} s ({summary['ops'] / max(elapsed, 1e-9):.0f} ops/s); RSS rank 0 "
              f"{rss0 / 2**20:.0f} -> {total['rss'][0] / 2**20:.0f} MiB, all ranks at the end "
              + " ".join(f"{v / 2**20:.0f}" for v in total["rss"]) + " MiB", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"summary": summary, "samples": samples}, f, indent=1)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    return 0 if (failure is None and errors == 0 and split == 0 and (rank != 0 or summary["errors"] == 0)) else 1


# ---- the launcher (when not under torchrun) ----------------------------------------------------------

def _child_setup():
    if sys.platform.startswith("linux"):  # die with the launcher, whatever kills it
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            pass


def launch(args, argv) -> int:
    import torch.distributed as dist

    # The launcher hosts the store (port 0: no race for a free port); ranks connect as clients.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=args.timeout))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE=str(args.nproc),
               TORCHELASTIC_USE_AGENT_STORE="True", LOCAL_WORLD_SIZE=str(args.nproc))
    procs = []
    # Everything a rank may need: start-up, the run itself, a slow last collective, teardown.
    deadline = time.monotonic() + args.duration + args.timeout + 120
    try:
        for r in range(args.nproc):
            procs.append(subprocess.Popen([sys.executable, "-m", "mccl.soak", *argv],
                                          env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), preexec_fn=_child_setup
                                          if sys.platform.startswith("linux") else None))
        codes = {}
        while len(codes) < len(procs):
            for r, p in enumerate(procs):
                if r not in codes and p.poll() is not None:
                    codes[r] = p.returncode
            if any(c != 0 for c in codes.values()):
                # One rank failed: the others fail at their next collective; give them a moment.
                grace = time.monotonic() + 30
                while time.monotonic() < min(grace, deadline) and any(p.poll() is None for p in procs):
                    time.sleep(0.2)
                break
            if time.monotonic() > deadline:
                print("mccl soak: deadline passed, killing every rank", file=sys.stderr, flush=True)
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
    codes = [p.returncode for p in procs]
    if any(c != 0 for c in codes):
        print(f"mccl soak: rank exit codes {codes}", file=sys.stderr, flush=True)
        return 1
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return run_rank(args, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    return launch(args, argv)


if __name__ == "__main__":
    sys.exit(main())
