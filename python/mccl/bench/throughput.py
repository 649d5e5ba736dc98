"""DDP training throughput (samples/s) from 1 to N ranks, and scaling efficiency, per backend.

Every rank trains the same model with DistributedDataParallel (``bucket_cap_mb`` = ``--bucket-mb``)
on synthetic data that lives in memory (no loader cost), for ``--warmup-steps`` untimed and
``--steps`` timed steps per backend, the backends one after the other in the same processes. The
timed interval starts and ends with a barrier on the control group, so it is the slowest rank's.
``samples/s = world x --batch x --steps / interval``; the scaling efficiency of N ranks is
samples/s(N) / (N x samples/s(1)) for the same backend (the paper's "% of linear").

In driver mode the command starts one job per world size in ``--world-sizes`` (locally, or on
the first hosts of ``--cluster``) and prints one table; under torchrun or
``python -m mccl.cluster run`` it measures the world size it was started with.

Models (``--model``): ``mlp`` (``--depth`` linear layers of ``--width``, GELU), or ``convnet``, a
GroupNorm ResNet on 3x32x32 inputs (the paper's convergence model, scaled by ``--width``/64).

``--device cuda`` puts the model, its gradients (so DDP's buckets) and the data on the GPU (rank r
on CUDA device LOCAL_RANK % device_count); every step ends with ``torch.cuda.synchronize()``, so
the interval covers the device's work, not only its launch.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .. import _cli
from . import runtime


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training")
    g.add_argument("--world-sizes", type=_cli.int_list(1, what="world size"), default=None,
                   help="driver mode: comma-separated world sizes (default 1, 2, 4, ... up to --nproc, and --nproc)")
    g.add_argument("--model", default="mlp", choices=["mlp", "convnet"], help="model to train")
    g.add_argument("--width", type=_cli.int_at_least(1), default=2048,
                   help="mlp: layer width; convnet: base channels x 64/64")
    g.add_argument("--depth", type=_cli.int_at_least(1), default=4, help="mlp: number of linear layers")
    g.add_argument("--batch", type=_cli.int_at_least(1), default=32, help="samples per rank per step")
    g.add_argument("--device", default="cpu", choices=list(runtime.DEVICES),
                   help="where the model, its gradients and the data live (cuda: device LOCAL_RANK %% device_count)")
    g.add_argument("--bucket-mb", type=_cli.number_at_least(0, above=True, what="size in MiB"), default=25.0,
                   help="DDP bucket_cap_mb")
    g.add_argument("--steps", type=_cli.int_at_least(1), default=10, help="timed steps per backend")
    g.add_argument("--warmup-steps", type=_cli.int_at_least(0), default=3, help="untimed steps per backend first")
    g.add_argument("--json", type=_cli.output_file, default=None, help="write all results and metadata to this file")
    g.add_argument("--plot", type=_cli.output_file, default=None, help="write a PNG of samples/s vs ranks with linear scaling")
    g.add_argument("--result-file", default=None, help=argparse.SUPPRESS)  # driver <- rank 0


def _block(cin: int, cout: int, stride: int) -> nn.Module:
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.GroupNorm(min(8, cout), cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.GroupNorm(min(8, cout), cout))
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(min(8, cout), cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    return Block()


def build_model(args) -> tuple[nn.Module, tuple[int, ...], int]:
    """The model, the shape of one input sample, and the number of classes."""
    torch.manual_seed(0)
    if args.model == "mlp":
        layers = []
        for _ in range(args.depth - 1):
            layers += [nn.Linear(args.width, args.width), nn.GELU()]
        layers.append(nn.Linear(args.width, 10))
        return nn.Sequential(*layers), (args.width,), 10
    c = max(8, args.width * 64 // 2048)  # --width 2048 (the default) -> 64 base channels
    widths = [c, 2 * c, 4 * c, 8 * c]
    layers = [nn.Conv2d(3, c, 3, 1, 1, bias=False), nn.GroupNorm(8, c), nn.ReLU()]
    cin = c
    for i, w in enumerate(widths):
        layers += [_block(cin, w, 1 if i == 0 else 2), _block(w, w, 1)]
        cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
    return nn.Sequential(*layers), (3, 32, 32), 10


def measure(backend: str, groups: runtime.Groups, args, dev: torch.device | None = None) -> dict:
    dev = dev or torch.device("cpu")
    model, shape, classes = build_model(args)
    params = sum(p.numel() for p in model.parameters())
    model = model.to(dev)
    ddp = DistributedDataParallel(model, process_group=groups.by_backend[backend], bucket_cap_mb=args.bucket_mb,
                                  device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + groups.rank)
    x = torch.randn(args.batch, *shape, generator=gen).to(dev)
    y = torch.randint(0, classes, (args.batch,), generator=gen).to(dev)
    step_times = []

    def step():
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        runtime.sync(dev)  # the step is done when its results are on the device
        step_times.append(time.perf_counter() - t0)

    for _ in range(args.warmup_steps):
        step()
    step_times.clear()
    dist.barrier(group=groups.control)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier(group=groups.control)
    interval = time.perf_counter() - t0
    interval = max(runtime.gather_objects(interval, groups))
    return {"backend": backend, "world_size": groups.world, "device": dev.type, "params": params,
            "grad_mib": params * 4 / 2 ** 20,
            "samples_per_s": groups.world * args.batch * args.steps / interval, "interval_s": interval,
            "step_ms_median_rank0": statistics.median(step_times) * 1e3}


def main(args) -> int:
    """Rank mode: one world size, every backend; rank 0 prints (and writes --result-file)."""
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    torch.set_num_threads(args.threads)
    backends = runtime.split_backends(args.backends)
    dev = runtime.rank_device(args.device)
    groups = runtime.init_groups(backends, args.pg_timeout)
    meta = runtime.run_metadata(groups, backends)
    meta.update(runtime.device_meta(dev, groups))
    rows = [measure(b, groups, args, dev) for b in backends]
    if groups.rank == 0:
        for r in rows:
            print(f"# throughput {r['backend']}: {r['world_size']} ranks, {r['samples_per_s']:.1f} samples/s "
                  f"({args.model}, {r['params'] / 1e6:.1f}M params, batch {args.batch}/rank, {dev.type})", flush=True)
        if args.result_file:
            with open(args.result_file, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f)
    dist.barrier(group=groups.control)
    dist.destroy_process_group()
    return 0


def world_sizes(args, nproc: int) -> list[int]:
    if args.world_sizes:
        return list(dict.fromkeys(args.world_sizes))  # each once, in the order given
    sizes, w = [], 1
    while w < nproc:
        sizes.append(w)
        w *= 2
    return sizes + [nproc]


def drive(args, argv: list[str]) -> int:
    """Driver mode: one job per world size; print the table of samples/s and efficiency."""
    try:
        _, nproc = runtime.driver_spec(args)
    except Exception as exc:
        print(f"mccl.bench: error: {exc}", file=sys.stderr)
        return 2
    backends = runtime.split_backends(args.backends)
    rows, meta = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for ws in world_sizes(args, nproc):
            result = os.path.join(tmp, f"ws{ws}.json")
            rc = runtime.relaunch([*argv, "--result-file", result], args, world_size=ws)
            if rc != 0:
                print(f"mccl.bench throughput: the {ws}-rank job failed (exit {rc})", file=sys.stderr)
                return rc
            with open(result) as f:
                data = json.load(f)
            rows += data["rows"]
            meta = meta or data["meta"]
    base = {r["backend"]: r["samples_per_s"] for r in rows if r["world_size"] == 1}
    for r in rows:
        b1 = base.get(r["backend"])
        r["efficiency_pct"] = 100 * r["samples_per_s"] / (r["world_size"] * b1) if b1 else None
    print_table(rows, backends, args)
    if args.json:
        runtime.write_json(args.json, {"meta": meta, "args": vars(args), "results": rows})
        print(f"# wrote {args.json}")
    if args.plot:
        plot(rows, backends, args, args.plot)
        print(f"# wrote {args.plot}")
    return 0


def print_table(rows: list[dict], backends: list[str], args) -> None:
    from rich.table import Table

    from .report import console

    t = Table(title=f"throughput: {args.model}, batch {args.batch}/rank, {args.steps} steps, {args.device}",
              title_justify="left")
    t.add_column("ranks", justify="right")
    for b in backends:
        t.add_column(f"{b}\nsamples/s", justify="right")
        t.add_column(f"{b}\nefficiency %", justify="right")
    if len(backends) > 1:
        t.add_column(f"{backends[0]}/{backends[1]}", justify="right")
    for ws in sorted({r["world_size"] for r in rows}):
        by = {r["backend"]: r for r in rows if r["world_size"] == ws}
        cells = [str(ws)]
        for b in backends:
            r = by[b]
            cells += [f"{r['samples_per_s']:.1f}", "-" if r["efficiency_pct"] is None else f"{r['efficiency_pct']:.1f}"]
        if len(backends) > 1:
            cells.append(f"{by[backends[0]]['samples_per_s'] / by[backends[1]]['samples_per_s']:.2f}")
        t.add_row(*cells)
    console().print(t)
    console().print("# efficiency = samples/s(N) / (N x samples/s(1)) of the same backend")


def plot(rows: list[dict], backends: list[str], args, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for b in backends:
        pts = sorted((r["world_size"], r["samples_per_s"]) for r in rows if r["backend"] == b)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=b)
        one = next((s for w, s in pts if w == 1), None)
        if one:
            ax.plot([p[0] for p in pts], [one * p[0] for p in pts], ls=":", color="grey",
                    label="linear from 1 rank" if b == backends[0] else None)
    ax.set_xlabel("ranks")
    ax.set_ylabel("samples / s")
    ax.set_title(f"DDP throughput, {args.model}, batch {args.batch}/rank, {args.device}")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
