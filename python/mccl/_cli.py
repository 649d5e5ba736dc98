"""argparse types shared by the command-line tools (``mccl.cluster``, ``mccl.bench``): numbers
with a lower bound, refused at parse time with a one-line message instead of failing later."""
from __future__ import annotations

import argparse
import math
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
