#!/usr/bin/env bash
# Bootstrap .venv for development and CI: idempotent, and seconds on a ready venv.
#
#   bash scripts/bootstrap.sh          # or: make venv
#
# The venv is rebuilt only when pyproject.toml or this script changed (a stamp holds their hash).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV=${DRESSAGE_VENV:-.venv}
STAMP="$VENV/.dressage-stamp"
want=$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
    exit 0
fi

echo "bootstrap: installing into $VENV (one-off, about 3 minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade "pip==26.3"
# torch first and alone: pip then takes the CPU wheel on disk; nothing later replaces it.
"${PIP[@]}" install "torch==2.13.0"
"${PIP[@]}" install -e ".[dev]"
"$VENV/bin/python" -m pip check >&2
echo "$want" > "$STAMP"
echo "bootstrap: ready" >&2
