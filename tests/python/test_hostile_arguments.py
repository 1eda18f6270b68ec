"""Arguments validated at the edge, and write failures said as what failed to be written where.

Each case once did something else: `--atol -1` made identical traces diverge, NaN tolerances were accepted, `--atol
inf` said MATCH on any bug, `trace --timeout nan` never stopped, a backtracking `--map` hung, `--mapping` or
`show --file` on a FIFO hung, `--out` onto a file said "TinyLlamaModel.forward raised NotADirectoryError", `align
--out /dev/full` and `export --hf-debugger /proc/x` ended in tracebacks. Now each exits 2 with one line naming the
argument or the file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from modeltrace.cli import main
from modeltrace.diff.align import RenameMap, nested_repetition
from modeltrace.diff.compare import DiffOptions
from modeltrace.errors import ModelTraceError
from modeltrace.trace.storage import TRACE_FILE


REPOSITORY = Path(__file__).resolve().parents[2]
REFERENCE = str(REPOSITORY / "examples" / "reference" / "tiny_llama.mtrace")
EXAMPLE = str(REPOSITORY / "examples" / "tiny_llama" / "modeling_tiny_llama.py")


def _refused(capsys: pytest.CaptureFixture[str], arguments: list[str]) -> str:
    """Run the CLI; it must exit 2 (argparse's or ours) with a one-line message, which is returned."""
    try:
        code = main(arguments)
    except SystemExit as exit_:  # argparse refuses arguments this way
        code = exit_.code
    assert code == 2, arguments
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert "Traceback" not in message
    return message


@pytest.mark.parametrize(
    "option, value, said",
    [
        ("--atol", "-1", "argument --atol: '-1': expected a finite tolerance >= 0"),
        ("--atol", "nan", "argument --atol: 'nan': expected a finite tolerance >= 0"),
        ("--atol", "inf", "argument --atol: 'inf': expected a finite tolerance >= 0"),
        ("--rtol", "nan", "argument --rtol: 'nan'"),
        ("--rel-tol", "-0.5", "argument --rel-tol: '-0.5'"),
    ],
)
def test_tolerances_are_finite_and_not_negative(
    capsys: pytest.CaptureFixture[str], option: str, value: str, said: str
) -> None:
    assert said in _refused(capsys, ["diff", REFERENCE, REFERENCE, option, value])


def test_tolerances_are_checked_by_the_python_api_too() -> None:
    for name, value in (("atol", -1.0), ("rtol", float("nan")), ("rel_tol", float("inf"))):
        with pytest.raises(ModelTraceError, match="expected a finite tolerance >= 0"):
            DiffOptions(**{name: value})
    assert DiffOptions(atol=0.0, rtol=1e-3).atol == 0.0


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5"])
def test_timeouts_are_finite_and_positive(capsys: pytest.CaptureFixture[str], value: str) -> None:
    message = _refused(capsys, ["trace", EXAMPLE, "--timeout", value])
    assert f"argument --timeout: '{value}': expected a finite number of seconds > 0" in message


def test_a_map_that_can_backtrack_for_ever_is_refused_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    started = time.perf_counter()
    message = _refused(capsys, ["diff", REFERENCE, REFERENCE, "--map", "^(([a-z_.0-9])+)+X$=>y"])
    assert "--map '^(([a-z_.0-9])+)+X$=>y': a repetition inside a repetition" in message
    assert time.perf_counter() - started < 30


def test_nested_repetition_is_told_from_plain_repetition() -> None:
    for hostile in (r"(a+)+", r"^(([a-z_.0-9])+)+X$", r"(\w*\.)*x", r"(?:a|b+)*c", r"((ab)*)+"):
        assert nested_repetition(hostile), hostile
    for plain in (r"h\.(\d+)", r"^model\.(.*)$", r"layers\.(\d+)\.mlp", r"(a|b)+", r"(ab)?c+", r"x{2}(y+)"):
        assert not nested_repetition(plain), plain
    assert RenameMap.parse(r"h\.(\d+)=>layers.\1").apply("h.3") == "layers.3"


def test_input_files_that_are_fifos_or_devices_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fifo = tmp_path / "mapping.txt"
    os.mkfifo(fifo)
    # NOTE: a FIFO with no writer blocks any read for ever: these return at once, or the test hangs
    assert "not a regular file" in _refused(capsys, ["diff", REFERENCE, REFERENCE, "--mapping", str(fifo)])
    assert "not a regular file" in _refused(capsys, ["show", REFERENCE, "--file", str(fifo)])
    assert "system file" in _refused(capsys, ["show", REFERENCE, "--file", "/dev/zero"])


@pytest.mark.parametrize("target", ["file", "/dev/full"])
def test_a_trace_out_onto_something_that_is_not_a_folder_is_refused_before_tracing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, target: str
) -> None:
    out = tmp_path / "existing.txt" if target == "file" else Path(target)
    if target == "file":
        out.write_text("keep me\n")
    message = _refused(capsys, ["trace", EXAMPLE, "--out", str(out)])
    assert message == (
        f"modeltrace: cannot write the trace to {out}: not a directory (a trace is a folder; choose another --out)"
    )
    if target == "file":
        assert out.read_text() == "keep me\n"


