#!/usr/bin/env bash
# The CUDA check, for a machine with an NVIDIA GPU (the `device` tool's): one short run (well under 8 minutes).
#   bash bench/gpu_check.sh
# 1. builds the wheel of this checkout and a venv that takes it (no other install: torch with CUDA, transformers
#    and accelerate come from the machine's Python, through --system-site-packages; nothing is downloaded);
# 2. runs the CUDA tests (tests/python/test_cuda.py; they skip where there is no CUDA, so `make test` never needs
#    a GPU): the engine, `modeltrace.capture()` and the CLI's worker on the GPU, each against the CPU;
# 3. runs the capture benchmark (bench/bench_gpu.py) on a medium and a 1B-size Llama in bfloat16 and float32 and
#    prints the table of ratios to the plain forward, then what `capture()` spends after its block, phase by phase
#    (GPU_JSON=FILE also writes both as JSON).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d /tmp/modeltrace-gpu-check.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

echo "# $(date -u +%H:%M:%S) GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo none)"
"$PYTHON" -c 'import torch, sys; print("# torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available()); sys.exit(0 if torch.cuda.is_available() else 3)'

"$PYTHON" -c 'import importlib, importlib.metadata, sys
missing = []
for name in ("transformers", "accelerate", "safetensors", "msgpack", "pygls", "libcst", "pytest", "psutil"):
    try:
        importlib.import_module(name)
        print("#", name, importlib.metadata.version(name))  # pygls has no __version__
    except ImportError:
        missing.append(name)
if missing:
    sys.exit("gpu_check: this Python lacks " + ", ".join(missing) + " (the venv takes them from it: nothing is downloaded)")'

echo "# $(date -u +%H:%M:%S) building the wheel"
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w "$WORK/dist" . >/dev/null
"$PYTHON" -m venv --system-site-packages "$WORK/venv"
# NOTE: where $PYTHON is itself a virtual environment (the GPU machines' python3 is /opt/torch/.venv's), a venv
# made from it sees the base interpreter's site-packages, not that venv's, where torch lies: a .pth file adds them
"$PYTHON" -c 'import site, sys; sys.prefix != sys.base_prefix and print("\n".join(site.getsitepackages()))' \
    > "$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/modeltrace-gpu-check-parent.pth"
"$WORK/venv/bin/python" -m pip install --quiet --no-deps --no-index "$WORK"/dist/modeltrace-*.whl
VPY="$WORK/venv/bin/python"
# NOTE: the tests import the installed package, not this checkout's source
"$VPY" -c 'import modeltrace, sys; print("# modeltrace from", modeltrace.__file__)'

echo "# $(date -u +%H:%M:%S) CUDA tests"
(cd tests/python && timeout 360 "$VPY" -m pytest -q -p no:cacheprovider -o addopts="" -rs test_cuda.py) || status=$?

echo "# $(date -u +%H:%M:%S) capture benchmark"
timeout 300 "$VPY" bench/bench_gpu.py ${QUICK:+--quick} ${GPU_JSON:+--json "$GPU_JSON"}
echo "# $(date -u +%H:%M:%S) done"
exit "${status:-0}"
