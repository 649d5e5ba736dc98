"""What every benchmark shares: launching ranks, process groups, CPU/RSS probes, goodput, metadata.

A benchmark command runs in one of two modes:

- **rank mode**, when ``RANK`` and ``WORLD_SIZE`` are set (torchrun, ``python -m mccl.cluster run``,
  or this module's own launcher): the process is one rank and runs the benchmark;
- **driver mode** otherwise: the command starts ``--nproc`` copies of itself in rank mode, on this
  machine over loopback, or with ``--cluster ID`` one per host of an emulated cluster
  (``mccl.cluster``), and waits for them under a deadline (``--deadline``).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import platform
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import psutil

from .. import _cli, cluster

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Thread names (``/proc/<pid>/task/<tid>/comm``) of each backend's progress threads: libmccl's
#: "mccl-engine" and "mccl-send" (csrc/core/engine.c, csrc/transport/tcp.c). Where a pattern
#: matches no thread the probe falls back to the CPU time of the whole process.
ENGINE_THREADS = {"mccl": r"^mccl", "gloo": r"^(gloo|pt_gloo)"}


# ---------------------------------------------------------------------------------------------
# Modes and launching
# ---------------------------------------------------------------------------------------------

def rank_mode() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def add_launch_args(p: argparse.ArgumentParser) -> None:
    """Options every benchmark command has: backends, where the ranks run, deadlines, threads."""
    g = p.add_argument_group("ranks (driver mode: without RANK/WORLD_SIZE in the environment)")
    g.add_argument("--nproc", type=_cli.int_at_least(1), default=None,
                   help="ranks to start: default 2 on this machine, or one per host with --cluster")
    g.add_argument("--cluster", metavar="ID", type=cluster.id_arg, default=None,
                   help="start the ranks in emulated cluster ID (python -m mccl.cluster up; needs root), "
                        "rank i in host i unless --rank-order says otherwise")
    g.add_argument("--rank-order", type=cluster.rank_order_arg, default="in-order",
                   help="with --cluster: " + cluster.RANK_ORDER_HELP + " (mccl.cluster's own placement; recorded "
                        "in the header and the JSON's meta.placement)")
    g.add_argument("--deadline", type=_cli.number_at_least(0, what="number of seconds"), default=3600.0,
                   help="seconds after which every rank is killed and the run fails (0: no deadline)")
    p.add_argument("--backends", default="mccl,gloo",
                   help="comma-separated torch.distributed backends, measured in the same processes")
    p.add_argument("--threads", type=_cli.int_at_least(1), default=1, help="torch intra-op threads per rank")
    p.add_argument("--pg-timeout", type=_cli.number_at_least(0, above=True, what="number of seconds"),
                   default=600.0, help="process-group timeout (s)")


def split_backends(text: str, flag: str = "--backends") -> list[str]:
    """The backends of ``--backends`` (``flag`` names the option in errors); SystemExit naming the
    problem when one is not a backend of this torch (mccl counts once importable) or a name repeats."""
    import torch.distributed as dist

    backends = [b.strip().lower() for b in text.split(",") if b.strip()]  # torch lowercases them too
    if not backends or len(set(backends)) != len(backends):
        raise SystemExit(f"{flag} {text!r}: give one or more distinct backend names, e.g. mccl,gloo")
    if "mccl" in backends:
        import mccl  # noqa: F401  (registers the backend)
    known = [b for b in dist.Backend.backend_list if b != "undefined"]
    unknown = [b for b in backends if b not in known]
    if unknown:
        raise SystemExit(f"{flag}: {', '.join(unknown)} is not a torch.distributed backend here; "
                         f"known: {', '.join(known)}")
    return backends


def driver_spec(args) -> tuple[cluster.ClusterSpec | None, int]:
    """The cluster (None for local) and world size a driver-mode run uses."""
    spec = None
    if args.cluster:
        cluster.require_root("--cluster")
        spec = cluster.load_spec(args.cluster)
    nproc = args.nproc or (spec.hosts if spec else 2)
    return spec, nproc


def relaunch(argv: list[str], args, world_size: int | None = None, extra_env: dict[str, str] | None = None) -> int:
    """Run ``python -m mccl.bench ARGV`` as ranks (driver mode); returns the job's exit status."""
    cmd = [sys.executable, "-m", "mccl.bench", *argv]
    try:
        spec, nproc = driver_spec(args)  # the cluster may not be up: a one-line error
        return cluster.launch(cmd, world_size or nproc, spec=spec, timeout=args.deadline, extra_env=extra_env,
                              rank_order=getattr(args, "rank_order", "in-order"))
    except cluster.ClusterError as exc:
        print(f"mccl.bench: error: {exc}", file=sys.stderr)
        return 2


