"""Elastic restart (issue 5): a 4-rank torchrun job with one rank SIGKILLed mid-training restarts
from its last checkpoint, never dials the dead attempt's endpoints, and finishes with exactly the
loss trajectory of an uninterrupted run from that checkpoint (examples/elastic.py)."""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "elastic.py")
STEPS, EVERY, CRASH_AT, CRASH_RANK = 30, 5, 17, 2
LAST_CKPT = (CRASH_AT // EVERY) * EVERY - 1  # 14: the checkpoint written before the crash


def torchrun(ckpt_dir, log_dir, *extra, restarts=1, deadline=300):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           "--max-restarts", str(restarts), "--log-dir", str(log_dir), "--redirects", "3",
           SCRIPT, "--ckpt-dir", str(ckpt_dir), "--steps", str(STEPS), "--ckpt-every", str(EVERY), *extra]
    env = dict(os.environ, MCCL_DEBUG="INFO")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the agent and every worker
        out, _ = proc.communicate()
        raise AssertionError(f"torchrun did not finish within {deadline} s:\n{out[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out


def losses(ckpt_dir):
    rows = [json.loads(line) for line in open(os.path.join(ckpt_dir, "losses.jsonl"))]
    steps = {}
    for row in rows:
        if "step" in row:
            steps.setdefault(row["attempt"], {})[row["step"]] = row["loss"]
    final = {row["attempt"]: row["final"] for row in rows if "final" in row}
    return steps, final


def endpoints(log_dir, attempt):
    """What each attempt's ranks published and dialled, from MCCL_DEBUG=INFO logs."""
    text = "".join(open(p).read() for p in glob.glob(os.path.join(str(log_dir), "*", f"attempt_{attempt}", "*", "stderr.log")))
    listening = dict(re.findall(r"generation (\d+) listening on (\S+)", text))
    return {"generations": set(listening), "listening": set(re.findall(r"listening on (\S+)", text)),
            "dialled": set(re.findall(r"connected to rank \d+ at (\S+)", text)),
            "rejected": re.findall(r"rejected connection.*", text)}


@pytest.mark.timeout(900)  # two torchrun jobs of 4 ranks, one with a restart
def test_crash_restart_from_checkpoint_matches_an_uninterrupted_run(tmp_path):
    crashed = tmp_path / "crashed"
    rc, out = torchrun(crashed, tmp_path / "logs-crashed", "--crash-at", str(CRASH_AT), "--crash-rank", str(CRASH_RANK))
    assert rc == 0, out[-4000:]
    steps, final = losses(crashed)
    assert sorted(steps) == [0, 1], f"expected exactly one restart: {sorted(steps)}\n{out[-3000:]}"
    # Attempt 0 trained up to the step it crashed in; attempt 1 resumed after the last checkpoint.
    assert sorted(steps[0]) == list(range(CRASH_AT)), sorted(steps[0])
    assert sorted(steps[1]) == list(range(LAST_CKPT + 1, STEPS)), sorted(steps[1])
    # The steps both attempts ran (after the checkpoint, before the crash) agree bitwise.
    for s in range(LAST_CKPT + 1, CRASH_AT):
        assert steps[0][s] == steps[1][s], f"step {s}: {steps[0][s]} before the crash, {steps[1][s]} after"

    # The restarted attempt used fresh store keys and dialled only its own attempt's listeners.
    first, second = endpoints(tmp_path / "logs-crashed", 0), endpoints(tmp_path / "logs-crashed", 1)
    assert first["listening"] and second["listening"], "no MCCL_DEBUG=INFO lines in the worker logs"
    assert len(second["listening"]) == 4 and len(second["dialled"]) == 3, second
    assert not first["generations"] & second["generations"], (first["generations"], second["generations"])
    assert second["dialled"] <= second["listening"], f"attempt 1 dialled {second['dialled'] - second['listening']}"
    assert not second["dialled"] & (first["listening"] - second["listening"]), "attempt 1 dialled a dead endpoint"
    assert not second["rejected"], second["rejected"]

    # An uninterrupted run from the same checkpoint gives the same trajectory and parameters.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(crashed / f"ckpt-{LAST_CKPT}.pt", fresh / f"ckpt-{LAST_CKPT}.pt")
    (fresh / "latest").write_text(f"ckpt-{LAST_CKPT}.pt")
    rc, out = torchrun(fresh, tmp_path / "logs-fresh", restarts=0)
    assert rc == 0, out[-4000:]
    ref_steps, ref_final = losses(fresh)
    assert ref_steps[0] == steps[1], "the restarted run's losses differ from an uninterrupted run's"
    assert ref_final[0] == final[1], "the restarted run's parameters differ from an uninterrupted run's"
