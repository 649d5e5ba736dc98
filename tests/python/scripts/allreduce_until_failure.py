"""A rank of a plain training-like script: 64 MiB all-reduces until one fails, error uncaught.

Started by test_failures.py as an ordinary process (env:// rendezvous), so a failure leaves through
the normal interpreter exit (exception, then shutdown with the process group still alive), as it
would in a user's script. Prints LOOPING after its first all-reduce and RAISED <monotonic> <error>
when one fails.
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import mccl  # noqa: F401

torch.set_num_threads(1)
dist.init_process_group("mccl", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.empty((64 << 20) // 4)
done = 0
try:
    while True:
        t.fill_(rank + 1)
        dist.all_reduce(t)
        assert bool((t == world * (world + 1) // 2).all()), "wrong all-reduce result"
        done += 1
        if done == 1:
            print("LOOPING", flush=True)
except Exception as exc:
    print(f"RAISED {time.monotonic():.6f} {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    raise  # uncaught: the interpreter exits with status 1 and whatever is left alive
