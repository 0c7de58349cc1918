#!/usr/bin/env bash
# Installs SGLang for the `sglang` target, CPU-only.
#
#   install_sglang.sh                 sglang==0.5.23 (the newest release known here) from PyPI into .venv
#   --version V                       that release instead: any V with a pin file in
#                                     pins/ beside this script (0.5.17 ... 0.5.23)
#   --from PATH                       a source checkout laid out like SGLang's repository
#                                     (PATH/python/pyproject.toml, PATH/python/sglang/...),
#                                     editable, so the target runs that checkout's code; its
#                                     release (python/pyproject.toml's version, else
#                                     python/sglang/_version.py, else its newest git tag)
#                                     picks the pins; --version overrides
#   --python PY                       install into PY's environment instead of .venv
#                                     (CI: the job's own interpreter; its torch is kept;
#                                     required where this script is not in a vmfuzz
#                                     checkout: an installed wheel's copy, which
#                                     `vmfuzz install-sglang` runs with its own python)
#   --check                           install nothing: check that the installed sglang (release V
#                                     with --version) imports, and which driven modules it has
#
# --no-deps throughout: SGLang's own requirements pin torch 2.14.1 and pull CUDA
# builds (GBs). Each release's import chain is pins/base.txt with
# that release's pins/V.txt laid over it: exactly what importing
# the verify-mask modules and the other modules the harness drives needs on a
# CPU host, pinned so CI resolves the same set every run. No module is stubbed
# on disk; only torchvision's two C-op schemas are defined up front (see below).
# Idempotent: without --from, a venv whose sglang is already the requested
# release and imports is left alone.
set -euo pipefail
die() { echo "install_sglang: $*" >&2; exit 2; }
usage() { echo "usage: install_sglang.sh [--version V] [--from SGLANG_CHECKOUT] [--python PY] [--check]" >&2; exit 2; }
FROM=""
PY=""
WANT=""
CHECK=0
while [ $# -gt 0 ]; do
    case "$1" in
        --from) [ $# -ge 2 ] || die "--from needs a path"; FROM=$2; shift 2 ;;
        --python) [ $# -ge 2 ] || die "--python needs an interpreter"; PY=$2; shift 2 ;;
        --version) [ $# -ge 2 ] || die "--version needs a release, e.g. 0.5.23"; WANT=$2; shift 2 ;;
        --check) CHECK=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) usage ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd -P)
PINS=$HERE/pins
# a checkout has scripts/bootstrap.sh two levels up; a wheel ships this script and pins/ alone
ROOT=""
[ -f "$HERE/../bootstrap.sh" ] && ROOT=$(cd "$HERE/../.." && pwd -P)
KNOWN=$(cd "$PINS" && ls [0-9]*.txt | sed 's/\.txt$//' | sort -V | paste -sd' ')
NEWEST=$(echo $KNOWN | tr ' ' '\n' | tail -1)
if [ -n "$FROM" ]; then
    if [ ! -f "$FROM/python/pyproject.toml" ] || [ ! -f "$FROM/python/sglang/__init__.py" ]; then
        echo "install_sglang: --from $FROM: not an SGLang checkout (needs python/pyproject.toml and python/sglang/)" >&2
        exit 2
    fi
    FROM=$(cd "$FROM" && pwd -P)
    if [ -z "$WANT" ]; then
        # the checkout's release: pyproject's static version, else a version file's
        # __version__ (setuptools-scm writes _version.py), else the newest tag git finds;
        # a .devN / .postN / rcN / +local suffix maps onto its X.Y.Z's pins
        found=$(sed -nE "s/^version *= *[\"']([^\"']+)[\"'].*/\1/p" "$FROM/python/pyproject.toml" | head -1)
        for f in "$FROM/python/sglang/_version.py" "$FROM/python/sglang/version.py"; do
            [ -z "$found" ] && [ -f "$f" ] && found=$(sed -nE "s/^__version__ *=[^\"']*[\"']([^\"']+)[\"'].*/\1/p" "$f" | head -1)
        done
        [ -n "$found" ] || found=$(git -C "$FROM" describe --tags --abbrev=0 2>/dev/null || true)
        [ -n "$found" ] || die "--from $FROM: cannot tell its release (python/pyproject.toml, python/sglang/_version.py, git tags); pass --version V"
        WANT=$(echo "$found" | sed -E 's/^v?([0-9]+\.[0-9]+\.[0-9]+).*/\1/')
        [ -f "$PINS/$WANT.txt" ] || die "--from $FROM: its release $found has no pin file (known: $KNOWN); pass --version V to use one"
    fi
