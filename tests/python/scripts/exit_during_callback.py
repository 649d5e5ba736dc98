"""A rank of a plain script that leaves while a Future callback of its last collective still runs.

Started by test_callback_order.py as an ordinary process (env:// rendezvous) that never calls
destroy_process_group: the interpreter exits while mccl's completion thread is inside a Python
callback (sleeping, the GIL released), as a user's script that attaches a logging callback and
exits may. Prints LEAVING when its main code ends and CALLBACK <sum> when the callback returns.

torch runs a callback at once, on the attaching thread, when the Future is already complete. So
rank 1 attaches its callback before rank 0 issues the all-reduce (the job's store says when):
rank 1's callback always runs on the completion thread, and its LEAVING always comes first. Rank
0's all-reduce may complete before its callback is attached; its callback then runs inline.
"""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import mccl  # noqa: F401

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


if rank == 0:
    store.wait(["test/attached"])
work = dist.all_reduce(t, async_op=True)
work.get_future().then(callback)
if rank == 1:
    store.set("test/attached", "1")
work.wait()  # released before the Future's callbacks run
print("LEAVING", flush=True)
