"""The server against hostile files: loads that name special files are refused at once and never hold up the
loads after them, a debugger output linked to `/dev/zero` is refused as a reference, damaged traces are refused
with one line, and a request that fails answers one line (never a traceback).

Run against the server without torch and with an untrusted workspace: reading runs no code, so all of this works
there.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import random
import threading
import tracemalloc
from collections import Counter
from pathlib import Path

import msgpack
import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInternalError
from pytest_lsp import LanguageClient

from modeltrace.errors import TraceFormatError
from modeltrace.lsp.loading import MAX_LOADS_RUNNING, LoadRefused, load_trace_here, run_load
from modeltrace.lsp.server import answered
from modeltrace.trace.records import ModuleCall, SourceLocation, TensorSummary, Trace
from modeltrace.trace.storage import TRACE_FILE, write_trace

from .support import execute, open_document


pytestmark = pytest.mark.asyncio(loop_scope="session")

REFERENCE = Path(__file__).resolve().parents[3] / "examples" / "reference" / "tiny_llama.mtrace"


def _trace_naming(folder: Path, source: Path, digest: str) -> Path:
    summary = TensorSummary(key="0", shape=[1, 4], dtype="float32", mean=0.0, std=1.0, min=-1.0, max=1.0)
    record = ModuleCall(
        index=0,
        path="layer",
        class_name="Layer",
        defined_at=SourceLocation(str(source), 2),
        called_at=SourceLocation(str(source), 2, 4),
        call_index=0,
        parent=-1,
        finish_order=0,
        inputs=[summary],
        outputs=[summary],
    )
    model = {"class": "Model", "file": str(source), "source_hashes": {str(source): digest}}
    return write_trace(Trace(model=model, modules=[record]), folder)


async def test_loads_naming_a_fifo_never_hold_up_the_loads_after_them(
    restricted_client: LanguageClient, tmp_path: Path
) -> None:
    client = restricted_client
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    document = workspace / "modeling.py"
    document.write_text("import torch\nhidden = layer(x)\n")
    fifo = workspace / "modeling_fifo.py"
    os.mkfifo(fifo)
    # NOTE: the old server read each recorded file whole to hash it: a FIFO there blocked a thread of the shared
    # pool for good, and a handful of such loads blocked every later load, diff and trace.
    hostile = _trace_naming(tmp_path / "fifo.mtrace", fifo, "0" * 64)
    uri = open_document(client, document)

    answers = await asyncio.wait_for(
        asyncio.gather(*(execute(client, "modelTrace.loadTrace", uri, str(hostile)) for _ in range(12))), 60
    )

    for answer in answers:
        assert answer["ok"], answer
        assert answer["files"] == [{"recorded": str(fifo), "path": None, "how": "not found", "changed": False}]
    digest = hashlib.sha256(document.read_bytes()).hexdigest()
    good = _trace_naming(tmp_path / "good.mtrace", document, digest)
    answer = await execute(client, "modelTrace.loadTrace", uri, str(good), timeout=30)
    assert answer["modelFile"] == str(document.resolve()), answer
    await execute(client, "modelTrace.clear", uri)


async def test_a_debugger_output_linked_to_dev_zero_is_refused_as_a_reference(
    restricted_client: LanguageClient, tmp_path: Path
) -> None:
    client = restricted_client
    debugger = tmp_path / "debugger"
    debugger.mkdir()
    (debugger / "Model_SUMMARY.json").symlink_to("/dev/zero")
    document = tmp_path / "modeling.py"
    document.write_text("x = 1\n")
    uri = open_document(client, document)

    answer = await execute(client, "modelTrace.setReference", uri, str(debugger), timeout=30)

    assert answer == {
        "ok": False,
        "message": f"ModelTrace: cannot use {debugger} as a reference: {debugger / 'Model_SUMMARY.json'}: not a "
        "regular file, refused as a transformers debugger output",
    }


async def test_a_damaged_trace_is_refused_in_one_line_naming_the_record(
    restricted_client: LanguageClient, tmp_path: Path
) -> None:
    client = restricted_client
    document = msgpack.unpackb((REFERENCE / TRACE_FILE).read_bytes(), raw=False, strict_map_key=False)
    # a statistic given as "": the old server loaded it, and every hover on that line answered a traceback
    document["modules"][3]["outputs"][0]["mean"] = ""
    damaged = tmp_path / "damaged.mtrace"
    damaged.mkdir()
    (damaged / TRACE_FILE).write_bytes(msgpack.packb(document, use_bin_type=True))
    source = tmp_path / "modeling.py"
    source.write_text("x = 1\n")
    uri = open_document(client, source)

    answer = await execute(client, "modelTrace.loadTrace", uri, str(damaged))

    assert answer["ok"] is False
    assert "\n" not in answer["message"]
    assert answer["message"].startswith(f"ModelTrace: {damaged / TRACE_FILE}: module call 3 (")
    assert "statistic mean is '', not a number" in answer["message"]


async def test_a_hint_resolve_with_absurd_data_is_answered(restricted_client: LanguageClient) -> None:
    # (5,000 digits: Python refuses to convert so long a number, which answered a traceback)
    hint = types.InlayHint(position=types.Position(line=0, character=0), label="x", data="1" * 5000 + ":1")
    resolved = await asyncio.wait_for(restricted_client.inlay_hint_resolve_async(hint), 30)
    assert resolved.label == "x"


async def test_a_failing_request_answers_one_line() -> None:
    def broken(ls: object, params: object) -> None:
        raise ValueError("first line\nsecond line")

    async def refused(ls: object, *arguments: object) -> None:
        raise TraceFormatError("/x.mtrace: damaged")

    with pytest.raises(JsonRpcInternalError) as internal:
        answered("textDocument/hover", broken)(None, None)
    assert internal.value.message == "ModelTrace: internal error in textDocument/hover (ValueError: first line)"
    assert internal.value.data is None
    with pytest.raises(JsonRpcException) as failed:
        await answered("modelTrace.loadTrace", refused)(None, "uri")
    assert (failed.value.code, failed.value.message) == (
        types.LSPErrorCodes.RequestFailed,
        "ModelTrace: /x.mtrace: damaged",
    )


async def test_a_load_that_hangs_is_answered_at_its_timeout_and_holds_no_shared_thread() -> None:
    release = threading.Event()
    try:
        with pytest.raises(LoadRefused, match=r"/hung.mtrace: not loaded within 0.2 s"):
            await run_load("/hung.mtrace", release.wait, timeout=0.2)
        # the shared pool is free: other work runs while the hung load still holds its own thread
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 5) == "free"
        hung = [
            asyncio.ensure_future(run_load("/hung.mtrace", release.wait, timeout=30))
            for _ in range(MAX_LOADS_RUNNING - 1)
        ]
        await asyncio.sleep(0.1)
        with pytest.raises(LoadRefused, match="earlier loads are still running"):
            await run_load("/next.mtrace", lambda: None)
    finally:
        release.set()
    assert all(await asyncio.gather(*hung))
    assert await run_load("/next.mtrace", lambda: "loaded") == "loaded"


async def test_the_load_methods_answer_every_damaged_trace_in_one_line(
    restricted_client: LanguageClient, tmp_path: Path
) -> None:
    # A seeded handful of the fuzz suite's damage (`test_hostile_fuzz`) through the real server: each load and each
    # reference is taken or refused in one line, and the server goes on answering.
    client = restricted_client
    source = tmp_path / "modeling.py"
    source.write_text("x = 1\n")
    uri = open_document(client, source)
    original = (REFERENCE / TRACE_FILE).read_bytes()
    generator = random.Random(28)
    figures = Counter()
    for case in range(16):
        data = bytearray(original)
        if case % 2:
            for _ in range(generator.randint(1, 6)):
                data[generator.randrange(len(data))] = generator.randrange(256)
        else:
            del data[generator.randrange(len(data)) :]
        folder = tmp_path / f"fuzz-{case}.mtrace"
        folder.mkdir()
        (folder / TRACE_FILE).write_bytes(bytes(data))
        for command in ("modelTrace.loadTrace", "modelTrace.setReference"):
            answer = await execute(client, command, uri, str(folder), timeout=30)
            figures["accepted" if answer["ok"] else "refused"] += 1
            if not answer["ok"]:
                assert answer["message"].startswith("ModelTrace: ") and "\n" not in answer["message"], answer
    print(
        f"\nserver fuzz: {sum(figures.values())} loads, {figures['refused']} refused, {figures['accepted']} accepted"
    )
    # still answering
    assert (await execute(client, "modelTrace.loadTrace", uri, str(REFERENCE)))["ok"]
    await execute(client, "modelTrace.clear", uri)


async def test_a_refused_load_leaves_nothing_behind(tmp_path: Path) -> None:
    # A large trace damaged in its last record is decoded whole before the check refuses it: all it took must go.
    summary = TensorSummary(key="0", shape=[1, 4], dtype="float32", mean=0.0, std=1.0, min=-1.0, max=1.0)
    records = [
        ModuleCall(
            index=index,
            path=f"layers.{index}",
            class_name="Layer",
            defined_at=SourceLocation("/m.py", 1 + index % 500),
            called_at=SourceLocation("/m.py", 600 + index % 500, 4),
            call_index=0,
            parent=index - 1,
            finish_order=index,
            inputs=[summary],
            outputs=[TensorSummary(key=str(index), shape=[1, index], dtype="float32", mean=float(index))],
        )
        for index in range(20_000)
    ]
    folder = write_trace(Trace(model={"class": "Model", "file": "/m.py"}, modules=records), tmp_path / "big.mtrace")
    document = msgpack.unpackb((folder / TRACE_FILE).read_bytes(), raw=False, strict_map_key=False)
    document["modules"][-1][6] = 10**9  # the last call's parent: no such call
    (folder / TRACE_FILE).write_bytes(msgpack.packb(document, use_bin_type=True))
    del document, records
    document_path = tmp_path / "modeling.py"
    document_path.write_text("x = 1\n")

    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        with pytest.raises(TraceFormatError, match="parent 1000000000 is not an earlier call"):
            await run_load(str(folder), load_trace_here, str(document_path), "file:///m", str(folder), [], {})
        gc.collect()
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - before > 10 * 1024 * 1024, "the load did not decode the trace: this test could not fail"
    # NOTE: what stays is the interpreter's table of interned strings, grown by the keys (~1 MB), and whatever
    # another thread of the test process allocated meanwhile (tracemalloc counts every thread); the old code kept
    # the whole decoded trace (29 MB) alive in the failed load's frames.
    assert after - before < 8 * 1024 * 1024
