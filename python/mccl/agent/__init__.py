"""mccl-agent: join a workstation to the Ray training pool while nobody uses it, leave when someone does.

The pieces, each replaceable on its own:

- :mod:`mccl.agent.probes`: one class per kind of evidence (console input, remote sessions, busy
  applications such as Pro Tools, CPU and GPU load, a schedule, a manual switch), all behind
  :class:`~mccl.agent.probes.Probe`;
- :mod:`mccl.agent.machine`: the :class:`~mccl.agent.machine.Rule` that combines readings and the
  :class:`~mccl.agent.machine.StateMachine` with hysteresis (idle ``join_after_s`` before joining,
  out at the first busy reading);
- :mod:`mccl.agent.node`: the Ray node it starts (``ray start --address HEAD --resources
  '{"pool:mac": 1}' --block``) and stops (drain, SIGTERM, SIGKILL);
- :mod:`mccl.agent.daemon`: the loop, its log of transitions and the status file;
- :mod:`mccl.agent.config`: the TOML configuration; :mod:`mccl.agent.service`: launchd/systemd.

The command line is ``mccl-agent`` (or ``python -m mccl.agent``); docs/FLEET.md sets up a fleet.
"""
from .config import AgentConfig, ConfigError, load_config, parse_config
from .daemon import Agent, build_probes
from .machine import Rule, State, StateMachine, Transition, Verdict
from .node import RayNode
from .probes import (BusyAppProbe, CpuLoadProbe, GpuLoadProbe, InputIdleProbe, ManualProbe, Probe, ProbeContext,
                     Reading, RemoteSessionProbe, ScheduleProbe, StaticProbe)

__all__ = [
    "Agent", "AgentConfig", "BusyAppProbe", "ConfigError", "CpuLoadProbe", "GpuLoadProbe", "InputIdleProbe",
    "ManualProbe", "Probe", "ProbeContext", "RayNode", "Reading", "RemoteSessionProbe", "Rule", "ScheduleProbe",
    "State", "StateMachine", "StaticProbe", "Transition", "Verdict", "build_probes", "load_config", "parse_config",
]
