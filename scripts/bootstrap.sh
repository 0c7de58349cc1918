#!/usr/bin/env bash
# Creates .venv and installs vmfuzz into it (idempotent; safe to re-run).
#
# torch is pinned to the CPU wheel first: a bare `torch` requirement on a machine
# without torch resolves to a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VMFUZZ_VENV:-.venv}
TORCH=${VMFUZZ_TORCH:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
    echo "bootstrap: creating $VENV"
    "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "bootstrap: installing $TORCH (CPU wheel)"
    "$VENV/bin/pip" install -q "$TORCH" numpy 2>&1 | grep -v "^WARNING: Location" || true
fi
echo "bootstrap: installing vmfuzz (editable), its dependencies and the test tools"
"$VENV/bin/pip" install -q -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import harness, hypothesis, msgspec, torch; print('bootstrap: ready (torch', torch.__version__ + ')')"
