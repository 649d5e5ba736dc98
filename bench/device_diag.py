"""Where does a CUDA rank's host thread wait? Timestamped runs of the handoff's failing scenarios
(GPU machine), with every rank's native stacks (py-spy, MCCL_PY_SPY) taken by a watchdog when a
step takes over 2 s. Prints one block per case and rank.

    MCCL_PY_SPY=.tools/pyspy/.../py-spy python3 bench/device_diag.py [stall kill abort ...]
"""
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, "tests/python")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from distributed import notify, run_job, run_ranks  # noqa: E402


class Steps:
    """Times each named step; a watchdog dumps this process's native stacks when one hangs > 2 s."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.log, self.cur, self.since = [], None, time.perf_counter()
        self.dumps = []
        threading.Thread(target=self._watch, daemon=True).start()

    def __call__(self, name):
        now = time.perf_counter()
        if self.cur is not None:
            self.log.append(f"{self.cur} {1e3 * (now - self.since):.1f} ms")
        self.cur, self.since = name, now

    def _watch(self):
        spy = os.environ.get("MCCL_PY_SPY")
        seen = None
        while True:
            time.sleep(0.2)
            if self.cur is not None and self.cur != seen and time.perf_counter() - self.since > 2.0:
                seen = self.cur
                if spy:
                    r = subprocess.run([spy, "dump", "--native", "--pid", str(os.getpid())], capture_output=True,
                                       text=True, timeout=30)
                    self.dumps.append(f"-- stuck in '{self.cur}':\n{r.stdout[-6000:]}{r.stderr[-500:]}")

    def done(self):
        self("end")
        return {"steps": self.log, "dumps": self.dumps}


def _stall(rank, ws, warm):
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    t = torch.zeros(1 << 20, device=dev)
    dist.all_reduce(t)
    if warm:
        _ = (t * 2, t + 1, t == 1.0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles = int(10_000_000 * 300 / start.elapsed_time(end))
    dist.barrier()
    s = Steps()
    s("sleep kernel")
    torch.cuda._sleep(cycles)
    s("fill")
    t.fill_(float(rank + 1))
    s("issue")
    w = dist.all_reduce(t, async_op=True)
    s("wait")
    w.wait()
    s("consumer t*2")
    out = t * 2
    s("query")
    busy = not torch.cuda.current_stream().query()
    s("sync")
    torch.cuda.synchronize()
    res = s.done()
    res.update(busy=busy, ok=bool((out == 2.0 * sum(r + 1 for r in range(ws))).all().item()))
    return res


def _lost(rank, ws, how, warm):
    from torch.distributed.distributed_c10d import _abort_process_group

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    x = torch.ones(1 << 16, device=dev)
    dist.all_reduce(x)
    if warm:
        _ = x + 1
    torch.cuda.synchronize()
    if rank == ws - 1:
        notify("ready")
        time.sleep(3600 if how == "kill" else 8)
        return {}
    s = Steps()
    s("issue")
    w = dist.all_reduce(x, async_op=True)
    s("wait")
    w.wait()
    s("x+1")
    after = x + 1
    s("notify")
    notify("queued")
    if how == "abort":
        s("sleep 1")
        time.sleep(1.0)
        s("abort")
        _abort_process_group()
        s("is_completed")
        done = w.is_completed()
    s("sync")
    torch.cuda.synchronize()
    s("error")
    err = ""
    try:
        if how == "abort":
            w.wait()
        else:
            dist.all_reduce(torch.ones(4, device=dev))
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        err = f"{type(exc).__name__}: {str(exc)[:400]}"
    res = s.done()
    res.update(error=err, after=after.numel(), completed_after_abort=done if how == "abort" else None)
    return res


def _kill(job):
    job.wait_for("ready", [2], timeout=60)
    job.wait_for("queued", [0, 1], timeout=40)
    time.sleep(0.5)
    job.signal(2)


CASES = {
    "stall": lambda: run_ranks(_stall, 2, False, deadline_s=60),
    "stall-warm": lambda: run_ranks(_stall, 2, True, deadline_s=60),
    "kill": lambda: run_job(_lost, 3, "kill", False, pg_timeout_s=10, deadline_s=80, driver=_kill)[0],
    "kill-warm": lambda: run_job(_lost, 3, "kill", True, pg_timeout_s=10, deadline_s=80, driver=_kill)[0],
    "abort": lambda: run_job(_lost, 2, "abort", False, pg_timeout_s=60, deadline_s=60,
                             driver=lambda job: job.wait_for("queued", [0], timeout=50))[0],
}

if __name__ == "__main__":
    only = sys.argv[1:] or list(CASES)
    for name in only:
        t0 = time.time()
        try:
            for r in CASES[name]():
                v = r.value or {}
                print(f"== {name} rank {r.rank} ok={r.ok} exit={r.exitcode}", flush=True)
                for k, val in v.items():
                    if k != "dumps":
                        print(f"   {k}: {val}")
                for d in v.get("dumps", []):
                    print(d)
                if not r.ok:
                    print(r.error[-3000:])
        except BaseException as exc:  # noqa: BLE001
            print(f"== {name}: {type(exc).__name__}: {str(exc)[-3000:]}", flush=True)
        print(f"== {name} took {time.time() - t0:.1f} s", flush=True)