def test_align_out_onto_a_full_device_or_a_folder_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    message = _refused(capsys, ["align", REFERENCE, REFERENCE, "--out", "/dev/full"])
    assert message == "modeltrace: cannot write the mapping to /dev/full: no space left on device"
    message = _refused(capsys, ["align", REFERENCE, REFERENCE, "--out", str(tmp_path)])
    assert message == f"modeltrace: cannot write the mapping to {tmp_path}: is a directory"


def test_export_into_proc_says_what_failed(capsys: pytest.CaptureFixture[str]) -> None:
    message = _refused(capsys, ["export", REFERENCE, "--hf-debugger", "/proc/modeltrace-export"])
    assert message.startswith("modeltrace: cannot write the debugger output to /proc/modeltrace-export: ")


def test_a_write_that_fails_says_so_and_keeps_the_earlier_trace(tmp_path: Path) -> None:
    # A real write failure, as a full disk gives one: the file-size limit makes the kernel refuse the write
    # (EFBIG) in a child process; the earlier trace at the destination must survive intact.
    destination = tmp_path / "kept.mtrace"
    shutil.copytree(REFERENCE, destination)
    before = (destination / TRACE_FILE).read_bytes()
    script = textwrap.dedent(f"""
        import resource, signal
        from modeltrace.errors import ModelTraceError
        from modeltrace.trace.storage import read_trace, write_trace
        trace = read_trace({REFERENCE!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
        try:
            write_trace(trace, {str(destination)!r})
        except ModelTraceError as error:
            print(error)
    """)
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == f"cannot write the trace to {destination}: file too large"
    assert (destination / TRACE_FILE).read_bytes() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kept.mtrace"]


def test_tensors_that_fail_to_be_written_during_the_forward_say_so(tmp_path: Path) -> None:
    # Full tensors are streamed into the trace's temporary folder while the model runs: a failed write there was
    # reported as "forward raised OSError"; it is a write that failed, said as such.
    temporary = tmp_path / ".port.mtrace.tmp-1-abcd"
    temporary.mkdir()
    script = textwrap.dedent(f"""
        import resource, signal
        from pathlib import Path
        from modeltrace.errors import ModelTraceError
        from modeltrace.trace.tensors import StreamingSafetensorsWriter
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        writer = StreamingSafetensorsWriter(Path({str(temporary)!r}))
        try:
            writer.write("0/outputs/", "F32", [32768], memoryview(bytes(4 * 32768)))
            writer.close()
        except ModelTraceError as error:
            print(error)
    """)
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == f"cannot write the trace's tensors into {tmp_path}: file too large"