@dataclass
class Groups:
    """The process groups of one rank: ``control`` (gloo) carries the benchmark's own bookkeeping,
    so none of it travels over a backend under test; ``by_backend`` holds one group per backend."""

    rank: int
    world: int
    control: object
    by_backend: dict
    #: per backend, what creating its group cost this rank: ``seconds`` (wall time of
    #: ``dist.new_group``, which returns once the backend's communicator is up, so it includes
    #: waiting for the slowest rank) and ``descriptors`` (open file descriptors it added, from
    #: psutil's ``num_fds``: /proc/self/fd on Linux; its sockets and anything else it keeps open)
    init: dict


def init_groups(backends: list[str], timeout_s: float) -> Groups:
    import torch.distributed as dist

    if "mccl" in backends:
        import mccl  # noqa: F401  (registers the backend)
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", timeout=timeout)
    me = psutil.Process()
    groups, init = {}, {}
    for b in backends:
        fds, t0 = me.num_fds(), time.perf_counter()
        groups[b] = dist.new_group(backend=b, timeout=timeout)
        init[b] = {"seconds": time.perf_counter() - t0, "descriptors": me.num_fds() - fds}
    # torch's barrier() asks which accelerator the machine has (torch._C._get_accelerator), which
    # on a CUDA build of torch loads and initializes the CUDA driver: 3.4 MiB of libcuda's pages
    # and 1 MiB of heap. The bench's first barrier is inside the first measurement's window, so
    # whichever backend ran first was charged for it (+RSS, 2026-12-06): it happens here instead.
    dist.barrier(group=dist.group.WORLD)
    return Groups(dist.get_rank(), dist.get_world_size(), dist.group.WORLD, groups, init)


def init_summary(groups: Groups) -> dict:
    """Every rank's :attr:`Groups.init`, summed up per backend: the slowest and the median rank's
    seconds, and the fewest and most descriptors a rank's group added (collective: every rank
    calls it)."""
    every = gather_objects(groups.init, groups)
    out = {}
    for b in groups.init:
        secs = sorted(r[b]["seconds"] for r in every)
        fds = [r[b]["descriptors"] for r in every]
        out[b] = {"seconds_max": secs[-1], "seconds_median": secs[len(secs) // 2],
                  "descriptors_min": min(fds), "descriptors_max": max(fds)}
    return out


def init_line(meta: dict) -> str | None:
    """``# init: mccl 0.41 s (slowest rank; median 0.40), 7 descriptors per rank; gloo ...``."""
    init = meta.get("init")
    if not init:
        return None
    parts = []
    for b, v in init.items():
        fds = (f"{v['descriptors_max']}" if v["descriptors_min"] == v["descriptors_max"]
               else f"{v['descriptors_min']}-{v['descriptors_max']}")
        parts.append(f"{b} {v['seconds_max']:.2f} s (slowest rank; median {v['seconds_median']:.2f}), "
                     f"{fds} descriptors per rank")
    return "# group init: " + "; ".join(parts)


def gather_objects(obj, groups: Groups) -> list:
    """Every rank's ``obj`` on every rank, over the control group."""
    import torch.distributed as dist

    out = [None] * groups.world
    dist.all_gather_object(out, obj, group=groups.control)
    return out


# ---------------------------------------------------------------------------------------------
# Devices: where the tensors under test live
# ---------------------------------------------------------------------------------------------

DEVICES = ("cpu", "cuda")


def device_unavailable(name: str) -> str | None:
    """Why ``--device NAME`` cannot run in this process (one line), or None when it can."""
    if name == "cpu":
        return None
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return f"torch {torch.__version__} is built without CUDA; run with --device cpu or a CUDA build of torch"
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: check the driver and "
                f"CUDA_VISIBLE_DEVICES")
    return None


