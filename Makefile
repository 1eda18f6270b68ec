# ModelTrace: `make demo` sets everything up and traces the bundled example; `make test` runs every test.
# Both work on a fresh machine: they create .venv, install the pinned CPU torch first, then the rest.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PY_STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
VSIX := extension/out/modeltrace-0.1.0.vsix
EXAMPLE := examples/tiny_llama/modeling_tiny_llama.py

.PHONY: demo test test-python test-package test-extension install extension bench bench-large bench-peers clean

PORT := examples/tiny_llama_port/modeling_tiny_llama_port.py
REFERENCE := examples/reference/tiny_llama.mtrace

demo: $(PY_STAMP) $(VSIX)
	$(VENV)/bin/modeltrace trace $(EXAMPLE) --out build/example.mtrace
	@echo
	@echo "# The port of the example has a bug: its trace against the original's reference finds where."
	$(VENV)/bin/modeltrace trace $(PORT) --full-tensors --out build/port.mtrace > /dev/null
	$(VENV)/bin/modeltrace diff $(REFERENCE) build/port.mtrace || test $$? -eq 1
	@echo
	@echo "Traces: build/example.mtrace build/port.mtrace   Extension: $(VSIX)  (code --install-extension $(VSIX))"

# NOTE: each step is timed (tests/timing/step.sh) and the slowest steps and tests are printed at the end, so a
# growing suite shows in every log; `make test` must stay under 20 minutes on 2 cores.
STEP := tests/timing/step.sh

test:
	rm -f build/test-steps.tsv build/pytest-junit.xml
	$(STEP) "install: venv, npm packages, the .vsix" $(MAKE) --no-print-directory $(PY_STAMP) $(VSIX)
	$(MAKE) --no-print-directory test-python test-package test-extension; status=$$?; \
		$(PY) tests/timing/summary.py build; exit $$status

# The wheel and sdist installed into a fresh venv (pinned CPU torch only), the CLI and the API run there.
test-package: $(PY_STAMP) $(VSIX)
	$(STEP) "package: wheel in a fresh venv" bash tests/package/run.sh

test-python: $(PY_STAMP)
	$(STEP) "ruff" sh -c '$(VENV)/bin/ruff check pyserver tests bench extension/bundle_python.py && \
		$(VENV)/bin/ruff format --check pyserver tests bench extension/bundle_python.py'
	# NOTE: two pytest processes (pytest-xdist), a file's tests in one of them (`loadfile`: module fixtures built once):
	# many tests wait on workers, servers and subprocesses, so two cores run the suite in ~2/3 of the serial time
	$(STEP) "python tests (pytest)" $(PY) -m pytest -q -n 2 --dist loadfile --junitxml=build/pytest-junit.xml

test-extension: $(PY_STAMP) $(VSIX)
	$(STEP) "typescript: typecheck and unit tests" sh -c 'npm run --silent typecheck && npm run --silent test:unit'
	$(STEP) "real VS Code e2e (install if needed, three modes)" env E2E_SKIP_BUILD=1 bash tests/extension/e2e/run.sh

install: $(PY_STAMP) $(NODE_STAMP)

$(PY_STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c requirements.lock -e '.[test]'
	# NOTE: timm for the port corpus's timm references, without its declared dependencies: they pull torchvision,
	# which has no CPU build in the registry (its tests stand in for torchvision, tests/python/ports/vision_common.py)
	$(PY) -m pip install --quiet --no-deps -c requirements.lock timm
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

extension: $(VSIX)

# NOTE: the .vsix carries the Python server (extension/bundle_python.py, run by `npm run package`): it is rebuilt
# when the package's source changes too.
$(VSIX): $(PY_STAMP) $(NODE_STAMP) package.json tsconfig.json requirements.lock extension/bundle_python.py $(wildcard extension/src/*.ts) \
		$(shell find pyserver/modeltrace -name '*.py' -o -name '*.c')
	npm run --silent build
	MODELTRACE_BUNDLE_PYTHON=$(PY) npm run --silent package

# NOTE: `make bench` leaves out bench_capture.py's 1B-like size (minutes, ~8 GB of memory, peak RSS measured in
# fresh processes): `make bench-large` runs it, or `$(PY) bench/bench_capture.py --large`.
bench: $(PY_STAMP)
	$(PY) bench/bench_capture.py
	$(PY) bench/bench_paths.py
	$(PY) bench/bench_lines.py
	$(PY) bench/bench_server.py
	$(PY) bench/bench_diff.py
	$(PY) bench/bench_parallel.py
	$(PY) bench/bench_align.py
	$(PY) bench/bench_breadth.py
	$(PY) bench/port_verdicts.py

bench-large: $(PY_STAMP)
	$(PY) bench/bench_capture.py --sizes large --large
	$(PY) bench/bench_paths.py --sizes large

# NOTE: the peers benchmark runs in an environment of its own (never .venv): the pinned CPU torch first, then the
# project from this checkout (non-editable, reinstalled when its source changes), TorchLens and nnsight, all under
# constraints that pin torch, so that pip can never resolve another build; torchvision must not be there.
# setuptools' scratch folders (build/lib.*, …) are cleared before each install of the project: a file the checkout
# no longer has must not come back from them. `make bench-peers PEERS_ARGS="--sizes large --rss"` passes options on.
PEERS_VENV := build/peers-venv
PEERS_PY := $(PEERS_VENV)/bin/python
PEERS_CONSTRAINTS := bench/peers-constraints.txt
PEERS_ARGS ?= --sizes tiny medium --rss --json build/bench-peers.json

$(PEERS_VENV)/.peers-installed: pyproject.toml requirements.lock $(PEERS_CONSTRAINTS)
	test -x $(PEERS_PY) || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_PY) -m pip install --quiet --upgrade pip
	$(PEERS_PY) -m pip install --quiet torch==2.13.0
	$(PEERS_PY) -m pip install --quiet -c requirements.lock -c $(PEERS_CONSTRAINTS) . torchlens nnsight
	@if $(PEERS_PY) -m pip show --quiet torchvision 2>/dev/null; then \
		echo "$(PEERS_VENV) has torchvision: the peers benchmark runs without it (rm -r $(PEERS_VENV))"; exit 1; fi
	touch $@

$(PEERS_VENV)/.project-installed: $(PEERS_VENV)/.peers-installed $(shell find pyserver/modeltrace -name '*.py' -o -name '*.c')
	rm -rf build/lib.* build/bdist.* build/temp.*
	$(PEERS_PY) -m pip install --quiet --no-deps --force-reinstall .
	touch $@

bench-peers: $(PEERS_VENV)/.project-installed
	OMP_NUM_THREADS=1 $(PEERS_PY) bench/bench_peers.py $(PEERS_ARGS)

clean:
	rm -rf build extension/out .e2e
