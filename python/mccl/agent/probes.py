"""Probes: each one answers "is someone using this machine?" from one kind of evidence.

Every probe is a small class behind one interface, :class:`Probe`: ``read(ctx)`` returns a
:class:`Reading` whose ``busy`` is True (someone needs the machine), False (nothing here says so)
or None (this probe cannot tell, e.g. ``ioreg`` is missing), with a one-line ``detail`` that the
agent logs as the reason of a transition. :mod:`mccl.agent.machine` combines the readings with a
rule; probes never decide on their own whether the machine joins Ray.

Probes that read the operating system go through psutil (processes, users, CPU times) or run one
short command (``ioreg`` on macOS, ``loginctl`` on Linux, ``nvidia-smi``) with a timeout; their
parsers are plain functions so tests feed them captured output.
"""
from __future__ import annotations

import abc
import collections
import datetime as _dt
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import psutil

__all__ = [
    "Probe", "Reading", "ProbeContext", "InputIdleProbe", "RemoteSessionProbe", "BusyAppProbe",
    "CpuLoadProbe", "GpuLoadProbe", "ScheduleProbe", "ManualProbe", "StaticProbe",
    "parse_hid_idle_seconds", "parse_ioreg_gpu_utilization", "parse_time_window", "in_windows",
    "DEFAULT_BUSY_APPS", "DEFAULT_REMOTE_PROCESSES",
]

#: Applications whose running process means an artist is at work (matched case-insensitively
#: against the process name, the base name of argv[0] and of the executable; shell wildcards).
DEFAULT_BUSY_APPS = ("Pro Tools", "Logic Pro", "Logic Pro X", "Final Cut Pro", "DaVinci Resolve",
                     "Avid Media Composer", "Nuendo*", "Cubase*")
#: Processes that exist only while someone is connected from elsewhere: OpenSSH's per-session
#: process (``sshd: user@pts/3`` on every OpenSSH, ``sshd-session`` since 9.8) and macOS's
#: Screen Sharing / Remote Desktop session processes.
DEFAULT_REMOTE_PROCESSES = ("sshd: *@*", "sshd-session", "ScreensharingAgent", "screensharingd",
                            "ARDAgent: *", "SSMenuAgent")


@dataclass(frozen=True)
class Reading:
    """One probe's answer. ``busy`` None means "cannot tell" (the rule decides what that counts as)."""

    probe: str
    busy: Optional[bool]
    detail: str
    value: Optional[float] = None

    def as_dict(self) -> dict:
        return {"probe": self.probe, "busy": self.busy, "detail": self.detail, "value": self.value}


@dataclass
class ProbeContext:
    """What the agent tells its probes: whether it is in Ray now, and the processes it started
    (the Ray node and its workers), whose load is the job's, not an artist's."""

    joined: bool = False
    own_pids: frozenset = frozenset()
    now: float = field(default_factory=time.time)


class Probe(abc.ABC):
    """One kind of evidence. Subclasses set ``name`` and implement :meth:`check`.

    ``read`` wraps ``check`` so that a probe that raises gives a ``busy=None`` reading naming the
    error instead of stopping the agent.
    """

    name: str = "probe"

    def read(self, ctx: ProbeContext) -> Reading:
        try:
            return self.check(ctx)
        except Exception as exc:  # a probe must never take the agent down
            return Reading(self.name, None, f"probe failed: {type(exc).__name__}: {exc}")

    @abc.abstractmethod
    def check(self, ctx: ProbeContext) -> Reading:
        """Look once; return a :class:`Reading`."""

    def describe(self) -> str:
        return self.name