fi
[ "$CHECK" = 0 ] || [ -z "$FROM" ] || die "--check installs nothing: use it without --from"
[ "$CHECK" = 1 ] && [ -z "$WANT" ] && ANY=1 || ANY=0
WANT=${WANT:-$NEWEST}
[ -f "$PINS/$WANT.txt" ] || die "unknown sglang release '$WANT' (known: $KNOWN)"
if [ -n "$PY" ]; then
    PY=$(command -v "$PY" || true)
    [ -n "$PY" ] || die "--python: no such interpreter"
fi
[ -n "$ROOT" ] || [ -n "$PY" ] || die "--python PY is needed: this copy is not in a vmfuzz checkout (no .venv to install into)"
[ -z "$ROOT" ] || cd "$ROOT"
VENV=${VMFUZZ_VENV:-.venv}
PY=${PY:-$VENV/bin/python}
#: the core the target cannot run without (harness/targets/sglang/loader.py)
MODULES="sglang.srt.layers.attention.verify_mask sglang.srt.speculative.eagle_worker_common sglang.srt.speculative.eagle_worker_v2 sglang.kernels.ops.speculative.spec_tree"
#: every SGLang module harness/targets/sglang/*.py imports (grep its `sglang.` names and
#: SITES/ROUTERS tables). One absent from a release's files is reported, not required: the
#: harness says "not driven" for it. kernels/ops/speculative/tree.py (JIT CUDA, imported
#: only when CUDA is there) and flashmla_backend (not driven on CPU) are left out.
DRIVEN="
sglang.srt.layers.attention.verify_mask
sglang.srt.speculative.eagle_utils
sglang.srt.speculative.eagle_info
sglang.srt.speculative.eagle_worker_common
sglang.srt.speculative.eagle_worker_v2
sglang.srt.model_executor.forward_batch_info
sglang.kernels.ops.speculative.spec_tree
sglang.kernels.ops.speculative.eagle
sglang.kernels.ops.speculative.pack_verify_mask
sglang.srt.layers.attention.triton_backend
sglang.srt.layers.attention.flashinfer_backend
sglang.srt.layers.attention.hybrid_attn_backend
sglang.srt.layers.attention.tbo_backend
sglang.srt.layers.attention.hybrid_linear_attn_backend
sglang.srt.layers.attention.dots_hybrid_backend
sglang.srt.speculative.dflash_utils
sglang.srt.layers.attention.flashattention_backend
sglang.srt.layers.attention.trtllm_mla_backend
sglang.srt.layers.attention.deepseek_v4_backend
sglang.srt.layers.attention.deepseek_v4_backend_hip_radix
sglang.srt.layers.attention.qwen_sparse_attn_backend
sglang.srt.managers.scheduler_pp_mixin
sglang.srt.speculative.pp_spec_relay
sglang.srt.speculative.frozen_kv_mtp_worker_v2
sglang.srt.speculative.frozen_kv_mtp_info
"

[ -x "$PY" ] || [ "$PY" != "$VENV/bin/python" ] || bash scripts/bootstrap.sh

installed_version() {
    "$PY" -c 'from importlib.metadata import version; print(version("sglang"))' 2>/dev/null || true
}

can_import() {
    env -u SGLANG_USE_CPU_ENGINE TRITON_INTERPRET=1 "$PY" -W ignore -c \
        "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]" $MODULES
}

