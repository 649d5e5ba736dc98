"""The Ray node the agent starts and stops: ``ray start --address HEAD --resources '{"pool:mac": 1}'``.

The node runs in the foreground (``--block``) as the agent's child, in a session of its own, so
the agent knows at once when it exits and can stop exactly the processes it started (the Ray
node's raylet, its agents and the training workers under it), by process id, with psutil.

By default the command is ``python -m mccl.ray.node --address HEAD --block ...``: mccl's own
launcher checks that an mccl worker can run here (the extension imports, the device it would
train on) and then replaces itself with ``ray start``, so the command that runs is Ray's.

Leaving: when ``drain_s`` > 0 the node is first drained through the GCS (Ray's ``DrainNode``
with reason preemption and a deadline ``drain_s`` ahead), which tells Ray Train the node is being
preempted rather than failing (``FailureConfig.max_preemption_failures``) and stops new work
from landing here; then the node gets SIGTERM (``ray start --block`` marks the node as draining
and stops its processes, but would wait up to 30 s for a running job), and whatever is still
alive after ``stop_timeout_s`` gets SIGKILL.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Optional, Sequence

import psutil

__all__ = ["RayNode"]

log = logging.getLogger("mccl.agent")


class RayNode:
    """One Ray worker node, started and stopped by the agent.

    Args:
        address: the head's ``HOST:PORT``.
        resource: the custom resource to advertise (``pool:mac``), ``units`` of it.
        extra_args: more ``ray start`` arguments (``--num-cpus=8``, ``--node-ip-address=...``).
        launcher: ``"mccl"`` (``python -m mccl.ray.node``, which checks the machine first) or
            ``"ray"`` (``python -m ray.scripts.scripts start``: Ray's CLI, nothing else).
        ifname: ``MCCL_SOCKET_IFNAME`` for the workers started on this node.
        drain_s: drain through the GCS with this deadline before stopping (0: do not drain).
        stop_timeout_s: how long SIGTERM may take before SIGKILL.
        log_path: the node's stdout/stderr go here (appended).
        env: extra environment variables for the node.
    """

    def __init__(self, address: str, resource: str = "pool:mac", units: int = 1, extra_args: Sequence[str] = (),
                 launcher: str = "mccl", ifname: Optional[str] = None, drain_s: float = 0.0,
                 stop_timeout_s: float = 1.0, log_path: Optional[str] = None, env: Optional[dict] = None,
                 python: str = sys.executable):
        if launcher not in ("mccl", "ray"):
            raise ValueError(f"launcher must be 'mccl' or 'ray', got {launcher!r}")
        self.address = address
        self.resource = resource
        self.units = int(units)
        self.extra_args = list(extra_args)
        self.launcher = launcher
        self.ifname = ifname
        self.drain_s = float(drain_s)
        self.stop_timeout_s = float(stop_timeout_s)
        self.log_path = log_path
        self.env = dict(env or {})
        self.python = python
        self.proc: Optional[subprocess.Popen] = None
        self.started_at: Optional[float] = None
        self._gcs = None

    def command(self) -> list[str]:
        resources = json.dumps({self.resource: self.units})
        if self.launcher == "mccl":
            cmd = [self.python, "-m", "mccl.ray.node", "--address", self.address, "--resource", self.resource,
                   "--units", str(self.units), "--block"]
            if self.ifname:
                cmd += ["--ifname", self.ifname]
            return cmd + (["--", *self.extra_args] if self.extra_args else [])
        return [self.python, "-m", "ray.scripts.scripts", "start", f"--address={self.address}",
                f"--resources={resources}", "--block", *self.extra_args]

    def shown(self) -> str:
        """The command as the logs show it: Ray's own, whatever the launcher."""
        return (f"ray start --address {self.address} --resources '{json.dumps({self.resource: self.units})}' --block"
                + "".join(f" {a}" for a in self.extra_args))

    # ---- life cycle ----------------------------------------------------------------------------

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pid(self) -> Optional[int]:
        return self.proc.pid if self.running() else None

    def exit_code(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    def start(self) -> None:
        if self.running():
            return
        env = dict(os.environ, **self.env)
        if self.ifname:
            env["MCCL_SOCKET_IFNAME"] = self.ifname
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        self.started_at = time.monotonic()
        log.info("started Ray node (pid %d): %s", self.proc.pid, self.shown())
        if self.drain_s > 0:
            try:  # import Ray's GCS client now: leaving must not wait for the import
                from ray._raylet import GcsClient  # noqa: F401
            except ImportError as exc:
                log.warning("cannot drain before leaving (%s): the node will be stopped without draining", exc)

    def pids(self) -> frozenset:
        """The node's process and every process under it (raylet, agents, workers)."""
        if not self.running():
            return frozenset()
        try:
            root = psutil.Process(self.proc.pid)
            return frozenset([root.pid] + [c.pid for c in root.children(recursive=True)])
        except psutil.Error:
            return frozenset()

    def node_id(self) -> Optional[str]:
        """This node's Ray id, read from its raylet's command line (``--node_id=<hex>``)."""
        for pid in self.pids():
            try:
                for arg in psutil.Process(pid).cmdline():
                    if arg.startswith("--node_id="):
                        return arg.split("=", 1)[1]
            except psutil.Error:
                continue
        return None

    def _drain(self) -> str:
        node_id = self.node_id()
        if node_id is None:
            return "not drained (no raylet yet)"
        try:
            from ray._raylet import GcsClient
            from ray.core.generated import autoscaler_pb2

            if self._gcs is None:
                self._gcs = GcsClient(address=self.address)
            deadline_ms = time.time_ns() // 1_000_000 + int(self.drain_s * 1000)
            accepted, why = self._gcs.drain_node(node_id, autoscaler_pb2.DrainNodeReason.Value(
                "DRAIN_NODE_REASON_PREEMPTION"), "mccl-agent: someone needs this machine", deadline_ms)
        except Exception as exc:  # draining is a courtesy; leaving must not depend on it
            return f"drain failed ({type(exc).__name__}: {exc})"
        return "drained" if accepted else f"drain refused ({why})"

    def stop(self, reason: str = "") -> str:
        """Leave the cluster now; return a short description of how it went."""
        if self.proc is None:
            return "no node"
        if self.proc.poll() is not None:
            self.proc = None
            return "node had already exited"
        t0 = time.monotonic()
        procs = []
        for pid in self.pids():
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                pass
        how = []
        if self.drain_s > 0:
            how.append(self._drain())
            # Give the job's workers until the drain deadline to notice and exit on their own.
            deadline = t0 + self.drain_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                workers = [p for p in procs if _alive(p) and _is_job_worker(p)]
                if not workers:
                    break
                time.sleep(0.2)
        try:
            self.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        gone, alive = psutil.wait_procs([p for p in procs if p.pid == self.proc.pid], timeout=self.stop_timeout_s)
        # Whatever the node left behind (or everything, if it did not stop in time): SIGKILL.
        leftovers = [p for p in procs if _alive(p)]
        for p in leftovers:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(leftovers, timeout=2.0)
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass
        code = self.proc.returncode
        self.proc = None
        how.append(f"stopped in {time.monotonic() - t0:.1f} s (exit {code}"
                   + (f", {len(leftovers)} process(es) killed" if leftovers else "") + ")")
        return ", ".join(how)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


#: Ray's own per-node processes, and its idle workers: not the job's.
_RAY_SYSTEM = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _is_job_worker(p: psutil.Process) -> bool:
    """A Ray worker running a task or actor (``ray::RayTrainWorker...``), not Ray's own."""
    name = _name(p)
    return name.startswith("ray::") and not name.startswith(_RAY_SYSTEM)


def _name(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()) or p.name()
    except psutil.Error:
        return ""
