"""Cost of the automatic alignment (`diff/auto_align.py`, what `modeltrace align` and a diff of traces that share
no module names run): two synthetic traces of ~5,000 module calls each.

    .venv/bin/python bench/bench_align.py            # prints a markdown table
    .venv/bin/python bench/bench_align.py --quick    # fewer rounds

- reference: a transformers-like Llama tree (`layers.N.self_attn.q_proj`, …, `mlp.act_fn`), 384 blocks of 13
  calls plus embeddings, rotary and norm: 4,996 calls;
- candidate `renamed`: the same computation with Meta's names (`layers.N.attention.wq`, `feed_forward.w1`), no
  activation module and no rotary module, its statistics those of the reference to ~1e-7 (copied weights):
  4,228 calls;
- candidate `fused`: as `renamed` with `wqkv` and `w13` fused projections: 3,460 calls, 768 fused pairs;
- candidate `random`: as `renamed` with unrelated statistics (random weights on both sides).

Timed: `align_modules` on traces already in memory (reading them is `bench_diff`'s subject). Best and median
over rounds after a warm-up; the table also gives the share of candidate calls aligned as built.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from modeltrace.diff import align_modules
from modeltrace.trace.records import ModuleCall, TensorSummary, Trace


LAYERS = 384
HIDDEN, KV, INTERMEDIATE = 64, 32, 128


class _Builder:
    """Appends module calls in pre-order with parents and finish order."""

    def __init__(self) -> None:
        self.modules: list[ModuleCall] = []
        self.finished = 0

    def call(
        self,
        path: str,
        class_name: str,
        parent: int,
        inputs: list[list[int]],
        outputs: list[list[int]],
        statistics_of: dict[str, tuple[float, float]],
        key: str,
        input_key: str | None = None,
    ) -> int:
        """One call; its outputs' statistics are `key`'s, its inputs' those of `input_key` (the output that
        feeds it: q, k and v, or the fused qkv, all read the norm's output)."""
        index = len(self.modules)
        mean, std = self._moments(statistics_of, key)
        input_mean, input_std = self._moments(statistics_of, input_key or f"{key}.input")
        self.modules.append(
            ModuleCall(
                index,
                path,
                class_name,
                None,
                None,
                0,
                parent,
                inputs=[TensorSummary("x", shape, "float32", mean=input_mean, std=input_std) for shape in inputs],
                outputs=[TensorSummary("", shape, "float32", mean=mean, std=std) for shape in outputs],
            )
        )
        return index

    @staticmethod
    def _moments(statistics_of: dict[str, tuple[float, float]], key: str) -> tuple[float, float]:
        return statistics_of.setdefault(key, (random.gauss(0, 0.1), random.uniform(0.5, 2.0)))

    def finish(self, index: int) -> None:
        self.modules[index].finish_order = self.finished
        self.finished += 1


def build(style: str, statistics_of: dict[str, tuple[float, float]]) -> Trace:
    builder = _Builder()
    tokens, hidden = [1, 7], [1, 7, HIDDEN]
    meta = style != "reference"
    root = builder.call("", "Transformer" if meta else "LlamaModel", -1, [tokens], [hidden], statistics_of, "root")
    embed = builder.call(
        "tok_embeddings" if meta else "embed_tokens", "Embedding", root, [tokens], [hidden], statistics_of, "embed"
    )
    builder.finish(embed)
    if not meta:
        rotary = builder.call(
            "rotary_emb", "LlamaRotaryEmbedding", root, [hidden], [[1, 7, 16], [1, 7, 16]], statistics_of, "rotary"
        )
        builder.finish(rotary)
    for layer in range(LAYERS):

        def leaf(
            path: str,
            class_name: str,
            parent: int,
            inputs: list[list[int]],
            outputs: list[list[int]],
            key: str,
            input_key: str | None = None,
        ) -> None:
            builder.finish(
                builder.call(
                    path,
                    class_name,
                    parent,
                    inputs,
                    outputs,
                    statistics_of,
                    f"{layer}.{key}",
                    input_key and f"{layer}.{input_key}",
                )
            )

        prefix = f"layers.{layer}"
        block = builder.call(
            prefix,
            "TransformerBlock" if meta else "LlamaDecoderLayer",
            root,
            [hidden],
            [hidden],
            statistics_of,
            f"{layer}.block",
        )
        leaf(
            f"{prefix}.attention_norm" if meta else f"{prefix}.input_layernorm",
            "RMSNorm",
            block,
            [hidden],
            [hidden],
            "norm1",
        )
        attention = builder.call(
            f"{prefix}.attention" if meta else f"{prefix}.self_attn",
            "Attention",
            block,
            [hidden],
            [hidden],
            statistics_of,
            f"{layer}.attn",
        )
        if style == "fused":
            leaf(f"{prefix}.attention.wqkv", "Linear", attention, [hidden], [[1, 7, HIDDEN + 2 * KV]], "qkv", "norm1")
        else:
            for name, width in (("q", HIDDEN), ("k", KV), ("v", KV)):
                leaf(
                    f"{prefix}.attention.w{name}" if meta else f"{prefix}.self_attn.{name}_proj",
                    "Linear",
                    attention,
                    [hidden],
                    [[1, 7, width]],
                    name,
                    "norm1",
                )
        leaf(
            f"{prefix}.attention.wo" if meta else f"{prefix}.self_attn.o_proj",
            "Linear",
            attention,
            [hidden],
            [hidden],
            "o",
        )
        builder.finish(attention)
        leaf(
            f"{prefix}.ffn_norm" if meta else f"{prefix}.post_attention_layernorm",
            "RMSNorm",
            block,
            [hidden],
            [hidden],
            "norm2",
        )
        mlp = builder.call(
            f"{prefix}.feed_forward" if meta else f"{prefix}.mlp",
            "FeedForward" if meta else "LlamaMLP",
            block,
            [hidden],
            [hidden],
            statistics_of,
            f"{layer}.mlp",
        )
        wide = [1, 7, INTERMEDIATE]
        if style == "fused":
            leaf(f"{prefix}.feed_forward.w13", "Linear", mlp, [hidden], [[1, 7, 2 * INTERMEDIATE]], "gate_up", "norm2")
        elif meta:
            leaf(f"{prefix}.feed_forward.w1", "Linear", mlp, [hidden], [wide], "gate", "norm2")
            leaf(f"{prefix}.feed_forward.w3", "Linear", mlp, [hidden], [wide], "up", "norm2")
        else:
            leaf(f"{prefix}.mlp.gate_proj", "Linear", mlp, [hidden], [wide], "gate", "norm2")
            leaf(f"{prefix}.mlp.act_fn", "SiLUActivation", mlp, [wide], [wide], "act", "gate")
            leaf(f"{prefix}.mlp.up_proj", "Linear", mlp, [hidden], [wide], "up", "norm2")
        leaf(
            f"{prefix}.feed_forward.w2" if meta else f"{prefix}.mlp.down_proj", "Linear", mlp, [wide], [hidden], "down"
        )
        builder.finish(mlp)
        builder.finish(block)
    norm = builder.call("norm", "RMSNorm", root, [hidden], [hidden], statistics_of, "final_norm")
    builder.finish(norm)
    builder.finish(root)
    return Trace({"class": style}, builder.modules)


