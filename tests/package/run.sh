#!/usr/bin/env bash
# The packages a user installs without this repository. Builds the wheel and the sdist (`python -m build`),
# installs the wheel into a fresh virtual environment that holds only the pinned CPU torch, then runs the CLI and
# the library API there, from outside the checkout; prints the wheel's install time and the .vsix's size.
#   tests/package/run.sh            (make test-package; the .vsix must be built: make extension)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$REPO/.venv/bin/python"
BUILD="$REPO/build/package"
VENV="$BUILD/venv"
log() { echo "[package] $*"; }

rm -rf "$BUILD"
mkdir -p "$BUILD"
log "python -m build (wheel and sdist)"
"$PY" -m build --outdir "$BUILD/dist" "$REPO" > "$BUILD/build.log" 2>&1 || { tail -30 "$BUILD/build.log"; exit 1; }
WHEEL="$(ls "$BUILD"/dist/modeltrace-*.whl)"
SDIST="$(ls "$BUILD"/dist/modeltrace-*.tar.gz)"
# The sdist builds the kernel from its source: the C file and the build configuration must be in it.
# NOTE: the listing first (grep -q closing the pipe early would fail the pipeline under pipefail).
listing="$(tar -tzf "$SDIST")"
for member in pyserver/modeltrace/worker/native/moments.c pyproject.toml; do
  grep -q "/$member\$" <<< "$listing" || { log "the sdist lacks $member"; exit 1; }
done
log "built $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KB), $(basename "$SDIST")"

# NOTE: a fresh venv off the machine's python3, never the project's; torch first and pinned (the CPU build on
# these machines), as the README tells users.
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
started=$(date +%s%N)
"$VENV/bin/pip" install --quiet --disable-pip-version-check -c "$REPO/requirements.lock" "$WHEEL" 2>&1 \
  | grep -v "^WARNING: Location" || true
finished=$(date +%s%N)
log "wheel installed (with its dependencies but torch) in $(( (finished - started) / 1000000 )) ms"

cd "$BUILD"  # NOTE: outside the checkout: nothing of it can be imported by accident
"$VENV/bin/python" -c "import modeltrace, sys; assert modeltrace.__file__.startswith('$VENV'), modeltrace.__file__"
"$VENV/bin/modeltrace" trace "$REPO/examples/tiny_llama/modeling_tiny_llama.py" --out "$BUILD/example.mtrace" \
  > "$BUILD/trace.txt"
grep -q "self.self_attn(" "$BUILD/trace.txt" && grep -q "\[1, 7, 64\]" "$BUILD/trace.txt" \
  || { log "modeltrace trace printed no annotated source:"; head -40 "$BUILD/trace.txt"; exit 1; }
log "CLI: modeltrace trace annotated the example"
"$VENV/bin/modeltrace" trace "$REPO/examples/tiny_llama_port/modeling_tiny_llama_port.py" --full-tensors \
  --out "$BUILD/port.mtrace" > /dev/null
status=0
"$VENV/bin/modeltrace" diff "$REPO/examples/reference/tiny_llama.mtrace" "$BUILD/port.mtrace" > "$BUILD/diff.txt" || status=$?
# NOTE: the port's bug is in its attention (examples/tiny_llama_port): the divergence must name that module.
[ "$status" -eq 1 ] && grep -q "^FIRST DIVERGENCE: layers.0.self_attn (TinyLlamaPortAttention)$" "$BUILD/diff.txt" \
  || { log "modeltrace diff of the port exited with $status:"; head -40 "$BUILD/diff.txt"; exit 1; }
log "CLI: modeltrace diff found the port's divergence"
"$VENV/bin/python" "$REPO/tests/package/use_api.py" "$REPO" "$BUILD"

VSIX="$REPO/extension/out/modeltrace-0.1.0.vsix"
if [ -f "$VSIX" ]; then
  log ".vsix: $(du -k "$VSIX" | cut -f1) KB ($(unzip -l "$VSIX" | tail -1 | awk '{print $2}') files)"
fi
log "passed"
