"""Run device test bodies one by one and print every rank's outcome at once (GPU machine)."""
import sys, time
sys.path.insert(0, "tests/python")
from distributed import run_ranks, run_job
import test_devices as T

CASES = [
    ("async_burst", lambda: run_ranks(T._on_device, 3, "cuda", "test_collectives", "_async_burst", deadline_s=60)),
    ("rest_of_surface", lambda: run_ranks(T._on_device, 3, "cuda", "test_collectives", "_rest_of_surface", deadline_s=90)),
    ("no_host_stall", lambda: run_ranks(T._no_host_stall, 2, deadline_s=60)),
    ("race_burst", lambda: run_ranks(T._race_burst, 3, "cuda", deadline_s=90)),
    ("mixed", lambda: run_ranks(T._mixed, 4, deadline_s=90)),
    ("abort", lambda: run_job(T._queued_then_lost, 2, "abort", pg_timeout_s=60, deadline_s=60,
                              driver=lambda job: job.wait_for("queued", [0], timeout=50))[0]),
]
if __name__ == "__main__":
    only = sys.argv[1:]
    for name, fn in CASES:
        if only and name not in only:
            continue
        t0 = time.time()
        try:
            res = fn()
            for r in res:
                print(f"== {name} rank {r.rank} ok={r.ok} exit={r.exitcode} value={str(r.value)[:600]}\n{r.error[-2500:]}", flush=True)
        except BaseException as exc:
            print(f"== {name}: {type(exc).__name__}: {str(exc)[-3000:]}", flush=True)
        print(f"== {name} took {time.time() - t0:.1f} s", flush=True)