def _run(cmd: Sequence[str], timeout: float = 5.0) -> Optional[str]:
    """stdout of ``cmd``, or None if it is not installed, fails or times out."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


# ---- console input ----------------------------------------------------------------------------

def parse_hid_idle_seconds(ioreg_output: str) -> Optional[float]:
    """Seconds since the last keyboard/mouse/trackpad event, from ``ioreg -c IOHIDSystem -d 4``.

    macOS reports ``"HIDIdleTime" = <nanoseconds>`` in the IOHIDSystem entry; the smallest value
    (there may be several entries) is the console's idle time. None if the key is absent.
    """
    values = [int(v) for v in re.findall(r'"HIDIdleTime"\s*=\s*(\d+)', ioreg_output)]
    return min(values) / 1e9 if values else None


def _linux_console_idle_seconds(now: float) -> Optional[float]:
    """Idle time of the local graphical sessions from systemd-logind, or None if unknown.

    Each active x11/wayland/mir session reports ``IdleHint`` and ``IdleSinceHint`` (microseconds
    since the epoch); the least idle session counts. No graphical session at all means nobody is
    at the console: infinite idle time.
    """
    listing = _run(["loginctl", "list-sessions", "--no-legend"])
    if listing is None:
        return None
    idle = []
    for line in listing.splitlines():
        parts = line.split()
        if not parts:
            continue
        props = _run(["loginctl", "show-session", parts[0], "-p", "Type", "-p", "Active", "-p", "Remote",
                      "-p", "IdleHint", "-p", "IdleSinceHint"])
        if props is None:
            continue
        kv = dict(p.split("=", 1) for p in props.splitlines() if "=" in p)
        if kv.get("Type") not in ("x11", "wayland", "mir") or kv.get("Remote") == "yes":
            continue
        if kv.get("IdleHint") != "yes":
            idle.append(0.0)
        else:
            since = int(kv.get("IdleSinceHint") or 0) / 1e6
            idle.append(max(0.0, now - since) if since else float("inf"))
    return min(idle) if idle else float("inf")


class InputIdleProbe(Probe):
    """Busy while the console's keyboard and mouse were used less than ``min_idle_s`` ago.

    macOS: ``HIDIdleTime`` from ``ioreg -c IOHIDSystem``. Linux: systemd-logind's idle hint of
    the local graphical sessions (none: idle). Elsewhere, or if the tool is missing: None.
    ``idle_seconds`` replaces the platform reader (tests).
    """

    name = "input"

    def __init__(self, min_idle_s: float = 600.0, idle_seconds: Optional[Callable[[float], Optional[float]]] = None):
        self.min_idle_s = float(min_idle_s)
        self._idle_seconds = idle_seconds or self._platform_idle_seconds

    @staticmethod
    def _platform_idle_seconds(now: float) -> Optional[float]:
        if sys.platform == "darwin":
            out = _run(["ioreg", "-c", "IOHIDSystem", "-d", "4"])
            return None if out is None else parse_hid_idle_seconds(out)
        if sys.platform.startswith("linux"):
            return _linux_console_idle_seconds(now)
        return None

    def check(self, ctx: ProbeContext) -> Reading:
        idle = self._idle_seconds(ctx.now)
        if idle is None:
            return Reading(self.name, None, "console idle time unknown on this machine")
        if idle == float("inf"):
            return Reading(self.name, False, "no console session", idle)
        if idle < self.min_idle_s:
            return Reading(self.name, True, f"console input {idle:.0f} s ago (< {self.min_idle_s:g} s)", idle)
        return Reading(self.name, False, f"console idle for {idle:.0f} s", idle)


# ---- remote sessions ----------------------------------------------------------------------------

def _proc_labels(proc: psutil.Process) -> list[str]:
    """The names a person would call a process by: its name, argv[0] (base name and whole, since
    setproctitle-style titles such as ``sshd: artist@pts/3`` live there) and the executable's base name."""
    info = proc.info
    labels = [info.get("name") or ""]
    cmdline = info.get("cmdline") or []
    if cmdline:
        labels.append(cmdline[0])
        labels.append(os.path.basename(cmdline[0]))
        labels.append(" ".join(cmdline))
    exe = info.get("exe") or ""
    if exe:
        labels.append(os.path.basename(exe))
    return [label for label in labels if label]


