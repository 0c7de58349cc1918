#!/usr/bin/env bash
# Creates .venv and installs vmfuzz into it (idempotent; safe to re-run).
#
# torch is pinned and installed first: a bare `torch` requirement on a machine
# without torch resolves to a multi-GB CUDA build. The pin comes from the
# machine's own wheels and index (a CPU wheel here and on our CI runners); a
# runner that has none sets VMFUZZ_TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (PyPI's Linux torch is the CUDA build). VMFUZZ_TORCH=torch==X picks another
# build, e.g. a CUDA one with its index.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VMFUZZ_VENV:-.venv}
TORCH=${VMFUZZ_TORCH:-torch==2.13.0}
TORCH_INDEX=()
if [ -n "${VMFUZZ_TORCH_INDEX:-}" ]; then
    TORCH_INDEX=(--index-url "$VMFUZZ_TORCH_INDEX")
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "bootstrap: creating $VENV"
    "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "bootstrap: installing $TORCH${VMFUZZ_TORCH_INDEX:+ from $VMFUZZ_TORCH_INDEX}"
    "$VENV/bin/pip" install -q ${TORCH_INDEX[@]+"${TORCH_INDEX[@]}"} "$TORCH" 2>&1 | grep -v "^WARNING: Location" || true
fi
echo "bootstrap: installing vmfuzz (editable), its dependencies and the test tools"
"$VENV/bin/pip" install -q -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import vmfuzz.harness, hypothesis, msgspec, torch; print('bootstrap: ready (torch', torch.__version__ + ')')"
