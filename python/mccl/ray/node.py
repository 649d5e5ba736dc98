"""``mccl-ray-node``: start a Ray node that mccl jobs can schedule on, one worker per machine.

Run it once on every machine of the fleet (the first one with ``--head``)::

    mccl-ray-node --head --port 6379                 # on the first Mac
    mccl-ray-node --address 10.0.0.1:6379            # on every other Mac
    mccl-ray-node --address 10.0.0.1:6379 --ifname en5   # pin mccl's traffic to an interface

It checks that this machine can run an mccl worker (mccl and its extension import, the device
it would train on), then runs ``ray start`` with one unit of the custom resource (``pool:mac`` by
default) so that ``mccl.ray.MCCLTrainer`` places exactly one worker here. Arguments after ``--``
go to ``ray start`` unchanged (``--num-cpus``, ``--node-ip-address``, ``--temp-dir``, ...).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Optional, Sequence

from .. import _cli
from . import DEFAULT_RESOURCE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mccl-ray-node", description=__doc__.split("\n\n")[0],
        epilog="Arguments after `--` are passed to `ray start` unchanged.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--head", action="store_true", help="start the cluster's head node on this machine")
    where.add_argument("--address", help="HOST:PORT of the head node to join")
    parser.add_argument("--port", type=_cli.int_in(1, 65535, what="a TCP port"), default=6379, help="head node port (with --head)")
    parser.add_argument("--resource", default=DEFAULT_RESOURCE, help="custom resource mccl workers request")
    parser.add_argument("--units", type=_cli.int_at_least(1), default=1,
                        help="units of the resource this machine holds: 1 per machine; more only to stand "
                             "in for several machines on one")
    parser.add_argument("--ifname", default=None,
                        help="set MCCL_SOCKET_IFNAME for the workers started here (e.g. en0, =bridge0, ^utun)")
    parser.add_argument("--block", action="store_true", help="stay in the foreground (ray start --block)")
    parser.add_argument("--dry-run", action="store_true", help="check this machine, print the command, start nothing")
    parser.add_argument("--skip-check", action="store_true", help="start even if mccl cannot be imported here")
    return parser


def check_machine() -> tuple[bool, str]:
    """Whether an mccl worker can run on this machine, and a one-line description of it."""
    try:
        import torch

        import mccl
        from mccl._device import host_device_type
    except Exception as exc:  # an unusable install: the extension, torch or the package itself
        return False, f"mccl cannot be imported here: {type(exc).__name__}: {exc}"
    device = host_device_type()
    carried = device in mccl.DEVICES
    note = "" if carried else (f" (this mccl build carries {mccl.DEVICES} tensors only: jobs here need "
                               f"accelerator='cpu' until its {device} support is installed)")
    return True, (f"mccl {'.'.join(map(str, mccl.version))}, torch {torch.__version__}, device {device}{note}")


def build_command(args: argparse.Namespace, extra: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The ``ray start`` command line and the environment it runs with."""
    if args.units < 1:
        raise SystemExit(f"mccl-ray-node: --units must be at least 1, got {args.units}")
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start"]
    cmd += ["--head", f"--port={args.port}"] if args.head else [f"--address={args.address}"]
    cmd.append("--resources=" + json.dumps({args.resource: args.units}))
    if args.block:
        cmd.append("--block")
    cmd += list(extra)
    env = dict(os.environ)
    if args.ifname:
        env["MCCL_SOCKET_IFNAME"] = args.ifname
    return cmd, env


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    args = _parser().parse_args(argv)
    ok, about = check_machine()
    print(f"mccl-ray-node: {about}", flush=True)
    if not ok and not args.skip_check:
        print("mccl-ray-node: not starting: an mccl worker placed here would fail (--skip-check overrides)",
              file=sys.stderr)
        return 2
    cmd, env = build_command(args, extra)
    shown = (f"MCCL_SOCKET_IFNAME={shlex.quote(args.ifname)} " if args.ifname else "") + shlex.join(cmd)
    print(f"mccl-ray-node: {shown}", flush=True)
    if args.dry_run:
        return 0
    os.execve(cmd[0], cmd, env)  # ray start replaces this process, so signals reach it directly
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
