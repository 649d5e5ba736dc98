"""Teardown shared by the tests that start Ray nodes as `python -m mccl.ray.node --block`
processes, each in a session of its own (test_ray.py, test_ray_elastic.py, test_agent.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import time


def stop_nodes(procs: list[subprocess.Popen], grace_s: float = 40.0) -> None:
    """SIGTERM every node at once (`ray start --block` then stops its own processes); SIGKILL the
    session of any node not gone within ``grace_s`` seconds of that, and reap every one."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the session the test started for the node, nothing else
        except ProcessLookupError:
            pass
        proc.wait()


def forget_cluster(port: int) -> None:
    """Remove Ray's "last cluster started here" file if it names the head on ``port``, as `ray stop`
    would; otherwise a later bare `ray.init()` on this machine tries to join the dead cluster."""
    from ray._common.utils import get_ray_address_file

    path = get_ray_address_file(None)
    try:
        with open(path) as f:
            ours = f.read().strip().endswith(f":{port}")
        if ours:
            os.remove(path)
    except OSError:
        pass