def _match_processes(patterns: Iterable[str], exclude: frozenset) -> list[tuple[int, str]]:
    """(pid, label) of every process whose name, argv[0] or executable matches one of ``patterns``
    (shell wildcards, case-insensitive), except the pids in ``exclude``."""
    pats = [p.lower() for p in patterns]
    found = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "exe"]):
        if proc.info["pid"] in exclude:
            continue
        for label in _proc_labels(proc):
            low = label.lower()
            if any(fnmatch.fnmatchcase(low, p) for p in pats):
                found.append((proc.info["pid"], label))
                break
    return found


class RemoteSessionProbe(Probe):
    """Busy while someone is logged in from elsewhere: a login record with a remote host
    (``psutil.users()``, i.e. utmp: ssh with a terminal, ``screen``/``tmux`` attached remotely) or
    a process that exists only during a remote session (``remote_processes``: OpenSSH's
    per-session process, which also covers ``ssh host command`` without a terminal; macOS Screen
    Sharing). ``ignore_users`` lists accounts whose sessions never count (the fleet's own admin
    account, say). ``users`` replaces ``psutil.users`` (tests).
    """

    name = "remote"

    def __init__(self, ignore_users: Sequence[str] = (), remote_processes: Sequence[str] = DEFAULT_REMOTE_PROCESSES,
                 users: Optional[Callable[[], list]] = None):
        self.ignore_users = frozenset(ignore_users)
        self.remote_processes = tuple(remote_processes)
        self._users = users or psutil.users

    @staticmethod
    def _is_remote_host(host: Optional[str]) -> bool:
        # A local X display shows up as ":0" or "localhost:0" style hosts; anything else is a peer.
        if not host:
            return False
        return not (host.startswith(":") or host in ("localhost", "127.0.0.1", "::1") or re.match(r"^:\d", host))

    def check(self, ctx: ProbeContext) -> Reading:
        sessions = [u for u in self._users() if self._is_remote_host(u.host) and u.name not in self.ignore_users]
        if sessions:
            u = sessions[0]
            more = f" and {len(sessions) - 1} more" if len(sessions) > 1 else ""
            return Reading(self.name, True, f"remote login: {u.name} on {u.terminal} from {u.host}{more}",
                           float(len(sessions)))
        procs = [(pid, label) for pid, label in _match_processes(self.remote_processes, ctx.own_pids)
                 if not any(f"{user}@" in label for user in self.ignore_users)]
        if procs:
            pid, label = procs[0]
            return Reading(self.name, True, f"remote session process {label!r} (pid {pid})", float(len(procs)))
        return Reading(self.name, False, "no remote sessions", 0.0)


# ---- applications -------------------------------------------------------------------------------

class BusyAppProbe(Probe):
    """Busy while one of ``names`` runs (Pro Tools by default, with other editing suites)."""

    name = "apps"

    def __init__(self, names: Sequence[str] = DEFAULT_BUSY_APPS):
        self.names = tuple(names)

    def check(self, ctx: ProbeContext) -> Reading:
        found = _match_processes(self.names, ctx.own_pids)
        if found:
            pid, label = found[0]
            return Reading(self.name, True, f"{label!r} is running (pid {pid})", float(len(found)))
        return Reading(self.name, False, "no busy applications", 0.0)


# ---- load ----------------------------------------------------------------------------------------

def _busy_cpu_seconds(times) -> float:
    return sum(v for k, v in times._asdict().items() if k not in ("idle", "iowait", "guest", "guest_nice"))


