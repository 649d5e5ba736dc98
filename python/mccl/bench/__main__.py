"""``python -m mccl.bench [collectives|overlap|throughput|ddp] [options]`` (collectives by default)."""
from __future__ import annotations

import argparse
import os
import sys

from . import collectives, ddp, overlap, runtime, throughput

COMMANDS = {"collectives": collectives, "overlap": overlap, "throughput": throughput, "ddp": ddp}


def build_parser(command: str) -> argparse.ArgumentParser:
    module = COMMANDS[command]
    prog = "python -m mccl.bench" + ("" if command == "collectives" else f" {command}")
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=module.__doc__,
        epilog=("commands: python -m mccl.bench [collectives] | overlap | throughput | ddp (each has --help)\n"
                "ranks: under torchrun or `python -m mccl.cluster run` the process is one rank; otherwise it\n"
                "starts --nproc ranks itself (on this machine, or one per host with --cluster ID).\n"
                "examples:\n"
                "  python -m mccl.bench --nproc 2 --backends mccl,gloo -e 16M --goodput measure\n"
                "  torchrun --standalone --nproc-per-node 4 -m mccl.bench --ops all_reduce --json ar.json\n"
                "  python -m mccl.bench --cluster c0 --goodput measure --json r.json --plot r.png   # as root\n"
                "  python -m mccl.bench overlap --nproc 2 --buckets 4\n"
                "  python -m mccl.bench throughput --nproc 4 --world-sizes 1,2,4\n"
                "  python -m mccl.bench ddp --nproc 2 --model tiny --steps 4\n"
                "  python -m mccl.bench ddp --cluster x0 --device cuda --json ddp.json   # ViT-B/16 on the GPU"))
    runtime.add_launch_args(p)
    module.add_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else "collectives"
    rest = argv[1:] if argv and argv[0] == command else argv
    parser = build_parser(command)
    args = parser.parse_args(rest)
    if getattr(args, "max_iters", 1) < getattr(args, "min_iters", 1):
        parser.error(f"--max-iters {args.max_iters} is below --min-iters {args.min_iters}")
    module = COMMANDS[command]
    # Refused here, before any rank starts (and in every rank under torchrun): one line, no traceback.
    if reason := runtime.device_unavailable(getattr(args, "device", "cpu")):
        print(f"mccl.bench: error: --device {args.device}: {reason}", file=sys.stderr)
        return 2
    try:
        if runtime.rank_mode():
            return module.main(args)
        runtime.split_backends(args.backends)  # an unknown name fails here, before any rank starts
        if hasattr(module, "check_args"):
            try:
                world = runtime.driver_spec(args)[1]
            except Exception:  # the cluster is not up, not root, ...: relaunch says so in one line
                world = None
            try:
                module.check_args(args, world)
            except SystemExit as exc:
                print(f"mccl.bench: error: {exc.code}", file=sys.stderr)
                return 2
        if hasattr(module, "drive"):
            return module.drive(args, argv)
        try:
            env = runtime.driver_goodput_env(args) if hasattr(args, "goodput") else {}
        except Exception as exc:  # the cluster tool says what is wrong (not root, not up, ...)
            print(f"mccl.bench: error: {exc}", file=sys.stderr)
            return 2
        return runtime.relaunch(argv, args, extra_env=env)
    except KeyboardInterrupt:  # the launcher has already stopped every rank
        return 130


def _exit_rank(rc: int) -> None:
    """A rank leaves without finalizing the interpreter. After the last gloo barrier, gloo's worker
    thread may drop its finished Work (which holds tensors Python also holds, so the drop takes the
    GIL) only once the interpreter is finalizing: Python then ends that thread inside a destructor
    and the process aborts ("terminate called without an active exception": 2 of 60 throughput runs
    on 2 cores, the core dump in ProcessGroupGloo::runLoop). The results are written and every
    process group destroyed by then, so there is nothing left for finalization to do."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    code = main()
    if runtime.rank_mode():
        _exit_rank(code)
    sys.exit(code)
