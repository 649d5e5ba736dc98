"""``python -m mccl.data``: make a manifest, compare a walk with a manifest load, inspect a cache.

    python -m mccl.data manifest ROOT -o manifest.json [--hash sha256] [--workers 16] [--include '*.wav']
    python -m mccl.data compare ROOT manifest.json      # seconds to walk ROOT vs to load the manifest
    python -m mccl.data cache-info /var/tmp/mccl-cache
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Optional, Sequence

from .. import _cli
from .manifest import HASHES, Manifest, build_manifest, walk_files


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mccl.data", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("manifest", help="walk ROOT in parallel and write its manifest")
    m.add_argument("root")
    m.add_argument("-o", "--output", required=True, type=_cli.output_file, help="manifest file to write (JSON)")
    m.add_argument("--hash", choices=HASHES, default=None, help="also digest every file (reads every byte)")
    m.add_argument("--workers", type=_cli.int_at_least(1), default=16, help="directories listed (and files hashed) at once")
    m.add_argument("--include", action="append", default=[], help="keep only names matching this pattern (repeatable)")
    m.add_argument("--hidden", action="store_true", help="keep names starting with '.' (.DS_Store, ._* files)")
    m.add_argument("--no-progress", action="store_true", help="no progress bar")
    c = sub.add_parser("compare", help="time a walk of ROOT against loading MANIFEST")
    c.add_argument("root")
    c.add_argument("manifest")
    c.add_argument("--workers", type=_cli.int_at_least(1), default=16)
    c.add_argument("--repeat", type=_cli.int_at_least(1), default=3, help="best of this many runs of each")
    i = sub.add_parser("cache-info", help="size and number of the copies in a ShardCache directory")
    i.add_argument("directory")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "manifest":
        from tqdm import tqdm

        bar = tqdm(unit=" files", disable=args.no_progress, desc="hashing" if args.hash else "walking",
                   file=sys.stderr)
        t0 = time.perf_counter()
        try:
            manifest = build_manifest(args.root, hash=args.hash, workers=args.workers, include=args.include,
                                      hidden=args.hidden, progress=bar.update)
        except NotADirectoryError as exc:
            bar.close()
            print(f"mccl.data: {exc}", file=sys.stderr)
            return 2
        bar.close()
        manifest.save(args.output)
        print(f"{args.output}: {len(manifest)} files, {manifest.total_bytes / 1e9:.3f} GB under {manifest.root}"
              f" in {time.perf_counter() - t0:.2f} s" + (f" ({args.hash})" if args.hash else ""))
        return 0
    if args.command == "compare":
        walk, load = [], []
        try:
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                n_walk = len(walk_files(args.root, args.workers))
                walk.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                n_load = len(Manifest.load(args.manifest))
                load.append(time.perf_counter() - t0)
        except (OSError, ValueError) as exc:  # a missing root or manifest, or a file that is not one
            print(f"mccl.data: {exc}", file=sys.stderr)
            return 2
        print(f"walk of {args.root} ({args.workers} threads): {min(walk):.4f} s for {n_walk} files")
        print(f"manifest load {args.manifest}: {min(load):.4f} s for {n_load} files")
        print(f"ratio: {min(walk) / max(min(load), 1e-9):.1f}x")
        return 0
    from .cache import LAYOUT

    objects = os.path.join(args.directory, LAYOUT, "objects")
    if not os.path.isdir(objects):
        print(f"mccl.data: {args.directory} is not a ShardCache directory", file=sys.stderr)
        return 2
    n = size = 0
    for d in os.scandir(objects):
        for e in os.scandir(d.path):
            n += 1
            size += e.stat().st_size
    print(f"{args.directory}: {n} copies, {size / 1e9:.3f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
