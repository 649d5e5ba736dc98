"""Run a function on N ranks in fresh processes, each with a deadline, and collect what each returns.

Every multi-process test goes through :func:`run_ranks`: it starts ``world_size`` processes, each
initialises ``backend`` over a FileStore (no port races between concurrent tests) or a TCPStore the
parent hosts, calls ``fn(rank, world_size, *args)`` and sends back its return value or its exception
text. The parent kills every process that is still alive when the deadline passes, or when anything
else goes wrong, and fails the test, so no test can hang.

Failure-injection tests also pass a ``driver``: it runs in the parent on a thread while the ranks
run and gets a :class:`Job`, with which it waits for events the ranks send (:func:`notify`), kills
or stops rank processes, and reads the job's store. ``start_method="forkserver"`` starts ranks by
forking a server that has imported torch and mccl once (a tenth of a second per rank instead of
seconds), for tests that start many jobs.
"""
from __future__ import annotations

import hashlib
import io
import multiprocessing as mp
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable


@dataclass
class RankResult:
    rank: int
    ok: bool
    value: Any = None
    error: str = ""
    elapsed: float = 0.0
    exitcode: int | None = None  # the process's exit status (negative: killed by that signal)


@dataclass
class Event:
    """Something a rank told the parent through :func:`notify`."""

    rank: int
    kind: str
    time: float  # time.monotonic() in the rank (CLOCK_MONOTONIC: comparable across processes)
    data: dict = field(default_factory=dict)


_events = None  # the parent's event queue, in a rank process
_rank = -1
_raw_store = None


def notify(kind: str, **data) -> None:
    """From a rank: tell the parent's driver that ``kind`` happened (with ``data``, picklable)."""
    if _events is not None:
        _events.put(Event(_rank, kind, time.monotonic(), data))


def raw_store():
    """From a rank: the job's store without torch's prefixes (for a test's own keys)."""
    return _raw_store


def _die_with_parent() -> None:
    # A rank whose parent died (a killed pytest) must not outlive it: ask the kernel for SIGKILL.
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            pass


def _entry(fn, rank, world_size, store_spec, backend, pg_timeout_s, args, out, events, pre_init,
           exit_code_on_error, env):
    global _events, _rank, _raw_store
    _events, _rank = events, rank
    _die_with_parent()
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent's hang report (_dump_stacks)
    start = time.monotonic()
    failed = False
    try:
        os.environ.update(env)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend == "mccl":
            import mccl  # noqa: F401  (registers the backend)
        kind, where = store_spec
        if kind == "tcp":
            _raw_store = dist.TCPStore("127.0.0.1", where, is_master=False,
                                       timeout=timedelta(seconds=pg_timeout_s))
        if pre_init is not None:
            pre_init(rank, world_size)
        if backend is not None:
            init = {"store": _raw_store} if kind == "tcp" else {"init_method": f"file://{where}"}
            dist.init_process_group(backend, rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=pg_timeout_s), **init)
        value = fn(rank, world_size, *args)
        # Tensors travel as bytes: torch's queue pickling would hand over shared-memory file
        # descriptors that die with this process.
        buf = io.BytesIO()
        torch.save(value, buf)
        out.put(RankResult(rank, True, buf.getvalue(), elapsed=time.monotonic() - start))
        if backend is not None and dist.is_initialized():
            dist.destroy_process_group()
    except BaseException as exc:  # reported to the parent, which fails the test
        failed = True
        out.put(RankResult(rank, False, error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}",
                           elapsed=time.monotonic() - start))
    if failed and exit_code_on_error is not None:
        # Like a script whose exception nobody caught: flush the report and the events (a queue's
        # feeder thread may not have run yet: os._exit would drop what it holds), then exit non-zero.
        for q in (events, out):
            q.close()
            q.join_thread()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code_on_error)


