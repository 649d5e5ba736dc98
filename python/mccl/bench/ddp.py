"""DDP training step of a Vision Transformer: no communication, DDP per backend, and the paper's
manual staged reducer, timed step by step in the same processes.

Model (``--model``): ``timm:NAME`` (a timm model built with ``pretrained=False``; the default is
``timm:vit_base_patch16_224`` when timm is importable), ``vit_b16`` (a ViT written here in plain
torch with ViT-B/16's shape: image 224, patch 16, dim 768, depth 12, 12 heads, MLP 3072, 1000
classes, 86.6M parameters, the same count as timm's) or ``tiny`` (image 32, patch 4, dim 192,
depth 4, 3 heads, MLP 768, 10 classes: 1.8M parameters, for quick CPU runs). fp32; every rank has
its own synthetic batch of ``--batch`` images and labels (seeded by ``--seed`` and the rank),
cross-entropy loss, SGD with lr ``--lr`` (0.01).

A step is forward + backward + optimizer step, timed in these variants:

- ``compute``: the plain model, no communication (what the step costs without any);
- ``ddp-<backend>``, one per backend of ``--backends``: the model in torch's
  DistributedDataParallel over a process group of that backend (``bucket_cap_mb`` =
  ``--bucket-mb``), gradients on ``--device``;
- ``manual``: the paper's manual staged reducer: no DDP; after backward the device is
  synchronized, then the gradients, in buckets of ``--bucket-mb`` MiB in reverse parameter order
  (a bucket closes once it reaches the cap, as DDP's do), are each flattened, copied to a CPU
  tensor, all-reduced (SUM) on a CPU gloo group of their own, divided by the world size and copied
  back into the gradients, one bucket after the other; then the optimizer step.

Each variant has its own copy of the model and optimizer, from the same initial weights, so they
do not interfere. The variants alternate step by step (``--warmup-steps`` untimed rounds, then
``--steps`` timed ones), so drifting machine load touches all alike. Each step starts after a
barrier on the control group (gloo) and ends when its results are on the device (with
``--device cuda``, ``torch.cuda.synchronize()``); its time is the slowest rank's. Reported per
variant: median and mean ms/step, samples/s = ranks x batch / median step time, the ratio of its
median to that of ``ddp-mccl`` (gloo-DDP / mccl-DDP, manual / mccl-DDP), and what it adds to the
compute-only step. Once, after the warm-up (after the first step without one), every distributed
variant's parameters are hashed (SHA-256 of every parameter's bytes) and the hashes gathered: they
must be bitwise equal on all ranks, else the run fails.
"""
from __future__ import annotations

import argparse
import copy
import faulthandler
import hashlib
import importlib.util
import itertools
import os
import statistics
import sys
import threading
import time
import warnings
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .. import _cli
from . import runtime


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ViTSpec:
    """The shape of a Vision Transformer (Dosovitskiy et al. 2021, Table 1)."""

    image: int
    patch: int
    dim: int
    depth: int
    heads: int
    mlp: int
    classes: int


VIT_SPECS = {
    "vit_b16": ViTSpec(image=224, patch=16, dim=768, depth=12, heads=12, mlp=3072, classes=1000),
    "tiny": ViTSpec(image=32, patch=4, dim=192, depth=4, heads=3, mlp=768, classes=10),
}
TIMM_DEFAULT = "timm:vit_base_patch16_224"


