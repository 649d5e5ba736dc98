"""The agent's configuration file (TOML), its defaults and its checks.

Every key is optional except ``ray.address``; an unknown key or a value of the wrong type is an
error naming the key, so a typo never silently turns a probe off. ``EXAMPLE`` is a complete file
with every default (``mccl-agent example-config`` prints it).
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9/3.10
    import tomli as tomllib

from .probes import DEFAULT_BUSY_APPS, DEFAULT_REMOTE_PROCESSES

__all__ = ["AgentConfig", "ConfigError", "load_config", "parse_config", "EXAMPLE", "default_config_path"]


class ConfigError(ValueError):
    """The configuration file is unreadable or names an unknown key or a bad value."""


@dataclass
class RaySection:
    address: str = ""
    resource: str = "pool:mac"
    units: int = 1
    extra_args: list = field(default_factory=list)
    launcher: str = "mccl"
    ifname: str = ""
    drain_s: float = 0.0
    stop_timeout_s: float = 1.0
    env: dict = field(default_factory=dict)


@dataclass
class AgentSection:
    poll_interval_s: float = 1.0
    join_after_s: float = 600.0
    backoff_s: float = 30.0
    max_backoff_s: float = 900.0
    state_dir: str = "~/.mccl-agent"
    unknown_is_busy: list = field(default_factory=list)
    log_level: str = "INFO"


@dataclass
class InputSection:
    enabled: bool = True
    min_idle_s: float = 600.0


@dataclass
class RemoteSection:
    enabled: bool = True
    ignore_users: list = field(default_factory=list)
    processes: list = field(default_factory=lambda: list(DEFAULT_REMOTE_PROCESSES))


@dataclass
class AppsSection:
    enabled: bool = True
    names: list = field(default_factory=lambda: list(DEFAULT_BUSY_APPS))


@dataclass
class CpuSection:
    enabled: bool = True
    max_percent: float = 30.0
    window_s: float = 30.0


@dataclass
class GpuSection:
    enabled: bool = True
    max_percent: float = 20.0


@dataclass
class ScheduleSection:
    enabled: bool = True
    windows: list = field(default_factory=lambda: ["20:00-08:00"])
    days: list = field(default_factory=lambda: ["mon", "tue", "wed", "thu", "fri", "sat", "sun"])


@dataclass
class ManualSection:
    enabled: bool = True
    path: str = ""  # default: <state_dir>/keep-out


@dataclass
class ProbesSection:
    input: InputSection = field(default_factory=InputSection)
    remote: RemoteSection = field(default_factory=RemoteSection)
    apps: AppsSection = field(default_factory=AppsSection)
    cpu: CpuSection = field(default_factory=CpuSection)
    gpu: GpuSection = field(default_factory=GpuSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    manual: ManualSection = field(default_factory=ManualSection)


@dataclass
class AgentConfig:
    ray: RaySection = field(default_factory=RaySection)
    agent: AgentSection = field(default_factory=AgentSection)
    probes: ProbesSection = field(default_factory=ProbesSection)
    path: Optional[str] = None  # the file it came from

    @property
    def state_dir(self) -> str:
        return os.path.expanduser(self.agent.state_dir)

    @property
    def status_path(self) -> str:
        return os.path.join(self.state_dir, "status.json")

    @property
    def transitions_path(self) -> str:
        return os.path.join(self.state_dir, "transitions.jsonl")

    @property
    def node_log_path(self) -> str:
        return os.path.join(self.state_dir, "ray-node.log")

    @property
    def keep_out_path(self) -> str:
        return os.path.expanduser(self.probes.manual.path) if self.probes.manual.path else \
            os.path.join(self.state_dir, "keep-out")


def _fill(cls: type, data: Any, where: str) -> Any:
    """Build dataclass ``cls`` from a TOML table, checking keys and types."""
    table = f"[{where}]" if where else "the top level"
    if not isinstance(data, dict):
        raise ConfigError(f"{table} must be a table, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if not (cls is AgentConfig and f.name == "path")}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key(s) in {table}: {', '.join(unknown)} (known: {', '.join(sorted(fields))})")
    values = {}
    for name, f in fields.items():
        if name not in data:
            continue
        value = data[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        key = f"{where}.{name}" if where else name
        if dataclasses.is_dataclass(default):
            values[name] = _fill(type(default), value, key)
            continue
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, str):
            ok = isinstance(value, str)
        elif isinstance(default, list):
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif isinstance(default, dict):
            ok = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        else:  # pragma: no cover
            ok = True
        if not ok:
            kind = ("true or false" if isinstance(default, bool) else "a number" if isinstance(default, float)
                    else "an integer" if isinstance(default, int) else "a string" if isinstance(default, str)
                    else "a list of strings" if isinstance(default, list) else "a table of strings")
            raise ConfigError(f"{key} must be {kind}, got {value!r}")
        if isinstance(value, float) and value < 0:
            raise ConfigError(f"{key} must not be negative, got {value!r}")
        values[name] = value
    return cls(**values)


def parse_config(data: dict, path: Optional[str] = None) -> AgentConfig:
    """An :class:`AgentConfig` from a parsed TOML document.

    Raises:
        ConfigError: unknown key, wrong type, negative duration, missing ``ray.address`` or one
            that is not HOST:PORT, bad launcher, bad time window or day name.
    """
    cfg = _fill(AgentConfig, data, "")
    cfg.path = path
    if not cfg.ray.address:
        raise ConfigError("ray.address is required: the head node's HOST:PORT, e.g. address = \"10.0.0.1:6379\"")
    host, _, port = cfg.ray.address.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"ray.address must be the head node's HOST:PORT (port 1-65535), e.g. \"10.0.0.1:6379\"; "
                          f"got {cfg.ray.address!r}")
    if cfg.ray.launcher not in ("mccl", "ray"):
        raise ConfigError(f"ray.launcher must be \"mccl\" or \"ray\", got {cfg.ray.launcher!r}")
    if cfg.ray.units < 1:
        raise ConfigError(f"ray.units must be at least 1, got {cfg.ray.units}")
    if cfg.agent.poll_interval_s <= 0:
        raise ConfigError("agent.poll_interval_s must be positive")
    if cfg.agent.max_backoff_s < cfg.agent.backoff_s:
        raise ConfigError("agent.max_backoff_s must be at least agent.backoff_s")
    known = {"input", "remote", "apps", "cpu", "gpu", "schedule", "manual"}
    bad = sorted(set(cfg.agent.unknown_is_busy) - known)
    if bad:
        raise ConfigError(f"agent.unknown_is_busy names unknown probe(s) {bad} (probes: {sorted(known)})")
    from .probes import ScheduleProbe

    try:
        ScheduleProbe(cfg.probes.schedule.windows, cfg.probes.schedule.days)
    except ValueError as exc:
        raise ConfigError(f"probes.schedule: {exc}") from None
    return cfg


def default_config_path() -> str:
    """``$MCCL_AGENT_CONFIG``, else ``/etc/mccl-agent.toml`` if it exists, else ``~/.mccl-agent/agent.toml``."""
    env = os.environ.get("MCCL_AGENT_CONFIG")
    if env:
        return env
    if os.path.exists("/etc/mccl-agent.toml"):
        return "/etc/mccl-agent.toml"
    return os.path.expanduser("~/.mccl-agent/agent.toml")


def load_config(path: Optional[str] = None) -> AgentConfig:
    """Read and check the TOML file at ``path`` (default: :func:`default_config_path`).

    Raises:
        ConfigError: the file is missing, not TOML, or fails :func:`parse_config`'s checks.
    """
    path = path or default_config_path()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"no configuration file at {path} (mccl-agent example-config > {path} writes one)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    try:
        return parse_config(data, path)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


EXAMPLE = '''\
# mccl-agent configuration (TOML). Every key but ray.address is optional; shown are the defaults.

[ray]
address = "10.0.0.1:6379"      # the head node (required)
resource = "pool:mac"          # the custom resource mccl.ray schedules on, one unit per machine
units = 1
extra_args = []                # more `ray start` arguments, e.g. ["--num-cpus=16"]
launcher = "mccl"              # "mccl": python -m mccl.ray.node (checks mccl first); "ray": ray start
ifname = ""                    # MCCL_SOCKET_IFNAME for the workers started here, e.g. "en0"
drain_s = 0.0                  # > 0: drain the node (Ray preemption) this long before stopping it
stop_timeout_s = 1.0           # SIGTERM, then SIGKILL after this long
env = {}                       # more environment for the node, e.g. { RAY_memory_monitor_refresh_ms = "0" }

[agent]
poll_interval_s = 1.0          # how often the probes are read
join_after_s = 600.0           # every probe idle this long, without a break, before joining
backoff_s = 30.0               # after the node exits on its own: wait, doubling...
max_backoff_s = 900.0          # ...up to this
state_dir = "~/.mccl-agent"    # status.json, transitions.jsonl, ray-node.log, keep-out
unknown_is_busy = []           # probes whose "cannot tell" keeps the machine out, e.g. ["input"]
log_level = "INFO"

[probes.input]                 # console keyboard/mouse (macOS HIDIdleTime; Linux logind idle hint)
enabled = true
min_idle_s = 600.0

[probes.remote]                # remote logins (utmp) and remote-session processes (ssh, Screen Sharing)
enabled = true
ignore_users = []              # accounts whose sessions never count, e.g. ["fleetadmin"]
processes = ["sshd: *@*", "sshd-session", "ScreensharingAgent", "screensharingd", "ARDAgent: *", "SSMenuAgent"]

[probes.apps]                  # applications that mean someone is at work (wildcards, any case)
enabled = true
names = ["Pro Tools", "Logic Pro", "Logic Pro X", "Final Cut Pro", "DaVinci Resolve", "Avid Media Composer", "Nuendo*", "Cubase*"]

[probes.cpu]                   # CPU used by anything but this agent's own Ray node and its workers
enabled = true
max_percent = 30.0
window_s = 30.0

[probes.gpu]                   # GPU utilisation, consulted only while out of Ray
enabled = true
max_percent = 20.0

[probes.schedule]              # local time; a window whose end is before its start wraps midnight
enabled = true
windows = ["20:00-08:00"]
days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]

[probes.manual]                # "keep me out": mccl-agent keep-out on|off
enabled = true
path = ""                      # default: <state_dir>/keep-out
'''
