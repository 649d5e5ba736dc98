"""``python -m mccl.agent``: the same as the ``mccl-agent`` command."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