def rank_device(name: str):
    """This rank's device as a ``torch.device``: the CPU, or CUDA device
    ``LOCAL_RANK % torch.cuda.device_count()``, made the current device (so several ranks may
    share one GPU, as in an emulated cluster with one GPU). SystemExit naming the problem when
    the device is not there."""
    import torch

    if name == "cpu":
        return torch.device("cpu")
    if reason := device_unavailable(name):
        raise SystemExit(f"mccl.bench: error: --device {name}: {reason}")
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def sync(dev) -> None:
    """Wait until every kernel queued on ``dev`` so far has finished (nothing to wait for on the
    CPU): a timer stopped after this measures until results are usable on the device."""
    if dev.type == "cuda":
        import torch

        torch.cuda.synchronize(dev)


def device_meta(dev, groups: Groups) -> dict:
    """What the JSON and the header say about the device: its type, and for CUDA its name, the
    CUDA version, the TF32 switches and how many ranks share one GPU (every rank's GPU UUID,
    gathered over the control group)."""
    import torch

    info: dict = {"device": dev.type}
    ident = None
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update({"device_index": dev.index, "device_name": props.name, "device_count": torch.cuda.device_count(),
                     "device_mem_gib": props.total_memory / 2 ** 30, "cuda": torch.version.cuda,
                     "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
                     "tf32_cudnn": torch.backends.cudnn.allow_tf32})
        ident = str(getattr(props, "uuid", "")) or f"{socket.gethostname()}:{dev.index}"
    idents = gather_objects(ident, groups)
    if dev.type == "cuda":
        info["gpus_used"] = len(set(idents))
        info["ranks_per_gpu_max"] = max(idents.count(i) for i in set(idents))
    return {"device_info": info}


def device_line(meta: dict) -> str:
    """One header line about the device (from :func:`device_meta`)."""
    d = meta.get("device_info") or {"device": meta.get("device", "cpu")}
    if d["device"] != "cuda":
        return f"# device: {d['device']} (tensors under test in host memory)"
    return (f"# device: cuda:{d['device_index']} {d['device_name']} ({d['device_mem_gib']:.0f} GiB, CUDA {d['cuda']}), "
            f"{meta.get('world_size', '?')} ranks on {d['gpus_used']} GPU(s), up to {d['ranks_per_gpu_max']} per GPU; "
            f"TF32 matmul {'on' if d['tf32_matmul'] else 'off'}, cuDNN {'on' if d['tf32_cudnn'] else 'off'}; "
            f"times end when the result is on the device (torch.cuda.synchronize)")


# ---------------------------------------------------------------------------------------------
# CPU and memory probes (Linux /proc; psutil elsewhere)
# ---------------------------------------------------------------------------------------------

def _named_threads(pattern: str) -> list[tuple[str, str]]:
    """(tid, name) of this process's threads whose name matches ``pattern`` (ended ones left out)."""
    rx, found = re.compile(pattern), []
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # the thread ended
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if rx.search(name):
                found.append((tid, name))
    return found


def thread_names(pattern: str) -> list[str]:
    """The names of this process's threads that match ``pattern``, sorted (e.g. mccl-engine, mccl-send)."""
    return sorted(name for _, name in _named_threads(pattern))


