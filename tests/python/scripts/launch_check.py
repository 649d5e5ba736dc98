"""Run under torchrun by test_launchers.py: barrier, send [1, 2, 3] from rank 0 to 1, all_reduce.

Prints one line per rank: ``RESULT <rank> <world> <sum> <received>``.
"""
import os

import torch
import torch.distributed as dist

import mccl  # noqa: F401

dist.init_process_group("mccl")
rank, world = dist.get_rank(), dist.get_world_size()
dist.barrier()
received = []
if world > 1:
    if rank == 0:
        dist.send(torch.tensor([1, 2, 3]), dst=1)
    elif rank == 1:
        buf = torch.zeros(3, dtype=torch.int64)
        dist.recv(buf, src=0)
        received = buf.tolist()
t = torch.full((1000,), float(rank + 1) + float(os.environ.get("JOB_OFFSET", "0")))
dist.all_reduce(t)
print(f"RESULT {rank} {world} {t[0].item():g} {received}", flush=True)
dist.destroy_process_group()
