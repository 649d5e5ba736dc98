"""The rule that turns probe readings into one verdict, and the state machine with hysteresis.

The asymmetry is the point: a machine joins Ray only after every probe has said "idle" without a
break for ``join_after_s`` (ten minutes by default), and leaves at the first reading that says
"busy". A probe that flips faster than ``join_after_s`` therefore never makes the machine join,
and an artist who sits down never waits for more than one poll interval plus the time it takes
to stop the Ray node.

States::

    out ──all idle──> arming ──idle for join_after_s──> in
     ^                  │                                │
     └────any busy──────┘<───────────any busy────────────┘ (leave: drain, stop the node)

A Ray node that exits on its own while ``in`` (crash, head gone) puts the machine back ``out``
with a back-off before the next arming may complete, doubling after every such exit up to
``max_backoff_s`` and reset by a node that stayed up for ``join_after_s``.

Both classes are pure (time is passed in), so tests drive them with a fake clock.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Optional, Sequence

from .probes import Reading

__all__ = ["Rule", "Verdict", "State", "Transition", "StateMachine"]


@dataclass(frozen=True)
class Verdict:
    """The rule's answer: ``busy`` and the readings that made it so (every busy reading, or, when
    idle, a summary of all)."""

    busy: bool
    reasons: tuple[str, ...]

    def reason(self) -> str:
        return "; ".join(self.reasons)


class Rule:
    """The machine is idle only if every probe says idle.

    A probe that cannot tell (``busy is None``) counts as idle unless its name is in
    ``unknown_is_busy``: a site that relies on the console probe can require it to work
    (``unknown_is_busy = ["input"]``), while a missing GPU reader need not keep a Mac out.
    """

    def __init__(self, unknown_is_busy: Sequence[str] = ()):
        self.unknown_is_busy = frozenset(unknown_is_busy)

    def decide(self, readings: Sequence[Reading]) -> Verdict:
        busy = []
        for r in readings:
            if r.busy or (r.busy is None and r.probe in self.unknown_is_busy):
                busy.append(f"{r.probe}: {r.detail}" + (" (unknown counts as busy)" if r.busy is None else ""))
        if busy:
            return Verdict(True, tuple(busy))
        return Verdict(False, tuple(f"{r.probe}: {r.detail}" for r in readings))


class State(str, enum.Enum):
    OUT = "out"
    ARMING = "arming"
    IN = "in"


@dataclass(frozen=True)
class Transition:
    """A change of state at time ``at``; ``action`` is ``"join"``, ``"leave"`` or None."""

    at: float
    old: State
    new: State
    reason: str
    action: Optional[str] = None

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["old"], d["new"] = self.old.value, self.new.value
        return d


class StateMachine:
    """Hysteresis between probe verdicts and the Ray node.

    Args:
        join_after_s: how long every probe must say idle, without a break, before joining.
        backoff_s: the first wait after the node exited on its own (doubling, to ``max_backoff_s``).
        max_backoff_s: the longest such wait.
    """

    def __init__(self, join_after_s: float = 600.0, backoff_s: float = 30.0, max_backoff_s: float = 900.0):
        if join_after_s < 0 or backoff_s < 0 or max_backoff_s < backoff_s:
            raise ValueError("join_after_s and backoff_s must be >= 0 and max_backoff_s >= backoff_s")
        self.join_after_s = float(join_after_s)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.state = State.OUT
        self.since: Optional[float] = None  # when the current state began
        self.idle_since: Optional[float] = None  # start of the unbroken idle run (arming)
        self.not_before: float = float("-inf")  # back-off: earliest join after an unexpected exit
        self._next_backoff = self.backoff_s
        self.joined_at: Optional[float] = None

    def _go(self, now: float, new: State, reason: str, action: Optional[str] = None) -> Transition:
        t = Transition(now, self.state, new, reason, action)
        self.state, self.since = new, now
        return t

    def update(self, now: float, verdict: Verdict) -> Optional[Transition]:
        """Feed one verdict; return the transition it caused, if any."""
        if self.since is None:
            self.since = now
        if self.state is State.IN:
            if verdict.busy:
                self.idle_since = None
                self.joined_at = None
                return self._go(now, State.OUT, verdict.reason(), "leave")
            if self.joined_at is not None and now - self.joined_at >= self.join_after_s:
                self._next_backoff = self.backoff_s  # the node stayed up: forget past crashes
            return None
        if verdict.busy:
            self.idle_since = None
            if self.state is State.ARMING:
                return self._go(now, State.OUT, verdict.reason())
            return None
        if self.state is State.OUT:
            self.idle_since = now
            wait = max(self.join_after_s, self.not_before - now)
            return self._go(now, State.ARMING, f"every probe idle: joining after {wait:.0f} s more without a busy reading")
        # ARMING and idle
        if now - self.idle_since >= self.join_after_s and now >= self.not_before:
            self.joined_at = now
            return self._go(now, State.IN, f"every probe idle for {now - self.idle_since:.0f} s", "join")
        return None

    def node_exited(self, now: float, reason: str) -> Optional[Transition]:
        """The Ray node stopped although the agent did not stop it: out, with a back-off."""
        if self.state is not State.IN:
            return None
        self.not_before = now + self._next_backoff
        wait = self._next_backoff
        self._next_backoff = min(self.max_backoff_s, self._next_backoff * 2 or self.backoff_s)
        self.idle_since = None
        self.joined_at = None
        return self._go(now, State.OUT, f"{reason}; not rejoining for {wait:.0f} s")

    def force_out(self, now: float, reason: str) -> Optional[Transition]:
        """Leave because the agent itself is stopping."""
        if self.state is State.IN:
            self.joined_at = None
            return self._go(now, State.OUT, reason, "leave")
        if self.state is State.ARMING:
            return self._go(now, State.OUT, reason)
        return None
