"""The agent's loop: read the probes, apply the rule, step the state machine, start or stop the
Ray node, log the transition with its reason, and publish the status for ``mccl-agent status``.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Callable, Optional, Sequence

from .config import AgentConfig
from .machine import Rule, State, StateMachine, Transition, Verdict
from .node import RayNode
from .probes import (BusyAppProbe, CpuLoadProbe, GpuLoadProbe, InputIdleProbe, ManualProbe, Probe, ProbeContext,
                     Reading, RemoteSessionProbe, ScheduleProbe)

__all__ = ["Agent", "build_probes", "write_json_atomic", "read_status"]

log = logging.getLogger("mccl.agent")


def build_probes(cfg: AgentConfig) -> list[Probe]:
    """The probes ``cfg`` enables, in a fixed order (cheap ones first)."""
    p = cfg.probes
    probes: list[Probe] = []
    if p.manual.enabled:
        probes.append(ManualProbe(cfg.keep_out_path))
    if p.schedule.enabled:
        probes.append(ScheduleProbe(p.schedule.windows, p.schedule.days))
    if p.input.enabled:
        probes.append(InputIdleProbe(p.input.min_idle_s))
    if p.remote.enabled:
        probes.append(RemoteSessionProbe(p.remote.ignore_users, p.remote.processes))
    if p.apps.enabled:
        probes.append(BusyAppProbe(p.apps.names))
    if p.cpu.enabled:
        probes.append(CpuLoadProbe(p.cpu.max_percent, p.cpu.window_s))
    if p.gpu.enabled:
        probes.append(GpuLoadProbe(p.gpu.max_percent))
    return probes


def write_json_atomic(path: str, data: dict) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: readers see the old
    file or the new one, never half of one."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def read_status(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class Agent:
    """One machine's availability agent.

    Args:
        cfg: the configuration.
        probes: replaces :func:`build_probes` (tests pass fakes).
        node: replaces the :class:`RayNode` built from ``cfg.ray``.
        clock: a monotonic clock (tests).
    """

    def __init__(self, cfg: AgentConfig, probes: Optional[Sequence[Probe]] = None, node: Optional[RayNode] = None,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        os.makedirs(cfg.state_dir, exist_ok=True)
        self.probes = list(build_probes(cfg) if probes is None else probes)
        self.rule = Rule(cfg.agent.unknown_is_busy)
        self.machine = StateMachine(cfg.agent.join_after_s, cfg.agent.backoff_s, cfg.agent.max_backoff_s)
        r = cfg.ray
        self.node = node or RayNode(r.address, r.resource, r.units, r.extra_args, launcher=r.launcher,
                                    ifname=r.ifname or None, drain_s=r.drain_s, stop_timeout_s=r.stop_timeout_s,
                                    log_path=cfg.node_log_path, env=r.env)
        self.clock = clock
        self.readings: list[Reading] = []
        self.verdict: Optional[Verdict] = None
        self.transitions: list[dict] = []
        self.started = time.time()
        self._stop = threading.Event()
        self._last_status = float("-inf")

    # ---- one step ------------------------------------------------------------------------------

    def read_probes(self) -> list[Reading]:
        ctx = ProbeContext(joined=self.machine.state is State.IN, own_pids=self.node.pids() | {os.getpid()},
                           now=time.time())
        return [p.read(ctx) for p in self.probes]

    def step(self) -> Optional[Transition]:
        """Read every probe once and act on the verdict; return the transition, if any."""
        now = self.clock()
        transition = None
        if self.machine.state is State.IN and not self.node.running():
            code = self.node.exit_code()
            self.node.proc = None
            transition = self.machine.node_exited(now, f"the Ray node exited on its own (exit {code})")
            self._record(transition, "")
        self.readings = self.read_probes()
        self.verdict = self.rule.decide(self.readings)
        t = self.machine.update(now, self.verdict)
        if t is not None:
            transition = t
            self._act(t)
        self.publish(force=t is not None)
        return transition

    def _act(self, t: Transition) -> None:
        outcome = ""
        if t.action == "join":
            try:
                self.node.start()
                outcome = f"started: {self.node.shown()}"
            except OSError as exc:
                outcome = f"could not start the Ray node: {exc}"
                self.machine.node_exited(self.clock(), outcome)
        elif t.action == "leave":
            outcome = self.node.stop(t.reason)
        self._record(t, outcome)

    def _record(self, t: Optional[Transition], outcome: str) -> None:
        if t is None:
            return
        entry = dict(t.as_dict(), time=time.time(), outcome=outcome)
        self.transitions.append(entry)
        del self.transitions[:-20]
        log.info("%s -> %s: %s%s", t.old.value, t.new.value, t.reason, f" [{outcome}]" if outcome else "")
        try:
            with open(self.cfg.transitions_path, "a") as f:
                f.write(json.dumps(entry) + "\n")
        except OSError as exc:
            log.warning("cannot append to %s: %s", self.cfg.transitions_path, exc)

    # ---- status --------------------------------------------------------------------------------

    def status(self) -> dict:
        m = self.machine
        now = self.clock()
        join_in = None
        if m.state is State.ARMING and m.idle_since is not None:
            join_in = max(m.join_after_s - (now - m.idle_since), m.not_before - now, 0.0)
        return {
            "pid": os.getpid(), "updated": time.time(), "started": self.started,
            "poll_interval_s": self.cfg.agent.poll_interval_s, "config": self.cfg.path,
            "state": m.state.value, "state_for_s": None if m.since is None else now - m.since,
            "join_in_s": join_in, "busy": None if self.verdict is None else self.verdict.busy,
            "reason": None if self.verdict is None else self.verdict.reason(),
            "probes": [r.as_dict() for r in self.readings],
            "node": {"running": self.node.running(), "pid": self.node.pid(),
                     "command": self.node.shown()},
            "transitions": self.transitions[-10:],
        }

    def publish(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._last_status < min(5.0, self.cfg.agent.poll_interval_s):
            return
        self._last_status = now
        try:
            write_json_atomic(self.cfg.status_path, self.status())
        except OSError as exc:
            log.warning("cannot write %s: %s", self.cfg.status_path, exc)

    # ---- the loop ------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def run(self, max_steps: Optional[int] = None) -> None:
        """Poll until :meth:`stop` (SIGTERM/SIGINT from :meth:`install_signal_handlers`); leave Ray
        on the way out."""
        log.info("mccl-agent %d: %d probe(s) [%s], join after %g s idle, head %s", os.getpid(), len(self.probes),
                 ", ".join(p.name for p in self.probes), self.machine.join_after_s, self.cfg.ray.address)
        steps = 0
        try:
            while not self._stop.is_set():
                t0 = self.clock()
                self.step()
                steps += 1
                if max_steps is not None and steps >= max_steps:
                    break
                self._stop.wait(max(0.0, self.cfg.agent.poll_interval_s - (self.clock() - t0)))
        finally:
            t = self.machine.force_out(self.clock(), "the agent is stopping")
            if t is not None:
                self._act(t)
            if self.node.running():  # force_out from ARMING/OUT has no action; a node may still run
                self.node.stop("the agent is stopping")
            self.publish(force=True)

    def install_signal_handlers(self) -> None:
        def handler(signum, frame):
            log.info("signal %d: leaving Ray and stopping", signum)
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
