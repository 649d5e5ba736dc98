"""DDP over mccl against DDP over gloo, and the README's main job."""
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from distributed import check_ok, digest, run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.GroupNorm(4, 16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _ddp_steps(rank: int, world_size: int, steps: int) -> torch.Tensor:
    torch.manual_seed(0)
    model = DDP(SmallConvNet(), bucket_cap_mb=0.01)  # several buckets, so several all-reduces per step
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)  # every rank sees different, fixed data
    x = torch.randn(16, 1, 8, 8, generator=gen)
    y = torch.randint(0, 10, (16,), generator=gen)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_matches_gloo_and_ranks_are_bitwise_equal(world_size):
    ours = check_ok(run_ranks(_ddp_steps, world_size, 10, backend="mccl"))
    gloo = check_ok(run_ranks(_ddp_steps, world_size, 10, backend="gloo"))
    for r in range(1, world_size):
        assert digest(ours[r]) == digest(ours[0]), f"rank {r}'s parameters differ bitwise from rank 0's"
    rel = ((ours[0] - gloo[0]).abs().max() / gloo[0].abs().max()).item()
    assert rel <= 1e-6, f"parameters differ from DDP over gloo by {rel:.3g} (relative)"
    # Training moved the parameters: the comparison is not between two untouched models.
    torch.manual_seed(0)
    initial = torch.cat([p.detach().reshape(-1) for p in SmallConvNet().parameters()])
    assert (ours[0] - initial).abs().max() > 1e-3


def test_main_job_trains_to_target_from_readme_command():
    """The README's main job: 4 DDP ranks over mccl reach >= 95% on the digits test split."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "4", "examples/train.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "parameters bitwise equal on all 4 ranks" in proc.stdout
    acc = float(proc.stdout.split("final validation accuracy ")[1].split("%")[0])
    assert acc >= 95.0
    # Not a terminal: one line per epoch on stdout, no progress bar on stderr.
    rows = re.findall(r"^\s*(\d+)\s+\d+\.\d{4}\s+\d+\.\d{4}\s+\d+\.\d{2}%\s+\d+\s*$", proc.stdout, re.M)
    assert [int(r) for r in rows] == list(range(1, 13)), proc.stdout
    assert "it/s" not in proc.stderr, proc.stderr[-2000:]