# Imports each driven module whose file the installed sglang has. flashattention_backend
# is imported as the harness imports it: each missing non-SGLang extension module
# (sgl_kernel's CUDA ops) stood in for by an empty module, in this check's process only
# (nothing is written to disk).
# Prints "absent: ..." and one "fails: MODULE: error" line per failure; exit 1 on any failure.
check_driven() {
    env -u SGLANG_USE_CPU_ENGINE TRITON_INTERPRET=1 "$PY" -W ignore - $DRIVEN <<'PYEOF'
import importlib, importlib.util, os, sys
root = importlib.util.find_spec("sglang").submodule_search_locations[0]
present, absent = [], []
for name in sys.argv[1:]:
    rel = os.path.join(root, *name.split(".")[1:])
    (present if os.path.isfile(rel + ".py") or os.path.isfile(os.path.join(rel, "__init__.py")) else absent).append(name)
def stubbing_missing(name):
    # as harness/targets/sglang/allocation.py imports flashattention_backend
    import types
    for _ in range(8):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not exc.name or exc.name.startswith("sglang") or exc.name in sys.modules:
                raise
            mod = types.ModuleType(exc.name); mod.__path__ = []
            mod.__getattr__ = lambda attr: type(attr, (), {})
            sys.modules[exc.name] = mod
failed = []
# one interpreter: a module that fails is dropped from sys.modules, so the next one
# retries whatever it shares; the stubbed import goes last, so no stub is seen by another
for name in sorted(present, key=lambda n: n.endswith(".flashattention_backend")):
    try:
        (stubbing_missing if name.endswith(".flashattention_backend") else importlib.import_module)(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
short = lambda names: " ".join(n.rsplit(".", 1)[1] for n in names) or "none"
print(f"install_sglang: driven modules present: {len(present)}, importing: {len(present) - len(failed)}")
print(f"install_sglang: driven modules absent from this release: {short(absent)}")
for line in failed:
    print(f"install_sglang: driven module fails to import: {line}")
sys.exit(1 if failed else 0)
PYEOF
}

if [ "$CHECK" = 1 ]; then
    have=$(installed_version)
    [ -n "$have" ] || { echo "install_sglang: no sglang installed for $PY" >&2; exit 1; }
    [ "$ANY" = 1 ] || [ "$have" = "$WANT" ] || { echo "install_sglang: $PY has sglang $have, not $WANT" >&2; exit 1; }
    if ! err=$(can_import 2>&1); then
        echo "install_sglang: sglang $have does not import: $(echo "$err" | tail -1)" >&2
        exit 1
    fi
    check_driven || { echo "install_sglang: sglang $have: a module the harness drives does not import (lines above)" >&2; exit 1; }
    echo "install_sglang: sglang $have imports ($PY)"
    exit 0
fi

if [ -z "$FROM" ] && [ "$(installed_version)" = "$WANT" ] && can_import 2>/dev/null; then
    echo "install_sglang: sglang $WANT already importable by $PY"
    exit 0
fi

# base.txt with the release's file laid over it: an entry replaces base's entry of the
# same (normalized) name, "-name" drops it
CHAIN=$("$PY" - "$PINS/base.txt" "$PINS/$WANT.txt" <<'PYEOF'
import re, sys
norm = lambda s: re.sub(r"[-_.]+", "-", re.split(r"[=<>!~\[; ]", s, 1)[0]).lower()
pins = {}
for path in sys.argv[1:]:
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if line.startswith("-"):
            pins.pop(norm(line[1:]), None)
        elif line:
            pins[norm(line)] = line
print(" ".join(pins.values()))
PYEOF
)

if [ -n "$FROM" ]; then
    echo "install_sglang: installing $FROM/python (editable) and the sglang $WANT CPU import chain for $PY"
    # compat mode: the checkout's python/ goes on sys.path itself (as PYTHONPATH
    # would put it), so it wins over any sglang already in the environment;
    # setuptools' default finder hook is consulted only after site-packages.
    "$PY" -m pip install -q --no-deps --config-settings editable_mode=compat -e "$FROM/python" 2>&1 | grep -v "^WARNING: Location" || true
    SGLANG_PIN=""
else
    echo "install_sglang: installing sglang==$WANT and its CPU import chain for $PY"
    SGLANG_PIN="sglang==$WANT"
fi
# shellcheck disable=SC2086  # the chain is a list of requirements, one word each
"$PY" -m pip install -q --no-deps $SGLANG_PIN $CHAIN 2>&1 | grep -v "^WARNING: Location" || true

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
    echo "install_sglang: SGLang $WANT still does not import: $(echo "$err" | tail -1)" >&2
    exit 1
fi
if [ -n "$FROM" ]; then
    where=$(env -u SGLANG_USE_CPU_ENGINE "$PY" -W ignore -c "import sglang, os; print(os.path.realpath(sglang.__file__))")
    case "$where" in
        "$FROM"/python/sglang/*) ;;
        *) echo "install_sglang: sglang imports from $where, not from $FROM" >&2; exit 1 ;;
    esac
fi
if ! check_driven; then
    echo "install_sglang: sglang $WANT: a module the harness drives does not import (lines above)" >&2
    exit 1
fi
echo "install_sglang: ready (sglang $(installed_version), pins: base.txt + $WANT.txt)"