class CpuLoadProbe(Probe):
    """Busy while processes other than the agent's own Ray node use more than ``max_percent`` of
    the machine's CPU, averaged over ``window_s`` (so a short spike is not a person).

    The machine's busy CPU time comes from ``psutil.cpu_times()``; the CPU time of the agent's
    own process tree (``ctx.own_pids``: the Ray node and the training workers under it) is
    subtracted, so the job's own load never makes the machine look busy.
    """

    name = "cpu"

    def __init__(self, max_percent: float = 30.0, window_s: float = 30.0):
        self.max_percent = float(max_percent)
        self.window_s = float(window_s)
        self._samples: collections.deque = collections.deque()
        self._own: dict[int, psutil.Process] = {}

    def _own_cpu_seconds(self, pids: frozenset) -> float:
        total = 0.0
        for pid in pids:
            proc = self._own.get(pid)
            try:
                if proc is None:
                    proc = self._own[pid] = psutil.Process(pid)
                t = proc.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                self._own.pop(pid, None)
        for pid in list(self._own):
            if pid not in pids:
                del self._own[pid]
        return total

    def check(self, ctx: ProbeContext) -> Reading:
        now = time.monotonic()
        busy_s = _busy_cpu_seconds(psutil.cpu_times())
        own_s = self._own_cpu_seconds(ctx.own_pids)
        self._samples.append((now, busy_s, own_s, frozenset(ctx.own_pids)))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        if len(self._samples) < 2:
            return Reading(self.name, None, "measuring CPU load")
        t0, busy0, own0, pids0 = self._samples[0]
        # Own processes that appeared during the window are counted from zero: a process started
        # now has all its CPU time inside the window. Ones that exited take their time with them,
        # so a stopped job can make the foreign share look higher for one window; the machine
        # is out of Ray by then.
        dt = now - t0
        if dt <= 0:
            return Reading(self.name, None, "measuring CPU load")
        foreign = max(0.0, (busy_s - busy0) - max(0.0, own_s - own0))
        percent = 100.0 * foreign / (dt * (psutil.cpu_count() or 1))
        if percent > self.max_percent:
            return Reading(self.name, True, f"other processes use {percent:.0f}% CPU (> {self.max_percent:g}%)", percent)
        return Reading(self.name, False, f"other processes use {percent:.0f}% CPU", percent)


def parse_ioreg_gpu_utilization(ioreg_output: str) -> Optional[float]:
    """The highest ``"Device Utilization %"`` in ``ioreg -r -d 1 -c IOAccelerator`` output."""
    values = [int(v) for v in re.findall(r'"Device Utilization %"\s*=\s*(\d+)', ioreg_output)]
    return float(max(values)) if values else None


def _platform_gpu_percent() -> Optional[float]:
    if sys.platform == "darwin":
        out = _run(["ioreg", "-r", "-d", "1", "-c", "IOAccelerator"])
        return None if out is None else parse_ioreg_gpu_utilization(out)
    out = _run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"])
    if out is None:
        return None
    values = [float(v) for v in out.split() if v.strip().replace(".", "", 1).isdigit()]
    return max(values) if values else None


class GpuLoadProbe(Probe):
    """Busy while the GPU is more than ``max_percent`` utilised, consulted only while the machine
    is out of Ray: neither macOS nor NVIDIA's tools attribute utilisation to processes cheaply, so
    once the job trains here the GPU's load is the job's (and an artist at work is caught by the
    input, application and remote probes). ``gpu_percent`` replaces the platform reader (tests).
    """

    name = "gpu"

    def __init__(self, max_percent: float = 20.0, gpu_percent: Optional[Callable[[], Optional[float]]] = None):
        self.max_percent = float(max_percent)
        self._gpu_percent = gpu_percent or _platform_gpu_percent

    def check(self, ctx: ProbeContext) -> Reading:
        if ctx.joined:
            return Reading(self.name, False, "in Ray: the GPU's load is the job's")
        percent = self._gpu_percent()
        if percent is None:
            return Reading(self.name, None, "GPU utilisation unknown on this machine")
        if percent > self.max_percent:
            return Reading(self.name, True, f"GPU {percent:.0f}% busy (> {self.max_percent:g}%)", percent)
        return Reading(self.name, False, f"GPU {percent:.0f}% busy", percent)


# ---- schedule and manual switch ---------------------------------------------------------------------

