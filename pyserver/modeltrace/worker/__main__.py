"""`python -m modeltrace.worker`: the worker process (see `zygote`)."""

from __future__ import annotations

from modeltrace.worker.zygote import main


if __name__ == "__main__":
    main()
