"""``mccl-agent``: join this machine to the Ray training pool while nobody uses it.

    mccl-agent run [--config agent.toml]      # the daemon (launchd / systemd run this)
    mccl-agent status [--now] [--json]        # state, every probe's reading, recent transitions
    mccl-agent keep-out on [--reason TEXT]    # "keep me out": leave now, stay out until `off`
    mccl-agent keep-out off
    mccl-agent example-config                 # a complete configuration with every default
    mccl-agent check-config [--config ...]    # parse and check a configuration, read the probes once
    mccl-agent service launchd|systemd        # a launchd plist / systemd unit for this install
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Optional, Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mccl-agent", description=__doc__.split("\n\n")[0].replace("``", ""),
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None,
                        help="configuration file (default: $MCCL_AGENT_CONFIG, /etc/mccl-agent.toml, ~/.mccl-agent/agent.toml)")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the agent in the foreground")
    run.add_argument("--log-level", default=None, help="DEBUG, INFO (default: agent.log_level), WARNING")
    status = sub.add_parser("status", help="show the running agent's state and probes")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.add_argument("--now", action="store_true", help="read the probes in this process instead of the agent's file")
    keep = sub.add_parser("keep-out", help="the manual switch: keep this machine out of Ray (on) or let it join (off)")
    keep.add_argument("switch", choices=["on", "off"])
    keep.add_argument("--reason", default="", help="shown as the reason while the switch is on")
    sub.add_parser("example-config", help="print a configuration file with every key and its default")
    sub.add_parser("check-config", help="check the configuration and read every probe once")
    svc = sub.add_parser("service", help="print a service definition that runs the agent")
    svc.add_argument("kind", choices=["launchd", "systemd"])
    svc.add_argument("--user", default="mccl", help="the account the agent runs as")
    svc.add_argument("--python", default=None, help="the Python with mccl installed (default: this one)")
    for p in (run, status, keep, svc, sub.choices["check-config"]):
        p.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _config(path: Optional[str]):
    from .config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        raise SystemExit(f"mccl-agent: {exc}") from None


def _age(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _print_status(st: dict, stale: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    head = f"state [bold]{st['state']}[/bold] for {_age(st.get('state_for_s'))}"
    if st.get("join_in_s") is not None:
        head += f", joining in {_age(st['join_in_s'])} unless a probe turns busy"
    node = st.get("node", {})
    head += f"; Ray node {'running (pid %s)' % node.get('pid') if node.get('running') else 'not running'}"
    if stale:
        head += f"\n[red]status is {_age(time.time() - st['updated'])} old: is the agent (pid {st.get('pid')}) running?[/red]"
    console.print(head)
    table = Table("probe", "verdict", "detail")
    for r in st.get("probes", []):
        verdict = {True: "[red]busy[/red]", False: "[green]idle[/green]", None: "[yellow]unknown[/yellow]"}[r["busy"]]
        table.add_row(r["probe"], verdict, r["detail"])
    console.print(table)
    if st.get("transitions"):
        tt = Table("when", "from", "to", "reason", "outcome")
        for t in st["transitions"][-5:]:
            tt.add_row(time.strftime("%H:%M:%S", time.localtime(t["time"])), t["old"], t["new"], t["reason"],
                       t.get("outcome", ""))
        console.print(tt)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "example-config":
        from .config import EXAMPLE

        sys.stdout.write(EXAMPLE)
        return 0
    if args.command == "service":
        from .config import default_config_path
        from .service import launchd_plist, systemd_unit

        path = os.path.abspath(args.config or default_config_path())
        sys.stdout.write(launchd_plist(path, args.user, args.python) if args.kind == "launchd"
                         else systemd_unit(path, args.user, args.python))
        return 0
    cfg = _config(args.config)
    if args.command == "run":
        return _run(cfg, args.log_level)
    if args.command == "keep-out":
        path = cfg.keep_out_path
        if args.switch == "on":
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(args.reason + "\n" if args.reason else "")
            print(f"mccl-agent: keep-out on ({path}); the agent leaves Ray at its next poll")
        else:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            print(f"mccl-agent: keep-out off; the machine may join after {cfg.agent.join_after_s:g} s idle")
        return 0
    if args.command == "check-config" or args.now:
        from .daemon import Agent
        from .node import RayNode

        agent = Agent(cfg, node=RayNode(cfg.ray.address))  # a node object that is never started
        if any(p.name == "cpu" for p in agent.probes):
            agent.read_probes()  # the CPU probe measures between two readings
            time.sleep(1.0)
        agent.readings = agent.read_probes()
        agent.verdict = agent.rule.decide(agent.readings)
        st = agent.status()
        st["state"] = "(probes read now)"
        if args.command == "check-config":
            print(f"mccl-agent: {cfg.path}: OK; head {cfg.ray.address}; {agent.node.shown()}")
    else:
        from .daemon import read_status

        st = read_status(cfg.status_path)
        if st is None:
            print(f"mccl-agent: no status at {cfg.status_path}: the agent has not run with this configuration "
                  f"(mccl-agent status --now reads the probes here)", file=sys.stderr)
            return 1
    if getattr(args, "json", False):
        print(json.dumps(st, indent=1))
        return 0
    stale = "updated" in st and time.time() - st["updated"] > 3 * st.get("poll_interval_s", 1) + 10 \
        and st["state"] != "(probes read now)"
    _print_status(st, stale)
    return 0


def _run(cfg, level: Optional[str]) -> int:
    from .daemon import Agent

    logging.basicConfig(level=(level or cfg.agent.log_level).upper(),
                        format="%(asctime)s mccl-agent %(levelname)s %(message)s")
    agent = Agent(cfg)
    agent.install_signal_handlers()
    agent.run()
    return 0
