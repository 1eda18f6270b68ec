"""Models spread over devices and ranks, on the CPU: a tiny Llama saved with save_pretrained, traced plainly, with
`--device-map` (accelerate, one layer offloaded to disk) and with `--nproc 2` (transformers' tp_plan="auto" over
two gloo ranks). The three traces diff as a match; a bug on rank 1 only is found and named with its rank; bad input
(a hub id, a map naming a missing GPU, a rank that dies or hangs) gives one clear line and leaves nothing behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from conftest import EXAMPLE_PACKAGE


TP_PLAN = textwrap.dedent("""
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }
""")
QUERY_LINE = "        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"


def run_cli(*arguments: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "modeltrace", *arguments], capture_output=True, text=True, timeout=timeout
    )


def _package(root: Path, name: str, query_replacement: str | None = None) -> Path:
    """A copy of the example package whose config carries Llama's tensor-parallel plan (data, as transformers'
    LlamaConfig has it), with the query projection's line replaced when asked; returns its modeling file."""
    target = root / name
    shutil.copytree(EXAMPLE_PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    configuration = target / "configuration_tiny_llama.py"
    text = configuration.read_text()
    anchor = '    model_type = "tiny_llama"\n'
    configuration.write_text(text.replace(anchor, anchor + textwrap.indent(TP_PLAN, "    "), 1))
    modeling = target / "modeling_tiny_llama.py"
    if query_replacement is not None:
        source = modeling.read_text()
        assert QUERY_LINE in source
        modeling.write_text(
            source.replace(QUERY_LINE, textwrap.indent(textwrap.dedent(query_replacement), " " * 8), 1)
        )
    return modeling


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("devices")
    modeling = _package(root, "tiny_llama_tp")
    checkpoint = root / "checkpoint"
    subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(root)!r})
        from tiny_llama_tp.modeling_tiny_llama import TinyLlamaModel
        from tiny_llama_tp.configuration_tiny_llama import TinyLlamaConfig
        torch.manual_seed(0)
        TinyLlamaModel(TinyLlamaConfig()).save_pretrained({str(checkpoint)!r})
    """),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    device_map = {"embed_tokens": "cpu", "rotary_emb": "cpu", "layers.0": "cpu", "layers.1": "disk", "norm": "cpu"}
    (root / "device_map.json").write_text(json.dumps(device_map))
    return {"root": root, "modeling": modeling, "checkpoint": checkpoint, "device_map": root / "device_map.json"}


@pytest.fixture(scope="module")
def traces(setup: dict[str, Path]) -> dict[str, Path]:
    root, modeling, checkpoint = setup["root"], str(setup["modeling"]), str(setup["checkpoint"])
    out = {name: root / f"{name}.mtrace" for name in ("plain", "mapped", "parallel")}
    for name, extra in (
        ("plain", ["--full-tensors"]),
        ("mapped", ["--device-map", str(setup["device_map"])]),
        ("parallel", ["--nproc", "2", "--full-tensors", "--timeout", "300"]),
    ):
        completed = run_cli("trace", modeling, "--checkpoint", checkpoint, "--out", str(out[name]), *extra)
        assert completed.returncode == 0, completed.stderr
    return out


def _document(trace: Path) -> dict:
    completed = run_cli("show", str(trace), "--format", "json")
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def _diff(reference: Path, candidate: Path) -> dict:
    completed = run_cli("diff", str(reference), str(candidate), "--format", "json")
    assert completed.returncode in (0, 1), completed.stderr
    return json.loads(completed.stdout)


def test_device_map_records_say_where_they_ran_and_weights_are_real(traces: dict[str, Path]) -> None:
    mapped, plain = _document(traces["mapped"]), _document(traces["plain"])
    devices = {record["path"]: record.get("device") for record in mapped["modules"]}
    assert devices["layers.0.self_attn.q_proj"] == "cpu"
    assert devices["layers.1.self_attn.q_proj"] == "cpu (weights offloaded to disk)"
    assert mapped["model"]["options"]["placed"]["layers.1"] == "disk"
    # the offloaded layer's weights are fingerprinted from their real values (accelerate's hook loads them)

    def weight(document: dict, path: str) -> dict:
        build = next(build for build in document["builds"] if build["path"] == path)
        return next(parameter for parameter in build["parameters"] if parameter["name"] == "weight")

    offloaded, single = weight(mapped, "layers.1.mlp.down_proj"), weight(plain, "layers.1.mlp.down_proj")
    assert offloaded["summary"]["std"] == pytest.approx(single["summary"]["std"]) and single["summary"]["std"] > 0
    assert offloaded["sample"] == pytest.approx(single["sample"])


def test_parallel_trace_describes_whole_tensors_with_each_rank_shard(traces: dict[str, Path]) -> None:
    parallel, plain = _document(traces["parallel"]), _document(traces["plain"])
    assert parallel["model"]["parallel"]["nproc"] == 2
    assert parallel["model"]["parallel"]["rank_divergences"] == []
    by_path = {record["path"]: record for record in parallel["modules"]}
    plain_by_path = {record["path"]: record for record in plain["modules"]}
    query = by_path["layers.0.self_attn.q_proj"]["outputs"][0]
    single = plain_by_path["layers.0.self_attn.q_proj"]["outputs"][0]
    assert query["shape"] == single["shape"]
    assert query["placement"]["kind"] == "shard" and query["placement"]["dim"] == len(single["shape"]) - 1
    half = single["shape"][-1] // 2
    assert query["placement"]["local_shapes"] == [single["shape"][:-1] + [half]] * 2
    # statistics combined from the two shards are those of the whole
    for name in ("mean", "std", "min", "max"):
        assert query[name] == pytest.approx(single[name], rel=1e-5, abs=1e-7)
    # the attention weights are sharded over heads; the attention output is whole on each rank (all-reduced)
    attention = by_path["layers.0.self_attn"]["outputs"]
    assert attention[0]["placement"] == {"kind": "replicate", "ranks": 2}
    assert attention[1]["placement"]["dim"] == 1
    # full tensors gathered: the stored query output is the whole tensor
    assert query.get("tensor")


@pytest.mark.parametrize(
    ("reference", "candidate"),
    [("plain", "mapped"), ("plain", "parallel"), ("mapped", "parallel"), ("parallel", "plain")],
)
def test_the_three_traces_diff_as_a_match(traces: dict[str, Path], reference: str, candidate: str) -> None:
    result = _diff(traces[reference], traces[candidate])
    assert result["match"] is True, result["first_divergence"]
    assert result["verdict"] == "match"
    assert result["aligned"] == len(result["modules"])


def test_a_bug_on_rank_one_is_found_and_named(setup: dict[str, Path], traces: dict[str, Path]) -> None:
    buggy = _package(
        setup["root"],
        "tiny_llama_rank_bug",
        """
        query_states = self.q_proj(hidden_states)
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
            query_states = query_states * 1.5  # the bug: rank 1's shard of the queries scaled
        query_states = query_states.view(hidden_shape).transpose(1, 2)
    """,
    )
    out = setup["root"] / "rank_bug.mtrace"
    completed = run_cli(
        "trace",
        str(buggy),
        "--checkpoint",
        str(setup["checkpoint"]),
        "--nproc",
        "2",
        "--out",
        str(out),
        "--timeout",
        "300",
    )
    assert completed.returncode == 0, completed.stderr
    result = _diff(traces["plain"], out)
    assert result["match"] is False
    assert result["first_divergence"]["path"] == "layers.0.self_attn"
    shards = [finding for finding in result["ranks"] if finding["kind"] == "shard"]
    assert shards and all(finding["ranks"] == [1] and finding["agreeing_ranks"] == [0] for finding in shards)
    assert "rank 1" in shards[0]["message"]
    text = run_cli("diff", str(traces["plain"]), str(out)).stdout
    assert "rank 1" in text and "FIRST DIVERGENCE: layers.0.self_attn" in text
    # between two parallel traces the shards are compared rank by rank
    between = _diff(traces["parallel"], out)
    assert between["match"] is False and between["first_divergence"]["path"] == "layers.0.self_attn"
    assert [finding["ranks"] for finding in between["ranks"] if finding["kind"] == "shard"][0] == [1]


def test_a_replicated_tensor_differing_on_one_rank_is_a_divergence_of_its_own(
    setup: dict[str, Path], traces: dict[str, Path]
) -> None:
    from modeltrace.diff import close_result, diff_paths
    from modeltrace.trace.storage import read_trace, write_trace

    # NOTE: made from the parallel trace (no third tensor-parallel run): rank 1's record of a replicated output,
    # as the merge would have found it, goes through the same code as a run's
    from modeltrace.worker.parallel import merge_ranks

    trace = read_trace(traces["parallel"])
    import copy

    ranks = [copy.deepcopy(trace.modules), copy.deepcopy(trace.modules)]
    for records in ranks:
        for record in records:
            for summary in record.outputs + record.inputs:
                if summary.placement and summary.placement["kind"] == "shard":
                    summary.placement = None  # each rank's own record: its local shard, whole-looking
    norm = next(record for record in ranks[1] if record.path == "layers.1.input_layernorm")
    norm.outputs[0].mean += 0.5
    merged = merge_ranks(ranks, None)
    assert [item["rank"] for item in merged.divergences] == [1]
    assert merged.divergences[0]["path"] == "layers.1.input_layernorm"
    trace.modules = merged.records
    trace.model["parallel"]["rank_divergences"] = merged.divergences
    changed = setup["root"] / "replica.mtrace"
    write_trace(trace, changed)
    result = diff_paths(traces["parallel"], changed)
    try:
        assert not result.match
        assert [finding["rank"] for finding in result.ranks if finding["kind"] == "rank_divergence"] == [1]
    finally:
        close_result(result)


def _assert_one_line(completed: subprocess.CompletedProcess, *words: str) -> None:
    assert completed.returncode == 2, completed.stdout + completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr
    for word in words:
        assert word in lines[0], lines[0]


def _no_rank_left(marker: str) -> None:
    stray = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in process.info["cmdline"] or []):
                stray.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    assert not stray, [process.info["cmdline"] for process in stray]


def test_bad_device_inputs_give_one_line(setup: dict[str, Path], tmp_path: Path) -> None:
    modeling, checkpoint = str(setup["modeling"]), str(setup["checkpoint"])
    out = tmp_path / "bad.mtrace"
    missing_gpu = json.dumps({"embed_tokens": "cuda:3", "rotary_emb": "cpu", "layers": "cpu", "norm": "cpu"})
    _assert_one_line(
        run_cli("trace", modeling, "--checkpoint", checkpoint, "--device-map", missing_gpu, "--out", str(out)),
        "cuda:3",
        "embed_tokens",
    )
    past_the_last_layer = json.dumps({"embed_tokens": "cpu", "layers.0": "cpu", "layers.7": "disk"})
    _assert_one_line(
        run_cli("trace", modeling, "--checkpoint", checkpoint, "--device-map", past_the_last_layer, "--out", str(out)),
        "--device-map",
        "'layers.7'",
    )
    _assert_one_line(
        run_cli(
            "trace", modeling, "--checkpoint", checkpoint, "--device-map", '{"layers": "gpu7"}', "--out", str(out)
        ),
        "--device-map",
        "'gpu7'",
    )
    _assert_one_line(run_cli("trace", modeling, "--device-map", "auto", "--out", str(out)), "--checkpoint")
    _assert_one_line(run_cli("trace", modeling, "--nproc", "2", "--out", str(out)), "--checkpoint")
    _assert_one_line(
        run_cli("trace", modeling, "--checkpoint", "meta-llama/Llama-3.1-8B", "--nproc", "2", "--out", str(out)),
        "rank ",
        "never downloads",
    )
    assert not out.exists() and not list(tmp_path.iterdir())
    _no_rank_left(str(tmp_path))


@pytest.mark.parametrize(
    ("behaviour", "words"),
    [
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", ("rank 1 died", "SIGKILL", "every rank")),
        ("import time; time.sleep(3600)", ("--timeout", "rank", "every rank")),
    ],
)
def test_a_rank_that_dies_or_hangs_ends_the_whole_group(
    setup: dict[str, Path], tmp_path: Path, behaviour: str, words: tuple[str, ...]
) -> None:
    broken = _package(
        tmp_path,
        "tiny_llama_rank_fault",
        f"""
        if torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
            {behaviour}
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    """,
    )
    out = tmp_path / "fault.mtrace"
    completed = run_cli(
        "trace",
        str(broken),
        "--checkpoint",
        str(setup["checkpoint"]),
        "--nproc",
        "2",
        "--out",
        str(out),
        # NOTE: the hanging case waits this long: enough for both ranks to start on a loaded machine (a rank still
        # starting at the deadline is ended the same way, with the same message)
        "--timeout",
        "30",
    )
    _assert_one_line(completed, *words)
    assert not out.exists()
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".fault.mtrace")]
    _no_rank_left(str(tmp_path))


def test_the_hover_shows_each_rank_shard_and_the_device_of_a_call(traces: dict[str, Path]) -> None:
    from modeltrace.lsp.markdown import calls_table
    from modeltrace.trace.storage import read_trace

    parallel = read_trace(traces["parallel"])
    query = [record for record in parallel.modules if record.path == "layers.0.self_attn.q_proj"]
    table = calls_table(query)
    assert "[1,7,64] · sharded on dim 2: rank 0 [1,7,32], rank 1 [1,7,32]" in table, table
    mapped = read_trace(traces["mapped"])
    offloaded = [record for record in mapped.modules if record.path == "layers.1.mlp.down_proj"]
    assert "on cpu (weights offloaded to disk)" in calls_table(offloaded)