class Attention(nn.Module):
    """Multi-head self-attention with one qkv projection, as timm's ViT (same parameters)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A Vision Transformer in plain torch: patch embedding (a strided convolution), a class
    token, learned position embeddings, ``depth`` blocks, a final norm and a linear head on the
    class token. Input (B, 3, image, image) float; output (B, classes) logits."""

    def __init__(self, spec: ViTSpec):
        super().__init__()
        if spec.image % spec.patch or spec.dim % spec.heads:
            raise ValueError(f"{spec}: image must be a multiple of patch and dim of heads")
        tokens = (spec.image // spec.patch) ** 2 + 1
        self.patch_embed = nn.Conv2d(3, spec.dim, spec.patch, stride=spec.patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, spec.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, spec.dim))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.blocks = nn.Sequential(*[Block(spec.dim, spec.heads, spec.mlp) for _ in range(spec.depth)])
        self.norm = nn.LayerNorm(spec.dim, eps=1e-6)
        self.head = nn.Linear(spec.dim, spec.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


def timm_available() -> bool:
    return importlib.util.find_spec("timm") is not None


def model_arg(text: str) -> str:
    """argparse type of ``--model``: ``timm:NAME`` (timm must be importable) or a built-in name."""
    text = text.strip()
    if text.startswith("timm:"):
        if not text[5:]:
            raise argparse.ArgumentTypeError("timm: needs a model name, e.g. timm:vit_base_patch16_224")
        if not timm_available():
            raise argparse.ArgumentTypeError(f"{text}: timm is not installed here; use vit_b16 (the same shape, "
                                             f"plain torch) or tiny")
        return text
    if text not in VIT_SPECS:
        raise argparse.ArgumentTypeError(f"{text!r}: choose timm:NAME, {', '.join(VIT_SPECS)}")
    return text


@dataclass
class ModelInfo:
    model: nn.Module
    #: one sample's shape, (3, H, W)
    input_shape: tuple[int, ...]
    classes: int
    #: what was built, for the header and the JSON
    description: str


def build_model(name: str, image_size: int | None = None, classes: int | None = None, seed: int = 0) -> ModelInfo:
    """The model ``name`` (see :func:`model_arg`) on the CPU, initialized from ``seed``; the same
    on every rank. ``image_size``/``classes`` override the model's own."""
    torch.manual_seed(seed)
    if name.startswith("timm:"):
        import timm

        kw = {"pretrained": False}  # no download: the machines have no network
        if classes:
            kw["num_classes"] = classes
        if image_size:
            kw["img_size"] = image_size
        model = timm.create_model(name[5:], **kw)
        cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
        shape = tuple(cfg.get("input_size", (3, 224, 224)))
        if image_size:
            shape = (shape[0], image_size, image_size)
        return ModelInfo(model, shape, model.num_classes, f"{name} (timm {timm.__version__})")
    spec = VIT_SPECS[name]
    spec = replace(spec, image=image_size or spec.image, classes=classes or spec.classes)
    return ModelInfo(ViT(spec), (3, spec.image, spec.image), spec.classes,
                     f"{name} (built-in ViT: image {spec.image}, patch {spec.patch}, dim {spec.dim}, depth "
                     f"{spec.depth}, heads {spec.heads}, MLP {spec.mlp}, {spec.classes} classes)")


# ---------------------------------------------------------------------------------------------
# The manual staged reducer
# ---------------------------------------------------------------------------------------------

def grad_buckets(params: list[nn.Parameter], cap_bytes: int) -> list[list[nn.Parameter]]:
    """``params`` in reverse order (the order backward produces their gradients), cut into buckets
    that close once they hold ``cap_bytes`` or more, as DDP's bucket assignment does (without
    DDP's small first bucket). Every parameter is in exactly one bucket."""
    buckets, cur, size = [], [], 0
    for p in reversed(params):
        cur.append(p)
        size += p.numel() * p.element_size()
        if size >= cap_bytes:
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    return buckets


class StagedReducer:
    """The paper's manual reducer: each bucket of gradients through a CPU tensor, all-reduced on a
    gloo group, averaged and copied back (one bucket after the other, nothing overlapped)."""

    def __init__(self, params: list[nn.Parameter], cap_bytes: int, group, world: int):
        self.buckets = grad_buckets(params, cap_bytes)
        dtype = params[0].dtype
        #: one CPU tensor per bucket, allocated once
        self.host = [torch.empty(sum(p.numel() for p in b), dtype=dtype) for b in self.buckets]
        self.group, self.world = group, world

    def reduce(self, dev: torch.device) -> None:
        runtime.sync(dev)  # backward has finished on the device
        for params, host in zip(self.buckets, self.host):
            for p in params:
                if p.grad is None:  # an unused parameter contributes zeros, as DDP's buckets do
                    p.grad = torch.zeros_like(p)
            grads = [p.grad for p in params]
            if dev.type == "cpu":
                torch.cat([g.reshape(-1) for g in grads], out=host)
                flat = host
            else:
                flat = torch.cat([g.reshape(-1) for g in grads])
                host.copy_(flat)  # device -> pageable host memory: waits for the copy
            dist.all_reduce(host, group=self.group)
            host.div_(self.world)
            if flat is not host:
                flat.copy_(host)
            for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(piece.view_as(g))


# ---------------------------------------------------------------------------------------------
# Variants and the step
# ---------------------------------------------------------------------------------------------

@dataclass
class Variant:
    name: str
    #: what forward runs on: the DDP wrapper, or the plain module
    model: nn.Module
    #: the plain module (its parameters)
    module: nn.Module
    opt: torch.optim.Optimizer
    reducer: StagedReducer | None = None
    distributed: bool = True
    last_loss: torch.Tensor | None = None


def variant_names(text: str, backends: list[str]) -> list[str]:
    """``--variants``: compute, ddp (one per backend), ddp-BACKEND, manual; in the given order."""
    names = []
    for v in (x.strip() for x in text.split(",") if x.strip()):
        if v == "ddp":
            names += [f"ddp-{b}" for b in backends]
        elif v in ("compute", "manual") or (v.startswith("ddp-") and v[4:] in backends):
            names.append(v)
        else:
            raise SystemExit(f"--variants: unknown variant {v!r}; choose from compute, ddp, "
                             f"{', '.join('ddp-' + b for b in backends)}, manual")
    if not names or len(set(names)) != len(names):
        raise SystemExit(f"--variants {text!r}: give one or more distinct variants")
    return names


def make_variants(names: list[str], base: nn.Module, dev: torch.device, groups: runtime.Groups, args,
                  manual_group) -> list[Variant]:
    out = []
    for name in names:
        module = copy.deepcopy(base).to(dev)
        model, reducer = module, None
        if name.startswith("ddp-"):
            model = DistributedDataParallel(module, process_group=groups.by_backend[name[4:]],
                                            bucket_cap_mb=args.bucket_mb,
                                            device_ids=[dev.index] if dev.type == "cuda" else None)
        elif name == "manual":
            params = [p for p in module.parameters() if p.requires_grad]
            reducer = StagedReducer(params, int(args.bucket_mb * 2 ** 20), manual_group, groups.world)
        opt = torch.optim.SGD(module.parameters(), lr=args.lr)
        out.append(Variant(name, model, module, opt, reducer, distributed=name != "compute"))
    return out


def train_step(v: Variant, x: torch.Tensor, y: torch.Tensor, dev: torch.device) -> None:
    """Forward, backward, (the manual reducer,) optimizer step; returns when the device is done."""
    v.opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(v.model(x), y)
    loss.backward()
    if v.reducer is not None:
        v.reducer.reduce(dev)
    v.opt.step()
    runtime.sync(dev)
    v.last_loss = loss.detach()


def param_digest(module: nn.Module) -> str:
    """SHA-256 of the bytes of every parameter and buffer of ``module``, in order."""
    h = hashlib.sha256()
    for t in itertools.chain(module.parameters(), module.buffers()):
        h.update(t.detach().reshape(-1).cpu().contiguous().view(torch.uint8).numpy())
    return h.hexdigest()


def check_params(variants: list[Variant], groups: runtime.Groups) -> dict:
    """Per distributed variant: whether its parameters are bitwise equal on every rank (the
    digests are gathered on the control group, so every rank decides alike)."""
    mine = {v.name: param_digest(v.module) for v in variants if v.distributed}
    every = runtime.gather_objects(mine, groups)
    return {name: {"equal": len({d[name] for d in every}) == 1, "digests": [d[name][:16] for d in every]}
            for name in mine}


# ---------------------------------------------------------------------------------------------
# Command
# ---------------------------------------------------------------------------------------------

def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and training step")
    default_model = TIMM_DEFAULT if timm_available() else "vit_b16"
    g.add_argument("--model", type=model_arg, default=default_model,
                   help=f"timm:NAME (timm, pretrained=False), vit_b16 (built-in ViT-B/16, 86.6M parameters) or "
                        f"tiny (1.8M, for quick CPU runs); default here: {default_model}")
    g.add_argument("--image-size", type=_cli.int_at_least(1), default=None,
                   help="input side in pixels (default: the model's own, 224 for ViT-B/16, 32 for tiny)")
    g.add_argument("--classes", type=_cli.int_at_least(2), default=None,
                   help="output classes (default: the model's own, 1000 for ViT-B/16, 10 for tiny)")
    g.add_argument("--batch", type=_cli.int_at_least(1), default=32, help="samples per rank per step")
    g.add_argument("--lr", type=_cli.number_at_least(0, above=True, what="learning rate"), default=0.01,
                   help="SGD learning rate")
    g.add_argument("--seed", type=_cli.int_at_least(0), default=0, help="seed of the weights and the data")
    g.add_argument("--device", default="cpu", choices=list(runtime.DEVICES),
                   help="where the model, gradients and data live (cuda: device LOCAL_RANK %% device_count)")
    g.add_argument("--bucket-mb", type=_cli.number_at_least(0, above=True, what="size in MiB"), default=25.0,
                   help="DDP bucket_cap_mb, and the manual reducer's bucket size (MiB)")
    g.add_argument("--variants", default="compute,ddp,manual",
                   help="comma-separated: compute, ddp (one per backend of --backends), ddp-BACKEND, manual")
    g.add_argument("--steps", type=_cli.int_at_least(1), default=10, help="timed steps per variant")
    g.add_argument("--warmup-steps", type=_cli.int_at_least(0), default=2, help="untimed steps per variant first")
    g = p.add_argument_group("output (rank 0)")
    g.add_argument("--json", type=_cli.output_file, default=None, help="write the results and the run's metadata to this file")
    g.add_argument("--plot", type=_cli.output_file, default=None, help="write a PNG bar chart of ms/step per variant")
    g.add_argument("--quiet", action="store_true", help="no line per timed step while running")
    g.add_argument("--step-timeout", type=_cli.number_at_least(0, what="number of seconds"), default=300.0,
                   help="a rank whose step (warm-up included) runs longer says which variant and step, and prints "
                        "its Python stacks, once (0: never); the run goes on until --deadline")


def summarize(times: dict[str, list[float]], world: int, batch: int) -> tuple[dict, dict]:
    """Per variant: median/mean/min/max ms per step, samples/s, ratio to the reference DDP
    variant (ddp-mccl, else the first DDP variant) and what it adds to the compute-only step;
    and the ratios of every other variant to that reference."""
    res = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        res[name] = {"median_ms": med * 1e3, "mean_ms": statistics.fmean(ts) * 1e3, "min_ms": min(ts) * 1e3,
                     "max_ms": max(ts) * 1e3, "steps_ms": [t * 1e3 for t in ts],
                     "samples_per_s": world * batch / med, "samples_per_s_mean": world * batch / statistics.fmean(ts)}
    ref = "ddp-mccl" if "ddp-mccl" in res else next((n for n in res if n.startswith("ddp-")), None)
    ratios = {}
    for name, r in res.items():
        r["vs_ref"] = r["median_ms"] / res[ref]["median_ms"] if ref else None
        r["over_compute_ms"] = r["median_ms"] - res["compute"]["median_ms"] if "compute" in res else None
        if ref and name != ref and name != "compute":
            ratios[f"{name}/{ref}"] = r["vs_ref"]
    return res, {"reference": ref, "ratios": ratios}


def stuck_reporter(timeout: float, rank: int, variant: str, i: int, warmup: int) -> threading.Timer | None:
    """A started timer that, unless cancelled within ``timeout`` seconds, prints which step of
    which variant this rank is stuck in and every thread's Python stack (to stderr), so a hung
    collective on a remote machine can be located from the log (None when ``timeout`` is 0)."""
    if not timeout:
        return None
    what = f"warm-up step {i + 1}" if i < warmup else f"timed step {i - warmup + 1}"

    def report() -> None:
        print(f"mccl.bench ddp: rank {rank}: {variant}, {what}, still running after {timeout:g} s "
              f"(--step-timeout); Python stacks:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)

    timer = threading.Timer(timeout, report)
    timer.daemon = True
    timer.start()
    return timer


def main(args) -> int:
    """Rank mode: build the variants, alternate their steps, check the parameters, report."""
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    torch.set_num_threads(args.threads)
    backends = runtime.split_backends(args.backends)
    names = variant_names(args.variants, backends)
    dev = runtime.rank_device(args.device)
    groups = runtime.init_groups(backends, args.pg_timeout)
    rank0 = groups.rank == 0
    manual_group = (dist.new_group(backend="gloo", timeout=timedelta(seconds=args.pg_timeout))
                    if "manual" in names else None)
    info = build_model(args.model, args.image_size, args.classes, args.seed)
    params = [p for p in info.model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    variants = make_variants(names, info.model, dev, groups, args, manual_group)
    del info.model, params  # the CPU original: every variant has its own copy on the device
    gen = torch.Generator().manual_seed(args.seed + 1000 + groups.rank)
    x = torch.randn(args.batch, *info.input_shape, generator=gen).to(dev)
    y = torch.randint(0, info.classes, (args.batch,), generator=gen).to(dev)

    meta = runtime.run_metadata(groups, backends)
    meta.update(runtime.device_meta(dev, groups))
    manual = next((v.reducer for v in variants if v.reducer is not None), None)
    meta.update({"model": args.model, "model_description": info.description, "params": n_params,
                 "grad_bytes_per_step": grad_bytes, "input_shape": list(info.input_shape), "classes": info.classes,
                 "batch_per_rank": args.batch, "lr": args.lr, "dtype": "float32", "bucket_mib": args.bucket_mb,
                 "variants": names, "steps": args.steps, "warmup_steps": args.warmup_steps, "device": dev.type,
                 "manual_bucket_bytes": [sum(p.numel() * p.element_size() for p in b) for b in manual.buckets]
                 if manual else None})
    if rank0:
        print(f"# mccl.bench ddp: {groups.world} ranks, backends {', '.join(backends)}, torch {meta['torch']}"
              + (f", mccl {meta['mccl']}" if "mccl" in meta else "") + (f", git {meta['git']}" if meta.get("git") else ""),
              flush=True)
        print(f"# model {info.description}: {n_params / 1e6:.2f}M parameters, {grad_bytes / 2 ** 20:.1f} MiB of fp32 "
              f"gradients all-reduced per step; batch {args.batch}/rank of {tuple(info.input_shape)}, SGD lr "
              f"{args.lr:g}; buckets {args.bucket_mb:g} MiB"
              + (f" (manual: {len(manual.buckets)})" if manual else "") + f"; {args.threads} thread(s) per rank",
              flush=True)
        print(runtime.device_line(meta), flush=True)
        for line in runtime.cluster_lines(meta):
            print(line, flush=True)
        print(f"# variants {', '.join(names)}: {args.warmup_steps} warm-up + {args.steps} timed steps each, "
              f"alternating; load average {meta['loadavg_start'][0]:.2f}", flush=True)

    times: dict[str, list[float]] = {n: [] for n in names}
    check_after = max(args.warmup_steps, 1)  # steps after which the parameters are compared
    params_check: dict = {}
    total = args.warmup_steps + args.steps
    for i in range(total):
        line = []
        for v in variants:
            watchdog = stuck_reporter(args.step_timeout, groups.rank, v.name, i, args.warmup_steps)
            dist.barrier(group=groups.control)
            t0 = time.perf_counter()
            train_step(v, x, y, dev)
            if watchdog:
                watchdog.cancel()
            # The slowest rank sets the step's time; the ranks left the barrier together.
            dt = max(runtime.gather_objects(time.perf_counter() - t0, groups))
            if i >= args.warmup_steps:
                times[v.name].append(dt)
                line.append(f"{v.name} {dt * 1e3:.1f}")
        if rank0 and line and not args.quiet:
            print(f"# step {i - args.warmup_steps + 1}/{args.steps} (ms): " + ", ".join(line), flush=True)
        if i + 1 == check_after:
            params_check = check_params(variants, groups)
            bad = [n for n, c in params_check.items() if not c["equal"]]
            if rank0:
                if bad:
                    for n in bad:
                        print(f"mccl.bench ddp: ERROR: the parameters of {n} differ between ranks after {i + 1} "
                              f"step(s) (SHA-256 prefixes by rank: {', '.join(params_check[n]['digests'])})",
                              file=sys.stderr, flush=True)
                elif params_check:
                    print(f"# parameters bitwise equal on all {groups.world} ranks after {i + 1} step(s): "
                          f"{', '.join(params_check)}", flush=True)

    results, ratios = summarize(times, groups.world, args.batch)
    for v in variants:
        results[v.name]["final_loss_rank0"] = float(v.last_loss) if v.last_loss is not None else None
        results[v.name]["params_equal"] = params_check.get(v.name, {}).get("equal")
        if isinstance(v.model, DistributedDataParallel):
            try:
                logged = v.model._get_ddp_logging_data()
                results[v.name]["ddp_bucket_bytes"] = [
                    int(b) for b in str(logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes", "")).split(",")
                    if b.strip()]
            except Exception:  # private API: only a detail of the report
                pass
    ok = all(c["equal"] for c in params_check.values())
    meta["loadavg_end"] = os.getloadavg()
    if rank0:
        print_table(results, ratios, meta, params_check)
        if args.json:
            runtime.write_json(args.json, {"meta": meta, "results": results, "ratios": ratios["ratios"],
                                           "reference": ratios["reference"], "params_check": params_check,
                                           "params_equal": ok})
            print(f"# wrote {args.json}")
        if args.plot:
            plot(results, meta, args.plot)
            print(f"# wrote {args.plot}")
    dist.barrier(group=groups.control)
    dist.destroy_process_group()
    return 0 if ok else 1


def print_table(results: dict, ratios: dict, meta: dict, params_check: dict) -> None:
    from rich.table import Table

    from .report import console

    ref = ratios["reference"]
    con = console()
    t = Table(title=f"ddp: {meta['model']}, {meta['params'] / 1e6:.1f}M parameters, batch {meta['batch_per_rank']}/rank, "
                    f"{meta['world_size']} ranks, {meta['device']}", title_justify="left")
    for col in ("variant", "median ms/step", "mean ms/step", "min", "max", "samples/s",
                f"/ {ref}" if ref else "ratio", "over compute (ms)", "params equal"):
        t.add_column(col, justify="right")
    for name, r in results.items():
        eq = params_check.get(name, {}).get("equal")
        t.add_row(name, f"{r['median_ms']:.1f}", f"{r['mean_ms']:.1f}", f"{r['min_ms']:.1f}", f"{r['max_ms']:.1f}",
                  f"{r['samples_per_s']:.1f}", "-" if r["vs_ref"] is None else f"{r['vs_ref']:.2f}",
                  "-" if r["over_compute_ms"] is None else f"{r['over_compute_ms']:.1f}",
                  "-" if eq is None else ("yes" if eq else "[bold red]NO[/]"))
    con.print(t)
    gb = meta["grad_bytes_per_step"]
    con.print(f"# gradient bytes all-reduced per step and rank: {gb} ({gb / 2 ** 20:.1f} MiB)")
    con.print("# step time: the slowest rank's, from a barrier until the optimizer step's results are on the device; "
              "samples/s = ranks x batch / median step")
    if ratios["ratios"]:
        con.print("# " + ", ".join(f"{k} = {v:.2f}" for k, v in ratios["ratios"].items())
                  + " (median step times; above 1: slower than " + f"{ref})")
    con.print("# over compute: median step minus the compute-only median (what communication and its bookkeeping "
              "add); params equal: SHA-256 of every parameter, gathered once after the warm-up")


def plot(results: dict, meta: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    med = [results[n]["median_ms"] for n in names]
    lo = [m - results[n]["min_ms"] for m, n in zip(med, names)]
    hi = [results[n]["max_ms"] - m for m, n in zip(med, names)]
    fig, ax = plt.subplots(figsize=(1.8 + 1.4 * len(names), 4))
    ax.bar(names, med, yerr=[lo, hi], capsize=4, color=["grey" if n == "compute" else "C0" for n in names])
    for i, n in enumerate(names):
        ax.annotate(f"{results[n]['samples_per_s']:.0f} samples/s", (i, results[n]["max_ms"]), ha="center",
                    va="bottom", fontsize=8,
                    xytext=(0, 3), textcoords="offset points")
    ax.set_ylabel("ms / step (median; bars: min-max)")
    ax.set_title(f"{meta['model']}, batch {meta['batch_per_rank']}/rank, {meta['world_size']} ranks, {meta['device']}",
                 fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
