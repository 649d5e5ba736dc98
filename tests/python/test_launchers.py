"""torchrun launches, interface choice and addresses: F19-F21 behaviour on one host."""
import os
import re
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "launch_check.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args, env=None, **kw):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.Popen([TORCHRUN, *args, SCRIPT], cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def results(output: str):
    # Two ranks print to one pipe, so their lines may run together: match records, not lines.
    rows = re.findall(r"RESULT (\d+) (\d+) (\S+) (\[[^\]]*\])", output)
    return {int(r[0]): (int(r[1]), float(r[2]), r[3]) for r in rows}


def finish(proc, timeout=120):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"torchrun did not finish within {timeout} s:\n{out[-3000:]}")
    return proc.returncode, out


def test_two_nodes_with_c10d_rendezvous():
    """Two torchrun agents (--nnodes 2, --rdzv-backend c10d) each with one rank, as on two Macs."""
    endpoint = f"127.0.0.1:{free_port()}"
    args = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", "mccl-two-nodes"]
    a, b = torchrun(args), torchrun(args)
    (rc_a, out_a), (rc_b, out_b) = finish(a), finish(b)
    assert rc_a == 0 and rc_b == 0, out_a[-2000:] + out_b[-2000:]
    got = {**results(out_a), **results(out_b)}
    assert got[0][:2] == (2, 3.0) and got[1] == (2, 3.0, "[1, 2, 3]"), got


def test_two_jobs_on_one_host_never_cross_connect():
    jobs = [torchrun(["--nproc-per-node", "2", "--master-port", str(free_port())], env={"JOB_OFFSET": str(k * 100)})
            for k in range(2)]
    for k, job in enumerate(jobs):
        rc, out = finish(job)
        assert rc == 0, out[-3000:]
        got = results(out)
        assert got[0][1] == got[1][1] == 3.0 + 200 * k, got


def test_ipv6_master_address():
    rc, out = finish(torchrun(["--nproc-per-node", "2", "--master-addr", "::1", "--master-port", str(free_port())]))
    assert rc == 0, out[-3000:]
    assert results(out)[1] == (2, 3.0, "[1, 2, 3]")


def test_socket_ifname_selects_and_bad_name_fails_clearly():
    rc, out = finish(torchrun(["--nproc-per-node", "2", "--master-port", str(free_port())], env={"MCCL_SOCKET_IFNAME": "=lo"}))
    assert rc == 0, out[-3000:]
    assert results(out)[0][1] == 3.0
    rc, out = finish(torchrun(["--nproc-per-node", "2", "--master-port", str(free_port())], env={"MCCL_SOCKET_IFNAME": "bogus0"}))
    assert rc != 0
    assert "MCCL_SOCKET_IFNAME=bogus0 matches no interface" in out, out[-3000:]


def test_readme_script_runs_as_written(tmp_path):
    """README's "Using it in your own script" block, run as it says (torchrun, 2 ranks)."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Using it in your own script", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "script.py"
    script.write_text(code)
    assert "torchrun --standalone --nproc-per-node 2 script.py" in section
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    proc = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node", "2", str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rc, out = finish(proc)
    assert rc == 0, out[-3000:]
