"""The order the benchmarks run their variants in: each round shuffled anew, the same orders in every run.

Imported by the bench scripts (run as `python bench/<script>.py`, which puts this folder on `sys.path`). What ran
just before a call moves its time (docs/benchmarks.md, "What ran before a call"): at tiny a plain forward took
1.21 ms after a plain forward and 1.59 ms after the CLI's full-tensors job. A rotation, the order these scripts
used before session 23, gave each variant the same predecessor in every round, so that each ratio carried its
own predecessor's effect.
"""

from __future__ import annotations

import random

# NOTE: fixed, so that two runs of the same code time the same orders
ORDER_SEED = 33


def round_order(names: list[str], rounds: int, seed: int = ORDER_SEED) -> list[list[str]]:
    """Each round's order of `names`: a fresh shuffle per round, not a rotation. In a rotation every variant has
    the same predecessor in every round, and the predecessor's leftovers (memory it freed, files it wrote and
    deleted, caches it filled) then bias that variant's ratio in every round alike; shuffled, each variant follows
    every other about equally often, and the paired median sees that as noise, the same for all."""
    generator = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(names)
        generator.shuffle(order)
        orders.append(order)
    return orders