def parse_time_window(text: str) -> tuple[_dt.time, _dt.time]:
    """``"20:00-08:00"`` -> (20:00, 08:00). A window whose end is not after its start wraps midnight.

    Raises:
        ValueError: not ``HH:MM-HH:MM``.
    """
    m = re.fullmatch(r"\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*", text)
    if not m:
        raise ValueError(f"time window {text!r} is not HH:MM-HH:MM (e.g. 20:00-08:00)")
    h1, m1, h2, m2 = map(int, m.groups())
    if not (0 <= h1 <= 24 and 0 <= h2 <= 24 and m1 < 60 and m2 < 60) or (h1 == 24 and m1) or (h2 == 24 and m2):
        raise ValueError(f"time window {text!r} has an impossible time")
    t = lambda h, mi: _dt.time(23, 59, 59, 999999) if h == 24 else _dt.time(h, mi)
    return t(h1, m1), t(h2, m2)


_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def in_windows(when: _dt.datetime, windows: Sequence[tuple[_dt.time, _dt.time]], days: Sequence[str] = _DAYS) -> bool:
    """Whether ``when`` (local time) falls in one of ``windows``. A window that wraps midnight
    belongs to the day it starts on: with days ``["fri"]``, ``20:00-08:00`` covers Friday 20:00
    to Saturday 08:00."""
    today = _DAYS[when.weekday()]
    yesterday = _DAYS[(when.weekday() - 1) % 7]
    t = when.time()
    for start, end in windows:
        if start < end:
            if today in days and start <= t < end:
                return True
        else:  # wraps midnight
            if (today in days and t >= start) or (yesterday in days and t < end):
                return True
    return False


class ScheduleProbe(Probe):
    """Busy outside the training windows (local time), e.g. ``["20:00-08:00"]`` on weekdays and
    ``["00:00-24:00"]`` on weekends. ``clock`` replaces ``datetime.now`` (tests)."""

    name = "schedule"

    def __init__(self, windows: Sequence[str] = ("20:00-08:00",), days: Sequence[str] = _DAYS,
                 clock: Optional[Callable[[], _dt.datetime]] = None):
        self.window_text = tuple(windows)
        self.windows = [parse_time_window(w) for w in windows]
        bad = [d for d in days if d.lower() not in _DAYS]
        if bad:
            raise ValueError(f"schedule days {bad} are not among {list(_DAYS)}")
        self.days = tuple(d.lower() for d in days)
        self._clock = clock or _dt.datetime.now

    def check(self, ctx: ProbeContext) -> Reading:
        now = self._clock()
        shown = ", ".join(self.window_text)
        if in_windows(now, self.windows, self.days):
            return Reading(self.name, False, f"{now:%a %H:%M} is inside {shown}")
        return Reading(self.name, True, f"{now:%a %H:%M} is outside the training windows {shown}")


class ManualProbe(Probe):
    """The "keep me out" switch: busy while the file ``path`` exists (``mccl-agent keep-out on``
    creates it, ``off`` removes it; its text, if any, is shown as the reason)."""

    name = "manual"

    def __init__(self, path: str):
        self.path = os.path.expanduser(path)

    def check(self, ctx: ProbeContext) -> Reading:
        try:
            with open(self.path) as f:
                why = f.read().strip()[:200]
        except FileNotFoundError:
            return Reading(self.name, False, "keep-out switch off")
        except OSError as exc:
            return Reading(self.name, True, f"keep-out switch {self.path} unreadable ({exc}): staying out")
        return Reading(self.name, True, f"keep-out switch on ({self.path})" + (f": {why}" if why else ""))


class StaticProbe(Probe):
    """A probe whose answer is set from outside: the fakes of the tests, or a site's own signal."""

    def __init__(self, name: str, busy: Optional[bool] = False, detail: str = ""):
        self.name = name
        self.busy = busy
        self.detail = detail

    def set(self, busy: Optional[bool], detail: str = "") -> None:
        self.busy, self.detail = busy, detail

    def check(self, ctx: ProbeContext) -> Reading:
        return Reading(self.name, self.busy, self.detail or ("busy" if self.busy else "idle" if self.busy is False else "unknown"))
