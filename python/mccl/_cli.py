"""argparse types shared by the command-line tools (``mccl.cluster``, ``mccl.bench``, ``mccl.soak``,
``mccl.data``, ``mccl.model``, ``mccl.trace``): numbers with bounds and output files, refused at parse
time with a one-line message instead of failing after the work is done."""
from __future__ import annotations

import argparse
import math
import os
import tempfile
from typing import Callable


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer of at least ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value}: must be {low} or more")
        return value
    return parse


def number_at_least(low: float, *, above: bool = False, what: str = "number") -> Callable[[str], float]:
    """A finite number of at least ``low`` (above it when ``above``); ``what`` names it in errors."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
        if not math.isfinite(value) or value < low or (above and value == low):
            bound = f"above {low:g}" if above else f"at least {low:g}"
            raise argparse.ArgumentTypeError(f"{text}: must be a finite {what}, {bound}")
        return value
    return parse


def int_in(low: int, high: int, *, what: str = "an integer here") -> Callable[[str], int]:
    """An integer from ``low`` to ``high`` inclusive; ``what`` names it with its article in errors
    (a TCP port: ``int_in(1, 65535, what="a TCP port")``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not {what} ({low} to {high})")
        return value
    return parse


def int_list(low: int, high: int | None = None, *, what: str = "number") -> Callable[[str], list[int]]:
    """Comma-separated integers, each from ``low`` to ``high`` (no upper bound when None); at least one."""
    def parse(text: str) -> list[int]:
        try:
            vals = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
        if not vals:
            raise argparse.ArgumentTypeError(f"expected at least one {what}, got {text!r}")
        bad = [v for v in vals if v < low or (high is not None and v > high)]
        if bad:
            span = f"{low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"{bad[0]}: a {what} here is {span}")
        return vals
    return parse


def output_file(text: str) -> str:
    """A file this process can create or replace: its folder is made if missing (as ``mkdir -p``)
    and a probe file is created and removed there, so a results path that cannot be written fails
    at parse time, before a run whose output would be lost. Returns ``text`` unchanged."""
    if not text:
        raise argparse.ArgumentTypeError("an empty file name")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: is a folder; give a file name")
    folder = os.path.dirname(os.path.abspath(text))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".mccl-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: cannot write a file in {folder} ({exc.strerror})") from None
    return text
