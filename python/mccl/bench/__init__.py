"""Benchmarks of MCCL against other torch.distributed backends (``python -m mccl.bench --help``).

- ``python -m mccl.bench [options]``: collectives (all-reduce, all-gather, reduce-scatter,
  broadcast, all-to-all) from 1 KiB to 256 MiB, nccl-tests' table for every backend side by side,
  busbw as a percentage of the TCP goodput measured in the same run, ``#wrong`` from an exact
  check pass, CPU and memory per rank, JSON and a PNG plot (:mod:`mccl.bench.collectives`).
- ``python -m mccl.bench overlap [options]``: the paper's Fig. 3 (right): a synthetic step of
  25 MB buckets timed as compute only, communication only, DDP-style overlapped and serialized,
  and the share of communication hidden (:mod:`mccl.bench.overlap`).
- ``python -m mccl.bench throughput [options]``: DDP training samples/s over 1..N ranks and the
  scaling efficiency, per backend (:mod:`mccl.bench.throughput`).
- ``python -m mccl.bench ddp [options]``: a ViT-B/16 DDP training step (timm's, or a built-in one
  of the same shape) timed as compute only, DDP per backend and the paper's manual staged
  reducer, with a check that the parameters stay bitwise equal on all ranks
  (:mod:`mccl.bench.ddp`).

``--device cuda`` puts the tensors under test on the GPU (rank r on CUDA device
LOCAL_RANK % device_count) and ends every timed call with ``torch.cuda.synchronize()``.

Each runs under torchrun, under ``python -m mccl.cluster run``, or starts its own ranks
(``--nproc N`` on this machine, ``--cluster ID`` in an emulated cluster); see docs/PERFORMANCE.md.
"""