def _fused_statistics(statistics_of: dict[str, tuple[float, float]]) -> None:
    """The fused projections' statistics as the concatenation of the runs they replace would have."""
    for layer in range(LAYERS):
        for fused, members in (
            ("qkv", [("q", HIDDEN), ("k", KV), ("v", KV)]),
            ("gate_up", [("gate", INTERMEDIATE), ("up", INTERMEDIATE)]),
        ):
            moments = [(statistics_of[f"{layer}.{name}"], width * 7) for name, width in members]
            total = sum(count for _, count in moments)
            mean = sum(m * count for (m, _), count in moments) / total
            squares = sum((count - 1) * s * s + count * m * m for (m, s), count in moments)
            statistics_of[f"{layer}.{fused}"] = (mean, ((squares - total * mean * mean) / (total - 1)) ** 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    arguments = parser.parse_args()
    rounds = 3 if arguments.quick else 7
    random.seed(0)
    shared: dict[str, tuple[float, float]] = {}
    reference = build("reference", shared)
    _fused_statistics(shared)
    candidates = {
        "renamed": build("renamed", dict(shared)),
        "fused": build("fused", dict(shared)),
        "random": build("random", {}),
    }
    print(f"reference: {len(reference.modules)} calls\n")
    print("| candidate | calls | aligned as built | fused pairs | best s | median s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, candidate in candidates.items():
        align_modules(reference, candidate)  # warm-up
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            mapping = align_modules(reference, candidate)
            times.append(time.perf_counter() - start)
        right = 0
        for pair in mapping.pairs:
            for path in pair.candidate:
                expected = _expected(path, name)
                right += expected == " + ".join(pair.reference)
        countable = sum(1 for record in candidate.modules if _expected(record.path, name) is not None)
        fused = sum(1 for pair in mapping.pairs if pair.fused)
        print(
            f"| {name} | {len(candidate.modules)} | {right / countable:.1%} | {fused} | {min(times):.3f} | "
            f"{statistics.median(times):.3f} |"
        )


def _expected(path: str, style: str) -> str | None:
    """The reference path of a candidate path, as built above."""
    renames = [
        (".attention_norm", ".input_layernorm"),
        (".ffn_norm", ".post_attention_layernorm"),
        (".attention.wq", ".self_attn.q_proj"),
        (".attention.wk", ".self_attn.k_proj"),
        (".attention.wv", ".self_attn.v_proj"),
        (".attention.wo", ".self_attn.o_proj"),
        (".attention", ".self_attn"),
        (".feed_forward.w1", ".mlp.gate_proj"),
        (".feed_forward.w3", ".mlp.up_proj"),
        (".feed_forward.w2", ".mlp.down_proj"),
        (".feed_forward", ".mlp"),
    ]
    if path == "tok_embeddings":
        return "embed_tokens"
    if path.endswith(".attention.wqkv"):
        prefix = path[: -len(".attention.wqkv")]
        return " + ".join(f"{prefix}.self_attn.{name}_proj" for name in "qkv")
    if path.endswith(".feed_forward.w13"):
        prefix = path[: -len(".feed_forward.w13")]
        return f"{prefix}.mlp.gate_proj + {prefix}.mlp.up_proj"
    for old, new in renames:
        if path.endswith(old):
            return path[: -len(old)] + new
    return path


if __name__ == "__main__":
    main()
