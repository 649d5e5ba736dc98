"""The torch-version guard, run by ``import mccl`` before the C++ extension (``mccl._C``) loads.

The extension is compiled against one torch's C++ headers and links against its libraries. Under
another torch release it may fail to load with an undefined symbol or, worse, abort the whole
interpreter while it registers its kernels ("Mismatch in kernel C++ signatures", as third-party
c10d backends do when the torch minor version differs). So the build writes the torch it was
built against into ``mccl/_build_info.py`` (setup.py), and this module compares it with the
running torch first, raising an ImportError that names both versions and the fix.

Versions match when their releases match (``2.13.0`` in ``2.13.0+cpu``): the local label
(``+cpu``, ``+cu128``) says which device runtimes the torch wheel carries, not its C++ API, and
the extension loads CUDA itself at run time.
"""
from __future__ import annotations

import os
from typing import Any, Optional

__all__ = ["build_record", "check_torch", "release"]


def build_record() -> Optional[dict[str, Any]]:
    """The build record setup.py wrote beside the extension, or None if there is none (an
    extension built by an older setup.py, or none built yet: loading it will say so)."""
    try:
        from ._build_info import BUILD
    except ImportError:
        return None
    return dict(BUILD)


def release(version: str) -> str:
    """``version`` without its local label: ``"2.13.0+cpu"`` -> ``"2.13.0"``."""
    return str(version).split("+", 1)[0]


def check_torch(running: str) -> None:
    """Raise ImportError if this mccl was built against another torch release than ``running``.

    Raises:
        ImportError: naming both versions, where this mccl is, and the two ways to fix it.
    """
    build = build_record()
    built = build.get("torch_version") if build else None
    if not built or release(built) == release(running):
        return
    where = os.path.dirname(os.path.abspath(__file__))
    installed = any(part in ("site-packages", "dist-packages") for part in where.split(os.sep))
    rebuild = ("from mccl's source folder: pip install --no-build-isolation --force-reinstall --no-deps ."
               if installed else  # a checkout: the extension was built in place (make install, -e .)
               "in this checkout: make install, or pip install --no-build-isolation -e .")
    raise ImportError(
        f"mccl ({where}) was built against torch {built}, but this Python runs torch {running}. Its "
        f"C++ extension works only with the torch release it was compiled against (under another it "
        f"can fail to load or abort the interpreter), so it was not loaded. Fix: install that torch "
        f"(pip install torch=={release(built)}), or rebuild mccl against this one, {rebuild}")
