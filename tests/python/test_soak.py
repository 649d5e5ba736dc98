"""`python -m mccl.soak`: the 30-second soak CI runs, its report, and that it notices corruption."""
import json
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOAK_S = float(os.environ.get("MCCL_TEST_SOAK_S", "30"))


def soak(*args, deadline: float):
    """Run the soak CLI in its own session; on the deadline kill the launcher and every rank."""
    proc = subprocess.Popen([sys.executable, "-m", "mccl.soak", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the soak did not finish within {deadline:.0f} s:\n{out[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out


@pytest.mark.timeout(900)
def test_soak_runs_every_collective_and_dtype_exactly_on_4_ranks(tmp_path):
    report = tmp_path / "soak.json"
    rc, out = soak("--duration", str(SOAK_S), "--nproc", "4", "--report-every", "5", "--json", str(report),
                   deadline=SOAK_S + 300)
    assert rc == 0, out[-5000:]
    data = json.loads(report.read_text())
    s, samples = data["summary"], data["samples"]
    assert s["errors"] == 0 and s["failure"] is None, out[-5000:]
    assert s["ranks"] == 4 and s["duration_s"] >= SOAK_S
    assert s["ops"] >= 100, f"only {s['ops']} collectives in {SOAK_S} s"
    assert s["kinds_run"] == sorted(s["collectives"]), s
    assert s["dtypes_run"] == sorted(s["dtypes"]), s
    # Ops, bytes, errors and RSS over time: a line (and a sample) every 5 s or so.
    assert len(samples) >= max(2, int(SOAK_S / 5) - 1), samples
    assert all(a["ops"] < b["ops"] and a["bytes"] < b["bytes"] for a, b in zip(samples, samples[1:])), samples
    assert all(len(x["rss"]) == 4 and x["errors"] == 0 for x in samples), samples
    # Memory: 4 MiB buffers cannot explain a rank that grew by a GiB.
    assert max(max(x["rss"]) for x in samples) < s["rss_start"] + (1 << 30), samples
    assert "errors" in out and "rss MiB per rank" in out and out.count("\n") >= len(samples) + 2, out


def test_soak_reports_a_corrupted_result_and_fails():
    rc, out = soak("--duration", "3", "--nproc", "2", "--corrupt", "1:5", "--check-every", "4", deadline=300)
    assert rc == 1, out[-3000:]
    assert "rank 1: ERROR op" in out, out[-3000:]
    summary = [line for line in out.splitlines() if line.startswith("summary:")]
    assert summary and " 0 errors" not in summary[0], out[-3000:]


def test_soak_help_documents_the_options():
    rc, out = soak("--help", deadline=120)
    assert rc == 0
    for option in ("--duration", "--nproc", "--max-bytes", "--collectives", "--dtypes", "--seed", "--json",
                   "--report-every", "--backend", "torchrun"):
        assert option in out, f"--help does not mention {option}"


@pytest.mark.parametrize("args, says", [
    (["--duration", "nan"], "--duration: nan: must be a finite number of seconds, above 0"),
    (["--timeout", "0"], "--timeout: 0: must be a finite number of seconds, above 0"),
    (["--backend", "foo"], "--backend: foo is not a torch.distributed backend here"),
    (["--corrupt", "9:3"], "--corrupt 9:3: there is no rank 9 in a world of 4"),
    (["--json", "/proc/no-such-dir/x.json"], "cannot write a file in /proc/no-such-dir"),
])
def test_bad_arguments_are_refused_before_any_rank_starts(args, says):
    """A run that could never pass, never stop or never write its results is refused at once, in
    one line (a --corrupt rank that does not exist would corrupt nothing and pass)."""
    rc, out = soak(*args, deadline=120)
    assert rc == 2 and says in out and "Traceback" not in out, out[-3000:]
