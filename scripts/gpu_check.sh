#!/usr/bin/env bash
# The CUDA branches of the verify-mask path, which a CPU host cannot take.
#
# Run on a machine with one CUDA GPU and SGLang installed (with its CUDA kernels):
#     bash scripts/gpu_check.sh
# It runs, against the installed SGLang, in under 10 minutes:
#   1. the chain writer through the call site as a server takes it: seq_lens on
#      CUDA, so build_eagle_verify_input picks build_chain_tree by itself (the
#      default "eagle" call site; a spy asserts the branch was really taken);
#   2. the properties on native Triton kernels (tree kernel and chain writer),
#      every call site, the new variants caught;
#   3. the JIT CUDA tree kernel (VMFUZZ_SGLANG_KERNEL=jit).
# Exits non-zero on any failure or finding. Never run here (no GPU is lent to
# this project); see README, "The three call sites and the chain writer".
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${VMFUZZ_PY:-.venv/bin/python}
export PYTHONPATH=$PWD
unset TRITON_INTERPRET SGLANG_USE_CPU_ENGINE
OUT=${VMFUZZ_GPU_REPORT:-reports/gpu-check}
mkdir -p "$OUT"

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch; nothing here can run" >&2
    exit 2
fi

failed=()
step() {  # step NAME SECONDS CMD...
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    local t0=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    echo "   rc $rc, $((SECONDS - t0))s"
    [ "$rc" -eq 0 ] || failed+=("$name (rc $rc)")
}

step "chain branch taken on its own with seq_lens on CUDA" 100 "$PY" -W ignore - <<'PY'
import msgspec
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.targets import resolve

target = resolve("sglang")
chain_calls, tree_calls = [], []
chain_kernel, kernel = target.chain_kernel, target.kernel
target.chain_kernel = lambda call: (chain_calls.append(call), chain_kernel(call))
target.kernel = lambda call: (tree_calls.append(call), kernel(call))
config = Config(TreeMaskMode.QLEN_ONLY, 4, 64, 4, 1, 3, True, "eagle")  # topk-1 chain, default call site
for seq_lens in ((5,), (64, 0, 17, 3), (1, 2, 3, 4, 5, 6)):  # captured, at max_bs, eager past it
    heap = ShadowHeap("cuda")
    mask = target.allocate(config, heap)
    out = target.verify(mask, config, Batch(seq_lens), heap)
    assert out.tree_mask.is_cuda
    assert not heap.check(), heap.check()
assert len(chain_calls) == 3 and not tree_calls, (len(chain_calls), len(tree_calls))
for name in ("no-oob-write", "fallback-equivalence", "reference-agreement", "multi-step-reuse", "chain-writer"):
    PROPERTIES[name].check(target, config, [Batch((64, 0, 17, 3)), Batch((1, 2, 3, 4, 5, 6)), Batch((64,))], "cuda")
print("chain branch: taken", len(chain_calls), "times by build_eagle_verify_input on CUDA; properties held")
PY

step "native Triton: every property, every call site" 220 \
    "$PY" -W ignore -m vmfuzz.harness.cli run --target sglang --device cuda --seed 1 --max-examples 60 \
    --time-budget 170 --report-dir "$OUT/triton"

step "native Triton: the call-site and chain-writer variants are caught" 100 \
    "$PY" -W ignore -m vmfuzz.harness.cli selftest --target sglang --device cuda --max-examples 20 \
    --variant pp-reuse-unchecked --variant chain-row-offset --variant row-offset

step "JIT CUDA tree kernel: every property, every call site" 160 \
    env VMFUZZ_SGLANG_KERNEL=jit "$PY" -W ignore -m vmfuzz.harness.cli run --target sglang --device cuda --seed 1 \
    --max-examples 40 --time-budget 120 --report-dir "$OUT/jit"

if [ "${#failed[@]}" -ne 0 ]; then
    printf 'gpu_check: FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "gpu_check: all CUDA checks passed"