class Job:
    """The parent's handle on running ranks, for a driver (see :func:`run_ranks`)."""

    def __init__(self, procs, events, store, deadline):
        self.procs = procs
        self._events = events
        self.store = store  # the TCPStore the parent hosts (store="tcp"), else None
        self.deadline = deadline  # time.monotonic() when the whole job is killed
        self.seen: list[Event] = []
        self.finished = threading.Event()  # set once every rank reported or exited

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def signal(self, rank: int, sig: int = signal.SIGKILL) -> float:
        """Send ``sig`` to rank's process; returns the time.monotonic() just before sending."""
        now = time.monotonic()
        os.kill(self.procs[rank].pid, sig)
        return now

    def next_event(self, timeout: float) -> Event | None:
        try:
            ev = self._events.get(timeout=max(0.0, min(timeout, self.deadline - time.monotonic())))
        except queue.Empty:
            return None
        self.seen.append(ev)
        return ev

    def wait_for(self, kind: str, ranks, timeout: float = 60.0) -> dict[int, Event]:
        """Wait until each of ``ranks`` has sent an event ``kind``; returns them by rank."""
        want = set(ranks)
        got = {ev.rank: ev for ev in self.seen if ev.kind == kind and ev.rank in want}
        until = time.monotonic() + timeout
        while set(got) != want:
            left = until - time.monotonic()
            missing = sorted(want - set(got))
            # A rank that exited cannot send it any more (once its last events were read).
            dead = [r for r in missing if self.procs[r].exitcode is not None]
            if left <= 0 or dead and self._events.empty() or self.finished.is_set() and self._events.empty():
                states = ", ".join(f"rank {r} " + ("running" if self.procs[r].exitcode is None
                                                   else f"exited with code {self.procs[r].exitcode}")
                                   for r in missing)
                # Where the ranks that are still running are stuck, before the job is killed.
                _dump_stacks(self.procs, [r for r in missing if self.procs[r].exitcode is None])
                raise AssertionError(f"ranks {missing} never sent '{kind}' ({states}; events so far: "
                                     f"{[(e.rank, e.kind) for e in self.seen]})")
            ev = self.next_event(min(left, 0.2))
            if ev is not None and ev.kind == kind and ev.rank in want:
                got[ev.rank] = ev
        return got

    def backend_store(self):
        """With store="tcp": the store the default group's backend sees (the prefixes torch adds
        for group "0" on cpu when init_process_group is given a store)."""
        import torch.distributed as dist

        return dist.PrefixStore("cpu/", dist.PrefixStore("0/", self.store))


_forkserver_ready = False


def _context(start_method: str):
    global _forkserver_ready
    ctx = mp.get_context(start_method)
    if start_method == "forkserver" and not _forkserver_ready:
        # Imported once in the server; every rank is then a fork of it.
        ctx.set_forkserver_preload(["torch", "torch.distributed", "mccl", "distributed"])
        _forkserver_ready = True
    return ctx


def _dump_stacks(procs, ranks) -> None:
    """Before a hung job is killed: every thread's Python stack of each rank in ``ranks`` on stderr
    (faulthandler, SIGUSR1), and, where py-spy is on PATH (or MCCL_PY_SPY names it), each rank's
    native and Python stacks too, so a hang's report says where every thread was."""
    import shutil
    import subprocess

    spy = os.environ.get("MCCL_PY_SPY") or shutil.which("py-spy")
    for r in ranks:
        p = procs[r]
        if p.pid is None or not p.is_alive():
            continue
        sys.stderr.write(f"==== rank {r} (pid {p.pid}) hung: its threads ====\n")
        sys.stderr.flush()
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except OSError:
            continue
        time.sleep(1.0)
        if spy:
            try:
                res = subprocess.run([spy, "dump", "--native", "--pid", str(p.pid)], capture_output=True,
                                     text=True, timeout=30)
                sys.stderr.write(res.stdout + res.stderr)
            except (OSError, subprocess.SubprocessError) as exc:
                sys.stderr.write(f"py-spy failed: {exc}\n")
        sys.stderr.flush()


