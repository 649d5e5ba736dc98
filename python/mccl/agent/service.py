"""Service definitions that keep ``mccl-agent run`` alive: a launchd daemon (macOS) and a systemd
unit (Linux), filled in with this installation's Python and the configuration's path.

A launchd *daemon* (``/Library/LaunchDaemons``), not a per-user agent: the Macs are idle at night
with nobody logged in, and the console idle time and process list it reads are the machine's.
It runs as ``user`` (an account of the fleet's, never an artist's), which needs read access to
the process list only (psutil), and write access to the agent's ``state_dir``.
"""
from __future__ import annotations

import plistlib
import sys
from typing import Optional

__all__ = ["LAUNCHD_LABEL", "launchd_plist", "systemd_unit"]

LAUNCHD_LABEL = "org.mccl.agent"


def _program(python: Optional[str]) -> list[str]:
    return [python or sys.executable, "-m", "mccl.agent", "run"]


def launchd_plist(config_path: str, user: str = "mccl", python: Optional[str] = None,
                  log_dir: str = "/var/log") -> str:
    """A ``/Library/LaunchDaemons/org.mccl.agent.plist`` that starts the agent at boot and
    restarts it if it exits (``KeepAlive``), with a 10 s throttle between restarts."""
    plist = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": _program(python) + ["--config", config_path],
        "UserName": user,
        "RunAtLoad": True,
        "KeepAlive": True,
        "ThrottleInterval": 10,
        "ProcessType": "Background",
        "StandardOutPath": f"{log_dir}/mccl-agent.log",
        "StandardErrorPath": f"{log_dir}/mccl-agent.log",
        "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
        # SIGTERM (launchctl bootout, shutdown) makes the agent leave Ray first; give it the time.
        "ExitTimeOut": 30,
    }
    return plistlib.dumps(plist, sort_keys=False).decode()


def systemd_unit(config_path: str, user: str = "mccl", python: Optional[str] = None) -> str:
    """``/etc/systemd/system/mccl-agent.service``: started after the network, restarted on exit,
    stopped with SIGTERM (the agent leaves Ray) and 30 s before SIGKILL."""
    cmd = " ".join(_program(python) + ["--config", config_path])
    return f"""\
[Unit]
Description=mccl-agent: join this machine to the Ray training pool while nobody uses it
Documentation=https://github.com/mps-ddp/mccl/blob/main/docs/FLEET.md
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
User={user}
ExecStart={cmd}
Restart=always
RestartSec=10
KillSignal=SIGTERM
KillMode=mixed
TimeoutStopSec=30
Environment=PYTHONUNBUFFERED=1
Nice=10

[Install]
WantedBy=multi-user.target
"""
