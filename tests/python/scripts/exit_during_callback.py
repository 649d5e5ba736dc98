"""A rank of a plain script that leaves while a Future callback of its last collective still runs.

Started by test_callback_order.py as an ordinary process (env:// rendezvous) that never calls
destroy_process_group: the interpreter exits while mccl's completion thread is inside a Python
callback (sleeping, the GIL released), as a user's script that attaches a logging callback and
exits may. Prints LEAVING when its main code ends and CALLBACK <sum> when the callback returns.

torch runs a callback at once, on the attaching thread, when the Future is already complete. So
rank 1 attaches its callback before rank 0 issues the all-reduce (the job's store says when):
rank 1's callback always runs on the completion thread, and its LEAVING always comes first. Rank
0's all-reduce may complete before its callback is attached; its callback then runs inline.

With MCCL_TEST_EXIT_MODE=in_flight no rank waits for its all-reduce, and rank 1 issues its own
only after rank 0 has printed LEAVING (the store says when): rank 0's main code ends with the
collective still in flight, and both callbacks run on the completion thread after LEAVING.

Modes where the exit's first wait (MCCL_EXIT_WAIT_S, set by the test) runs out, so the exit
aborts the groups and then waits for the callbacks; LEAVING carries the clock (time.time()) of
the rank the test times: ``callback_outlives_wait``, rank 1's callback sleeps 3 s (attached
before rank 0 issues, so it runs on the completion thread); ``peer_never_issues``, rank 0's
all-reduce has no partner: rank 1 never issues it and stays alive until the test sets
``test/rank0_gone``; ``queued_callbacks``, every rank leaves 30 all-reduces whose callbacks sleep
0.1 s each; ``in_flight`` with the wait set to 0 by the test (every callback then runs after
the abort, most of them on a failed all-reduce). Every callback that ran prints CALLBACK.
"""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import mccl  # noqa: F401  (registers the backend)

dist.init_process_group("mccl", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                      timeout=timedelta(seconds=60))
t = torch.full((1000,), float(rank + 1))


def callback(fut):
    time.sleep(0.5)  # the main thread reaches the interpreter's exit meanwhile
    total = fut.value()[0]
    print(f"CALLBACK {total[0].item():g}", flush=True)
    return total


mode = os.environ.get("MCCL_TEST_EXIT_MODE", "callback_running")
if mode == "callback_outlives_wait":
    if rank == 0:
        store.wait(["test/attached"])
        dist.all_reduce(t)
        print("LEAVING", flush=True)
    else:
        work = dist.all_reduce(t, async_op=True)
        work.get_future().then(lambda fut: (time.sleep(3), print("CALLBACK", flush=True)))
        store.set("test/attached", "1")
        print(f"LEAVING {time.time()}", flush=True)
elif mode == "queued_callbacks":
    for _ in range(30):
        dist.all_reduce(t.clone(), async_op=True).get_future().then(
            lambda fut: (time.sleep(0.1), print("CALLBACK", flush=True)))
    print(f"LEAVING {time.time()}", flush=True)
elif mode == "peer_never_issues":
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        work.get_future().then(callback)
        print(f"LEAVING {time.time()}", flush=True)
    else:
        print("LEAVING", flush=True)
        store.wait(["test/rank0_gone"])
elif mode == "in_flight":
    if rank == 1:
        store.wait(["test/left"])
    work = dist.all_reduce(t, async_op=True)
    work.get_future().then(callback)
    print("LEAVING", flush=True)
    if rank == 0:
        store.set("test/left", "1")  # rank 1 issues only now: rank 0 leaves with it in flight
else:
    if rank == 0:
        store.wait(["test/attached"])
    work = dist.all_reduce(t, async_op=True)
    work.get_future().then(callback)
    if rank == 1:
        store.set("test/attached", "1")
    work.wait()  # released before the Future's callbacks run
    print("LEAVING", flush=True)