def run_job(fn: Callable, world_size: int, *args, backend: str | None = "mccl",
            deadline_s: float = 120.0, pg_timeout_s: float = 60.0, store: str = "file",
            driver: Callable[[Job], Any] | None = None, pre_init: Callable | None = None,
            start_method: str = "spawn", exit_code_on_error: int | None = None,
            env: dict | None = None) -> tuple[list[RankResult], Any]:
    """:func:`run_ranks` that also returns what ``driver(job)`` returned.

    ``store``: "file" (a FileStore in a temporary folder) or "tcp" (a TCPStore hosted by the
    parent, ``job.store``). ``pre_init(rank, world_size)`` runs in each rank before
    ``init_process_group`` (``raw_store()`` is usable there with store="tcp"). With
    ``exit_code_on_error``, a rank whose ``fn`` raised exits with that status after reporting.
    ``env`` is added to each rank's environment (a forkserver's ranks do not see later changes
    to the parent's ``os.environ``).
    """
    ctx = _context(start_method)
    out, events = ctx.Queue(), ctx.Queue()
    driver_result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        host = None
        if store == "tcp":
            import torch.distributed as dist

            host = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                 timeout=timedelta(seconds=pg_timeout_s))
            spec = ("tcp", host.port)
        else:
            spec = ("file", os.path.join(tmp, "store"))
        procs = [ctx.Process(target=_entry, args=(fn, r, world_size, spec, backend, pg_timeout_s, args, out,
                                                  events, pre_init, exit_code_on_error, dict(env or {})),
                             daemon=True) for r in range(world_size)]
        results: dict[int, RankResult] = {}
        # MCCL_TEST_DEADLINE_CAP_S shortens every job's deadline (a device run that must fit its slot).
        cap = float(os.environ.get("MCCL_TEST_DEADLINE_CAP_S", "0") or 0)
        if cap > 0:
            deadline_s = min(deadline_s, cap)
        until = time.monotonic() + deadline_s
        job = Job(procs, events, host, until)
        thread = None
        clean = False  # every rank reported: give them time to exit on their own
        try:
            for p in procs:
                p.start()
            if driver is not None:
                def drive():
                    try:
                        driver_result["value"] = driver(job)
                    except BaseException as exc:  # re-raised in the parent after cleanup
                        driver_result["error"] = exc
                thread = threading.Thread(target=drive, name="rank-driver", daemon=True)
                thread.start()
            while len(results) < world_size:
                if "error" in driver_result:
                    break  # the driver failed: stop the ranks now, then raise its error
                left = until - time.monotonic()
                if left <= 0:
                    _dump_stacks(procs, sorted(set(range(world_size)) - set(results)))
                    raise AssertionError(f"deadline of {deadline_s:.0f} s passed; ranks "
                                         f"{sorted(set(range(world_size)) - set(results))} never finished (hang)")
                try:
                    res = out.get(timeout=min(left, 0.5))
                    results[res.rank] = res
                    continue
                except queue.Empty:
                    pass
                # A rank that exited without reporting (killed, os._exit) gets a failed result;
                # give its queue a moment first, since a put may still be in flight.
                gone = [r for r, p in enumerate(procs) if r not in results and not p.is_alive()]
                if gone:
                    time.sleep(0.5)
                    while True:
                        try:
                            res = out.get(timeout=0.1)
                        except queue.Empty:
                            break
                        results[res.rank] = res
                    for r in gone:
                        if r not in results:
                            results[r] = RankResult(r, False, error=f"exited with code {procs[r].exitcode} without reporting")
            job.finished.set()
            if thread is not None:
                thread.join(timeout=max(0.0, until - time.monotonic()))
                if thread.is_alive():
                    raise AssertionError(f"deadline of {deadline_s:.0f} s passed with the test's driver still running")
            clean = "error" not in driver_result
        finally:
            job.finished.set()
            grace_until = min(time.monotonic() + 10.0, until) if clean else 0.0
            for p in procs:
                if p.pid is not None:
                    p.join(timeout=max(0.0, grace_until - time.monotonic()))
            for p in procs:
                if p.is_alive():
                    p.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
                    p.join()
            for r, p in enumerate(procs):
                if r in results:
                    results[r].exitcode = p.exitcode
    if "error" in driver_result:
        raise driver_result["error"]
    import torch

    for res in results.values():
        if res.ok:
            res.value = torch.load(io.BytesIO(res.value), weights_only=False)
    return [results[r] for r in range(world_size)], driver_result.get("value")


def run_ranks(fn: Callable, world_size: int, *args, **options) -> list[RankResult]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` new rank processes.

    Returns one :class:`RankResult` per rank, in rank order; a rank that exited without reporting
    gets ``ok=False``. Raises ``AssertionError`` when the deadline passes (after killing every rank
    still running). Options (``backend``, ``deadline_s``, ``pg_timeout_s``, ``store``, ``driver``,
    ``pre_init``, ``start_method``, ``exit_code_on_error``, ``env``) are :func:`run_job`'s.
    """
    return run_job(fn, world_size, *args, **options)[0]


def start_script_ranks(script: str, world_size: int, **popen) -> tuple[Any, list]:
    """Start ``scripts/<script>`` as ``world_size`` plain processes, as torchrun's agent would: each
    reads RANK, LOCAL_RANK and WORLD_SIZE and rendezvouses with ``env://`` on a TCPStore this process
    hosts (MASTER_ADDR/MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE). No harness runs in them, so they
    leave through the interpreter's own exit, as a user's script does. ``popen`` goes to every
    ``subprocess.Popen`` (text mode). Returns (store, procs): keep the store referenced while the
    ranks run; the caller waits for the processes and kills those left."""
    import subprocess
    from datetime import timedelta

    import torch.distributed as dist

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", script)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE=str(world_size),
               TORCHELASTIC_USE_AGENT_STORE="True")
    procs: list = []
    try:
        for r in range(world_size):
            procs.append(subprocess.Popen([sys.executable, path], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                          text=True, **popen))
    except BaseException:
        for p in procs:
            p.kill()
            p.wait()
        raise
    return store, procs


def check_ok(results: list[RankResult]) -> list[Any]:
    """Assert every rank succeeded; return their values in rank order."""
    failures = [f"rank {r.rank}: {r.error}" for r in results if not r.ok]
    assert not failures, "\n".join(failures)
    return [r.value for r in results]


def digest(tensor) -> str:
    """A digest of a tensor's bytes, to compare ranks bitwise."""
    import torch

    t = tensor.detach().contiguous().cpu().view(-1)
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()
