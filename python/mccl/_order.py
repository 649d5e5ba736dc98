"""Where a Future callback's collectives run: the point of the program where it was attached.

A program that issues the same collectives in the same order on every rank must get the same order
on the wire, callbacks included. A callback attached to a Future runs at once if the Future has
completed (torch calls it inside ``then()``), or later on mccl's completion pool: on two ranks the
same callback can run at two different points of the program, and its collectives would meet
other collectives (combined without an error if their sizes agree). So when a callback is
attached to the Future of an mccl Work, or to a Future derived from one by ``then()``, mccl places
an *order marker* in every mccl group at that point (``mcclOrderMarker`` in ``include/mccl.h``),
and the callback runs with it: every collective the callback issues takes the marker's place,
wherever and whenever the callback runs, and collectives issued after the attach wait until the
callback has returned. A callback attached to a Future that has completed already needs none: it
runs right there.

This wraps ``torch._C.Future.then`` and ``add_done_callback`` once, at ``import mccl``; Futures of
other backends only pass through a check. Callbacks attached from C++ are not seen: their
collectives take their place in issue order (torch's built-in C++ comm hooks issue none).
Collectives issued from a callback must not wait for collectives issued after the callback was
attached (they run after the callback returns): the group then fails with a timeout that says so.
Sends and receives issued from a callback take their place in issue order.
"""
from __future__ import annotations

import functools

import torch

from . import _C

_installed = False


def _wrap(callback, mark):
    @functools.wraps(callback)
    def run(fut):
        with mark:
            return callback(fut)

    return run


def install() -> None:
    """Wrap ``torch._C.Future.then`` and ``add_done_callback`` (idempotent)."""
    global _installed
    if _installed:
        return
    cls = torch._C.Future
    plain_then, plain_add = cls.then, cls.add_done_callback

    def then(self, callback):
        mark = _C._order_mark(self)
        child = plain_then(self, callback if mark is None else _wrap(callback, mark))
        if mark is not None or _C._is_mccl_future(self):
            _C._derived_future(child)  # a then() on it orders like one on the mccl Future
        return child

    def add_done_callback(self, callback):
        mark = _C._order_mark(self)
        return plain_add(self, callback if mark is None else _wrap(callback, mark))

    then.__doc__, add_done_callback.__doc__ = plain_then.__doc__, plain_add.__doc__
    cls.then, cls.add_done_callback = then, add_done_callback
    _installed = True
