#!/usr/bin/env bash
# Installs SGLang for the `sglang` target, CPU-only.
#
#   install_sglang.sh                 sglang==0.5.23 from PyPI into .venv
#   install_sglang.sh --from PATH     a source checkout laid out like SGLang's repository
#                                     (PATH/python/pyproject.toml, PATH/python/sglang/...),
#                                     editable, so the target runs that checkout's code
#   --python PY                       install into PY's environment instead of .venv
#                                     (CI: the job's own interpreter; its torch is kept)
#
# --no-deps throughout: SGLang's own requirements pin torch 2.14.1 and pull CUDA
# builds (GBs). What is listed below is exactly what importing the verify-mask
# modules (verify_mask, eagle_utils, eagle_worker_common, eagle_worker_v2,
# spec_tree) needs on a CPU host, pinned so CI resolves the same set every run.
# Idempotent: without --from, a venv that already imports them is left alone.
set -euo pipefail
usage() { echo "usage: install_sglang.sh [--from SGLANG_CHECKOUT] [--python PY]" >&2; exit 2; }
FROM=""
PY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --from) [ $# -ge 2 ] || usage; FROM=$2; shift 2 ;;
        --python) [ $# -ge 2 ] || usage; PY=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) usage ;;
    esac
done
if [ -n "$FROM" ]; then
    if [ ! -f "$FROM/python/pyproject.toml" ] || [ ! -f "$FROM/python/sglang/__init__.py" ]; then
        echo "install_sglang: --from $FROM: not an SGLang checkout (needs python/pyproject.toml and python/sglang/)" >&2
        exit 2
    fi
    FROM=$(cd "$FROM" && pwd -P)
fi
if [ -n "$PY" ]; then
    PY=$(command -v "$PY" || true)
    [ -n "$PY" ] || { echo "install_sglang: --python: no such interpreter" >&2; exit 2; }
fi
cd "$(dirname "$0")/.."
VENV=${VMFUZZ_VENV:-.venv}
PY=${PY:-$VENV/bin/python}
MODULES="sglang.srt.layers.attention.verify_mask sglang.srt.speculative.eagle_worker_common sglang.srt.speculative.eagle_worker_v2 sglang.kernels.ops.speculative.spec_tree"

[ -x "$PY" ] || [ "$PY" != "$VENV/bin/python" ] || bash scripts/bootstrap.sh

can_import() {
    env -u SGLANG_USE_CPU_ENGINE TRITON_INTERPRET=1 "$PY" -W ignore -c \
        "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" $MODULES
}

if [ -z "$FROM" ] && can_import 2>/dev/null; then
    echo "install_sglang: SGLang already importable by $PY"
    exit 0
fi

if [ -n "$FROM" ]; then
    echo "install_sglang: installing $FROM/python (editable) and its CPU import chain for $PY"
    # compat mode: the checkout's python/ goes on sys.path itself (as PYTHONPATH
    # would put it), so it wins over any sglang already in the environment;
    # setuptools' default finder hook is consulted only after site-packages.
    "$PY" -m pip install -q --no-deps --config-settings editable_mode=compat -e "$FROM/python" 2>&1 | grep -v "^WARNING: Location" || true
    SGLANG_PIN=""
else
    echo "install_sglang: installing sglang==0.5.23 and its CPU import chain for $PY"
    SGLANG_PIN="sglang==0.5.23"
fi
"$PY" -m pip install -q --no-deps \
    $SGLANG_PIN triton==3.6.0 torchvision==0.28.0 \
    transformers==5.19.0 tokenizers==0.23.2 huggingface_hub==2.4.0 safetensors==0.8.0 \
    compressed-tensors==0.18.0 sentencepiece==0.2.1 gguf==0.19.0 apache-tvm-ffi==0.1.11 \
    openai==2.8.0 distro==1.9.0 httpx==0.28.1 httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 \
    anyio==4.16.0 sniffio==1.3.1 idna==3.20 certifi truststore==0.10.5 \
    fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 click==8.5.1 annotated-doc==0.0.7 \
    pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing_extensions==4.16.0 aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 attrs==26.1.0 \
    frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1 \
    orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 pyzmq==27.3.0 requests==2.34.2 urllib3==2.8.0 \
    packaging==26.4 pillow==13.0.0 PyYAML==6.0.4 regex==2026.11.19 filelock==4.3.1 fsspec==2026.9.0 \
    tqdm==4.70.1 einops==0.8.2 dill==0.4.1 loguru==0.7.3 sympy==1.14.0 mpmath==1.4.1 networkx==3.6.1 \
    ipython==9.18.1 traitlets==5.16.1 Pygments==2.21.0 partial-json-parser==0.2.1.1.post7 \
    setproctitle==1.3.8 opentelemetry-api importlib-metadata zipp \
    2>&1 | grep -v "^WARNING: Location" || true

# PyPI's torchvision is a CUDA build: on CPU torch its C ops never register and
# its fake-op registrations fail at import. SGLang imports torchvision on the way
# to the verify-mask code without using it, so define the two op schemas it
# registers against before it is first imported.
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cat > "$SITE/_vmfuzz_tv_cpu_shim.py" <<'PYEOF'
"""Lets a CUDA-built torchvision import on CPU-only torch (written by install_sglang.sh)."""
import importlib.abc
import sys

_LIB = None


def _define_ops():
    global _LIB
    import torch
    try:
        torch.ops.torchvision.nms
        return  # the real C ops loaded: nothing to stand in for
    except (AttributeError, RuntimeError):
        pass
    _LIB = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        _LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    done = False

    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" and not self.done:
            self.done = True  # stays in sys.meta_path: removing it mid-lookup would skip a finder
            _define_ops()
        return None


def install():
    if "torchvision" not in sys.modules and not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())
PYEOF
echo "import _vmfuzz_tv_cpu_shim; _vmfuzz_tv_cpu_shim.install()" > "$SITE/zz_vmfuzz_tv_cpu_shim.pth"

if ! err=$(can_import 2>&1); then
    echo "install_sglang: SGLang still does not import: $(echo "$err" | tail -1)" >&2
    exit 1
fi
if [ -n "$FROM" ]; then
    where=$(env -u SGLANG_USE_CPU_ENGINE "$PY" -W ignore -c "import sglang, os; print(os.path.realpath(sglang.__file__))")
    case "$where" in
        "$FROM"/python/sglang/*) ;;
        *) echo "install_sglang: sglang imports from $where, not from $FROM" >&2; exit 1 ;;
    esac
fi
echo "install_sglang: ready ($("$PY" -c 'from importlib.metadata import version; print("sglang", version("sglang"))'))"
