"""`python -m modeltrace`: the same entry point as the `modeltrace` console script."""

from __future__ import annotations

import sys

from modeltrace.cli import main


if __name__ == "__main__":
    sys.exit(main())