def _thread_cpu(pattern: str) -> tuple[float, int]:
    """(CPU seconds, number of threads) over this process's threads whose name matches ``pattern``.

    Per thread, the first field of /proc/self/task/<tid>/schedstat (run time in ns), else utime +
    stime from .../stat (clock ticks, 10 ms resolution)."""
    seconds, count = 0.0, 0
    for tid, _ in _named_threads(pattern):
        try:
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    seconds += int(f.read().split()[0]) / 1e9
            except (OSError, IndexError, ValueError):
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                seconds += (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
            count += 1
        except OSError:
            pass  # the thread ended
    return seconds, count


class CpuProbe:
    """CPU time of a backend's engine threads, found by name, or of the whole process.

    ``start()`` then ``stop()`` give the CPU use over the interval in percent of one core:
    ``engine`` from the threads named like ``ENGINE_THREADS[backend]`` (None when no thread has
    such a name), ``process`` from the whole process (every thread, the benchmark's own included).
    """

    def __init__(self, backend: str):
        self.pattern = ENGINE_THREADS.get(backend)
        self.has_proc = os.path.isdir("/proc/self/task")

    def _engine(self) -> tuple[float, int]:
        return _thread_cpu(self.pattern) if self.pattern and self.has_proc else (0.0, 0)

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.p0 = time.process_time()
        self.e0 = self._engine()

    def stop(self) -> dict:
        wall = time.perf_counter() - self.t0
        proc = time.process_time() - self.p0
        e1 = self._engine()
        engine = 100.0 * (e1[0] - self.e0[0]) / wall if e1[1] > 0 else None
        return {"cpu_engine_pct": engine, "cpu_proc_pct": 100.0 * proc / wall, "engine_threads": e1[1]}


def cpu_source_note(backends: list[str]) -> dict:
    """Which CPU number each backend's column shows, and why (after the groups are created)."""
    notes = {}
    for b in backends:
        pattern = ENGINE_THREADS.get(b)
        names = thread_names(pattern) if pattern and os.path.isdir("/proc/self/task") else []
        if names:
            named = ", ".join(f"{k} x{names.count(k)}" if names.count(k) > 1 else k for k in dict.fromkeys(names))
            notes[b] = (f"engine: {len(names)} thread(s) named /{pattern}/ ({named}; every group of this backend "
                        f"in the process, idle ones included)")
        else:
            notes[b] = (f"process: no thread is named /{ENGINE_THREADS.get(b, '-')}/ "
                        f"(unnamed engine thread), so this is the CPU of the whole rank process")
    return notes


_libc = None


def trim_heap() -> None:
    """Return free heap memory to the OS (glibc malloc_trim), so RSS before a run is what is live."""
    global _libc
    gc.collect()
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    """Peak resident set size in bytes since the last reset (VmHWM), else since process start."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def current_rss() -> int:
    return psutil.Process().memory_info().rss


def rss_by_mapping() -> dict[str, int]:
    """This process's resident bytes per memory mapping, from /proc/self/smaps: key "start path"
    (path "[heap]", "[stack]", a file, or "[anon]"); empty where there is no smaps (macOS)."""
    out: dict[str, int] = {}
    key = None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 5)
                if "-" in head[0] and not head[0].endswith(":"):
                    key = f"{head[0].split('-')[0]} {head[5].strip() if len(head) > 5 else '[anon]'}"
                elif head[0] == "Rss:" and key is not None:
                    out[key] = int(head[1]) * 1024
    except OSError:
        return {}
    return out


def rss_growth(before: dict[str, int], after: dict[str, int], top: int = 4) -> list[list]:
    """The mappings whose resident bytes grew most from ``before`` to ``after`` (new ones count
    whole): [[key, KiB grown], ...], largest first, growths of a page or more only."""
    grown = [(k, (v - before.get(k, 0)) // 1024) for k, v in after.items() if v - before.get(k, 0) >= 4096]
    return [list(g) for g in sorted(grown, key=lambda g: -g[1])[:top]]


# ---------------------------------------------------------------------------------------------
# Goodput
# ---------------------------------------------------------------------------------------------

def parse_goodput(text: str | None) -> dict | None:
    """``--goodput``: None/"none", "measure", or a rate in tc units (``1.91gbit``, ``0.238gbps``)."""
    text = text or os.environ.get("MCCL_BENCH_GOODPUT")
    if not text or text == "none":
        return None
    if text == "measure":
        return {"measure": True}
    return {"bits_per_s": cluster.parse_rate(text), "tool": "given", "how": f"given as {text}"}


def measure_goodput_in_run(groups: Groups, seconds: float, tool: str = "auto") -> dict | None:
    """Single-stream TCP goodput from rank 1 to rank 0 (at MASTER_ADDR), measured by the ranks
    themselves before the benchmark, with iperf3 when installed and ``tool`` is auto, else Python
    sockets. Every rank returns the same dict; None for a single rank."""
    import torch.distributed as dist

    if groups.world < 2:
        return None
    tool = ("iperf3" if cluster.iperf3_path() else "python") if tool == "auto" else tool
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    result: dict = {}
    server = None
    listener = None
    port = [0]
    if groups.rank == 0:
        if tool == "iperf3":
            port[0] = cluster.free_port("")
            server = subprocess.Popen([cluster.iperf3_path() or "iperf3", "-s", "-1", "-p", str(port[0])],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            listener = socket.create_server(("", 0))
            port[0] = listener.getsockname()[1]

            def sink():
                try:
                    result["bits_per_s"], result["receiver_cpu_pct"] = cluster.goodput_sink(listener)
                except Exception as exc:  # reported below
                    result["error"] = str(exc)

            thread = threading.Thread(target=sink, daemon=True)
            thread.start()
    dist.broadcast_object_list(port, src=0, group=groups.control)
    try:
        if groups.rank == 1:
            try:
                if tool == "iperf3":
                    result.update(cluster.goodput_iperf3_client(addr, port[0], seconds))
                else:
                    result["sender_cpu_pct"] = cluster.goodput_source(addr, port[0], seconds)
            except Exception as exc:
                result["error"] = str(exc)
        if groups.rank == 0 and listener is not None:
            thread.join(timeout=seconds + 60)
        dist.barrier(group=groups.control)  # rank 1 is done: the server may go
    finally:
        if server is not None and server.poll() is None:
            server.kill()
        if server is not None:
            server.wait()
        if listener is not None:
            listener.close()
    merged: dict = {}
    for part in gather_objects(result, groups)[:2]:
        merged.update(part)
    if "error" in merged or "bits_per_s" not in merged:
        raise RuntimeError(f"goodput measurement failed: {merged.get('error', 'no result')}")
    return {"bits_per_s": merged["bits_per_s"], "tool": tool, "sender_cpu_pct": merged.get("sender_cpu_pct"),
            "receiver_cpu_pct": merged.get("receiver_cpu_pct"),
            "how": f"measured in this run, rank 1 -> rank 0 ({addr}), one TCP stream, {seconds:g} s, {tool}"}


def goodput_arg(text: str) -> str:
    """argparse type of ``--goodput``: none, measure, or a rate above zero."""
    if text not in ("none", "measure"):
        try:
            if cluster.parse_rate(text) <= 0:
                raise ValueError("a goodput must be above 0")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (or give 'measure' or 'none')") from None
    return text


def resolve_goodput(args, groups: Groups) -> dict | None:
    """The goodput of this run (same on every rank), or None: given, measured by the driver with
    the cluster tool (passed in MCCL_BENCH_GOODPUT/_HOW), or measured here by ranks 0 and 1."""
    if args.goodput == "measure" and (gp := _goodput_from_env("MCCL_BENCH_GOODPUT")):
        return gp
    gp = parse_goodput(args.goodput)
    if gp and gp.get("measure"):
        gp = measure_goodput_in_run(groups, args.goodput_seconds, args.goodput_tool)
    return gp


def add_goodput_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("goodput (the ceiling busbw is compared with)")
    g.add_argument("--goodput", type=goodput_arg, default=None,
                   help="'measure' (single TCP stream rank 1 -> rank 0 before the benchmark; with --cluster "
                        "the cluster tool measures host 1 -> host 0), a rate in tc units such as 1.91gbit "
                        "(bits) or 0.238gbps (bytes), or 'none'; default $MCCL_BENCH_GOODPUT or none")
    g.add_argument("--goodput-seconds", type=_cli.number_at_least(0, above=True, what="number of seconds"),
                   default=5.0, help="length of the goodput measurement")
    g.add_argument("--goodput-tool", default="auto", choices=["auto", "iperf3", "python"],
                   help="iperf3 when installed (auto) or Python sockets")


def driver_goodput_env(args) -> dict[str, str]:
    """Driver mode with --cluster --goodput measure: measure with the cluster tool before launching
    and hand the value to the ranks (MCCL_BENCH_GOODPUT plus how it was measured). With several
    switches, also across an uplink (the pair ``mccl.cluster goodput --across-switches`` takes:
    the first host of switch 1 -> host 0), handed over as MCCL_BENCH_GOODPUT_UPLINK[_HOW,_CPU]; when
    host 1 already sits on another switch than host 0, that one measurement is both."""
    if not (args.cluster and args.goodput == "measure"):
        return {}
    spec, _ = driver_spec(args)
    env: dict[str, str] = {}

    def measure(server: int, client: int, key: str) -> None:
        gp = cluster.measure_goodput(spec, server, client, args.goodput_seconds, args.goodput_tool)
        where = (f" (switch {spec.switch_of(client)} -> switch {spec.switch_of(server)}, through the uplinks at "
                 f"{spec.uplink_rate or spec.rate})" if spec.switch_of(client) != spec.switch_of(server) else "")
        print(f"# goodput h{client} -> h{server}{where} (cluster tool, {gp['tool']}): {cluster.format_goodput(gp)}",
              flush=True)
        env[key] = f"{gp['bits_per_s']:.0f}bit"
        env[key + "_HOW"] = (f"measured in this run by mccl.cluster, host {client} -> host {server}{where}, one TCP "
                             f"stream, {args.goodput_seconds:g} s, {gp['tool']}")
        if cpu := cluster.stream_cpu(gp):
            env[key + "_CPU"] = f"{cpu[0]:.2f},{cpu[1]:.2f}"

    measure(0, 1, "MCCL_BENCH_GOODPUT")
    if spec.switches > 1:
        server, client = cluster.across_switches_pair(spec)
        if (server, client) == (0, 1):  # host 1 is on switch 1: that stream crossed already
            env.update({k.replace("MCCL_BENCH_GOODPUT", "MCCL_BENCH_GOODPUT_UPLINK"): v for k, v in list(env.items())})
        else:
            measure(server, client, "MCCL_BENCH_GOODPUT_UPLINK")
    return env


def _goodput_from_env(key: str) -> dict | None:
    """A goodput the driver measured and handed over in ``key``, ``key``_HOW and ``key``_CPU."""
    how = os.environ.get(key + "_HOW")
    if not how or not os.environ.get(key):
        return None
    cpu = [float(x) for x in os.environ.get(key + "_CPU", "").split(",") if x]
    return {"bits_per_s": cluster.parse_rate(os.environ[key]), "tool": "mccl.cluster", "how": how,
            **(dict(zip(("sender_cpu_pct", "receiver_cpu_pct"), cpu)) if len(cpu) == 2 else {})}


def uplink_goodput() -> dict | None:
    """The goodput across an uplink that the driver measured (several switches, --goodput
    measure), or None; the %goodput columns stay against the host link's goodput."""
    return _goodput_from_env("MCCL_BENCH_GOODPUT_UPLINK")


def placement(groups: Groups) -> dict | None:
    """Where the ranks ran, from every rank's MCCL_CLUSTER_HOST/_SWITCH and the launcher's
    MCCL_CLUSTER_RANK_ORDER (mccl.cluster sets them, whether ``mccl.cluster run`` or ``mccl.bench
    --cluster`` launched): ``{"rank_order", "hosts", "switches"}`` (index: rank), or None when the
    ranks are not in an emulated cluster. Gathered over the control group: every rank calls it."""
    mine = (os.environ.get("MCCL_CLUSTER_HOST"), os.environ.get("MCCL_CLUSTER_SWITCH"))
    every = gather_objects(mine, groups)
    if any(h is None for h, _ in every):
        return None
    return {"rank_order": os.environ.get("MCCL_CLUSTER_RANK_ORDER", "in-order"),
            "hosts": [int(h) for h, _ in every], "switches": [int(k) if k is not None else 0 for _, k in every]}


def placement_line(meta: dict) -> str | None:
    """One header line saying where the ranks ran (from :func:`placement`), or None."""
    pl = meta.get("placement")
    if not pl:
        return None
    several = len(set(pl["switches"])) > 1 or (meta.get("cluster") or {}).get("switches", 1) > 1
    return (f"# ranks: rank order {pl['rank_order']}: "
            + cluster.format_placement(pl["hosts"], pl["switches"] if several else None))


def uplink_goodput_line(meta: dict) -> str | None:
    gp = meta.get("goodput_uplink")
    return f"# goodput across an uplink: {cluster.format_goodput(gp)}, {gp['how']}" if gp else None


def cluster_lines(meta: dict) -> list[str]:
    """The header lines about the emulated cluster, for every benchmark's header: the goodput
    across an uplink and where the ranks ran (each only when known)."""
    return [line for line in (uplink_goodput_line(meta), placement_line(meta)) if line]


# ---------------------------------------------------------------------------------------------
# Metadata
# ---------------------------------------------------------------------------------------------

def run_metadata(groups: Groups, backends: list[str]) -> dict:
    """What a reader needs to judge the numbers: versions, world, machine, load, MCCL_* settings."""
    import torch

    meta = {
        "argv": sys.argv, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "world_size": groups.world,
        "backends": backends, "torch": torch.__version__, "python": platform.python_version(),
        "host": socket.gethostname(), "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("MCCL_", "GLOO_", "OMP_NUM")) and not k.startswith("MCCL_BENCH_")},
        "cpu_source": cpu_source_note(backends),
        "placement": placement(groups),
        "goodput_uplink": uplink_goodput(),
        "init": init_summary(groups),
    }
    if spec := _cluster_layout():
        meta["cluster"] = spec
    if "mccl" in backends:
        import mccl

        meta["mccl"] = ".".join(map(str, mccl.version))
        # Revision of csrc/algo/select.c's rules, for mccl.model.classify: 2 runs medium all-reduces
        # as halving-doubling (files without it predate that).
        meta["algo_select"] = 2
    with contextlib.suppress(Exception):
        meta["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                     timeout=5, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    return meta


def _cluster_layout() -> dict | None:
    """The emulated cluster's layout (id, rates, switches), from its state file, or None."""
    cid = os.environ.get("MCCL_CLUSTER_ID")
    if not cid:
        return None
    try:
        spec = cluster.load_spec(cid)
    except Exception:  # the state file is root's; a rank that cannot read it records nothing
        return None
    return {"id": spec.id, "hosts": spec.hosts, "rate": spec.rate, "switches": spec.switches,
            "hosts_per_switch": spec.hosts_per_switch, "uplink_rate": spec.uplink_rate or None}


def write_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
