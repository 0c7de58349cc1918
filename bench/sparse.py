"""A sparse catalogue for the benchmark: bugs a uniform draw almost never reaches.

The selftest catalogue (``harness/targets/variants.py``) is dense: a uniform
draw over the production range hits most of it within a handful of cases, so
no search can show a large advantage over it. Each variant here is modelled on
a real bug class, but fires only on a conjunction of edge conditions (the top
of a range, a power-of-two boundary, a full batch, the context limit, a
capacity transition), the way such bugs hide in practice. Each is layered over
a target as the selftest variants are: one seam replaced by a wrapper.

Every variant carries ``fires(case)``: whether the case reaches the variant's
condition at all. Off it the variant *is* the pristine target (its wrapper
returns the original's answer unchanged; ``tests/test_sparse.py`` checks it
on drawn cases), so ``fires`` measures the uniform hit rate (``hit_rates``)
and lets the naive search skip the checks of cases that cannot fail -- its
example counts are exactly what running every check would give, at a
fraction of the time. Cases that fire are always checked for real: a firing
case that the properties miss does not count as a detection.

    PYTHONPATH=. python bench/bench.py --catalogue sparse     # the benchmark (see PERFORMANCE.md)
    PYTHONPATH=. python bench/sparse.py --cases 200000        # uniform hit rates alone
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from typing import Callable

import torch

from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.config import Batch, Config, num_candidates
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.targets.variants import Variant
from vmfuzz.harness.model.trees import draft, parents, simplest

#: The production range of the sparse benchmark: captured sizes up to 256,
#: eager batches up to 2 * max_bs + 8, EAGLE's draft shapes up to d 16, topk 8,
#: spec_steps 6. Context stays at 64 so a case costs milliseconds, not seconds.
SPARSE_BOUNDS = Bounds(max_bs=256, max_context_len=64, num_draft_tokens=16, topk=8, spec_steps=6, overshoot=8)
TRIVIAL_SHARE = 8  # as bench.py: one naive case in eight takes the d = 1 path


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _poke(heap, tensor: torch.Tensor, cells: list[int], value: bool) -> None:
    """A kernel's stray write of ``value`` at ``cells``, through the guard like every write."""
    idx = torch.tensor(cells, dtype=torch.long, device=tensor.device)
    heap.store(tensor, idx, torch.full((len(cells),), value, dtype=torch.bool, device=tensor.device))


def _full_block_start(seq_lens, d: int, b: int) -> int:
    return d * sum(seq_lens[:b]) + d * d * b


# -- 1. capacity wrong only at bs = max_bs + 1 with max_bs a multiple of 64 ------------

def _bucket_edge(fits):
    # Capture sizes are padded to buckets; a check written against the padded
    # bucket admits one request more when max_bs sits exactly on a bucket edge.
    def fits_padded(mask, bs):
        if mask.max_bs >= 64 and mask.max_bs % 64 == 0 and bs == mask.max_bs + 1:
            return True
        return fits(mask, bs)
    return fits_padded


def _bucket_edge_fires(config: Config, steps) -> bool:
    m = config.max_bs
    return m >= 64 and m % 64 == 0 and any(len(s) == m + 1 for s, _ in steps)


# -- 2. kernel error only at depth = spec_steps with wide trees -----------------------

DEEP_STEPS, WIDE_TOPK = 6, 4


def _depths(call) -> torch.Tensor:
    bs = call.seq_lens.numel()
    return call.positions.view(bs, call.d) - call.seq_lens.view(bs, 1)


def _deep_walk(kernel):
    # An unrolled ancestor walk for wide, deep trees (topk >= 4, spec_steps >= 6)
    # taken when every request's tree runs to the last level: its final hop
    # drops the root link, so the deepest nodes lose column 0.
    def kernel_unrolled(call):
        kernel(call)
        if call.topk < WIDE_TOPK or call.spec_steps < DEEP_STEPS:
            return
        depth = _depths(call)
        if not bool((depth.amax(dim=1) == call.spec_steps).all()):
            return
        seq, d = call.seq_lens.tolist(), call.d
        cells = []
        for b, x in torch.nonzero(depth == call.spec_steps).tolist():
            if call.mode == TreeMaskMode.FULL_MASK:
                cells.append(_full_block_start(seq, d, b) + x * (seq[b] + d) + seq[b])
            else:
                cells.append(d * d * b + x * d)
        _poke(call.heap, call.tree_mask, cells, False)
    return kernel_unrolled


def _max_depth(tree, topk: int) -> int:
    par = parents(tree, topk)
    best = 0
    for x in range(1, len(par)):
        n, y = 0, x
        while y > 0:
            y, n = par[y], n + 1
        best = max(best, n)
    return best


def _deep_walk_fires(config: Config, steps) -> bool:
    if config.trivial or config.topk < WIDE_TOPK or config.spec_steps < DEEP_STEPS:
        return False
    for seq_lens, trees in steps:
        tree_list = trees() if callable(trees) else trees
        if tree_list is None:
            tree_list = (simplest(config.topk, config.spec_steps, config.d),)
        if all(_max_depth(t, config.topk) == config.spec_steps for t in _lazy(tree_list)):
            return True
    return False


def _lazy(trees):
    yield from trees


# -- 3. a request exactly at max_context_len while bs = max_bs ------------------------

def _context_edge(verify):
    # A full captured batch whose last request sits at the context limit: the
    # last block then ends where a padded (max_context_len-strided) layout's
    # would, and the writer takes the padded stride for its last row, leaving
    # the request's own diagonal cell unset.
    def verify_edge(mask, config, batch, heap):
        out = verify(mask, config, batch, heap)
        if (out.reused and not config.trivial and config.mode == TreeMaskMode.FULL_MASK
                and batch.bs == config.max_bs and batch.seq_lens[-1] == config.max_context_len):
            d, seq, b = config.d, batch.seq_lens, batch.bs - 1
            cell = _full_block_start(seq, d, b) + (d - 1) * (seq[b] + d) + seq[b] + d - 1
            _poke(heap, out.tree_mask, [cell], False)
        return out
    return verify_edge


def _context_edge_fires(config: Config, steps) -> bool:
    return (not config.trivial and config.mode == TreeMaskMode.FULL_MASK
            and any(len(s) == config.max_bs and s[-1] == config.max_context_len for s, _ in steps))


# -- 4. stale state: a full batch followed by a single request ------------------------

def _stale_after_full(verify):
    # The call site caches per-buffer metadata between steps; after a full
    # captured batch a single request is built from the cached first request's
    # seq_len instead of its own (stale state), so its rows land at the old
    # stride and its positions are off.
    history: list[list] = []  # [mask, last batch], most recent first, a few masks deep

    def verify_remembering(mask, config, batch, heap):
        entry = next((e for e in history if e[0] is mask), None)
        call_batch = batch
        if (entry is not None and mask is not None and not config.trivial
                and config.mode == TreeMaskMode.FULL_MASK and config.max_bs >= 2
                and entry[1].bs == config.max_bs and batch.bs == 1):
            call_batch = Batch(entry[1].seq_lens[:1], batch.trees)
        out = verify(mask, config, call_batch, heap)
        if mask is not None:
            if entry is None:
                entry = [mask, batch]
                history.insert(0, entry)
                del history[8:]
            entry[1] = batch
        return out
    return verify_remembering


def _stale_after_full_fires(config: Config, steps) -> bool:
    if config.trivial or config.mode != TreeMaskMode.FULL_MASK or config.max_bs < 2:
        return False
    sizes = [len(s) for s, _ in steps]
    return any(a == config.max_bs and b == 1 for a, b in zip(sizes, sizes[1:]))


# -- 5. d one past a power-of-two tile ------------------------------------------------

def _pow2_tail(kernel):
    # A fast path for uniform rows (every request the same length) tiles each
    # FULL_MASK row in 2^k-column tiles; with d = 2^k + 1 the one-column tail
    # tile is skipped, so node d-1's column keeps the fill (True) in row 0.
    def kernel_tiled(call):
        kernel(call)
        d = call.d
        if call.mode != TreeMaskMode.FULL_MASK or d < 9 or not _is_pow2(d - 1):
            return
        seq = call.seq_lens.tolist()
        if len(set(seq)) != 1:
            return
        _poke(call.heap, call.tree_mask,
              [_full_block_start(seq, d, b) + seq[b] + d - 1 for b in range(len(seq))], True)
    return kernel_tiled


def _pow2_tail_fires(config: Config, steps) -> bool:
    d = config.d
    return (not config.trivial and config.mode == TreeMaskMode.FULL_MASK and d >= 9 and _is_pow2(d - 1)
            and any(len(set(s)) == 1 for s, _ in steps))


@dataclass(frozen=True)
class SparseVariant:
    variant: Variant
    #: fires(config, [(seq_lens, trees or a thunk or None), ...]) -> the case reaches the condition
    fires: Callable
    bug_class: str

    @property
    def name(self) -> str:
        return self.variant.name

    def layer(self, target):
        return self.variant.layer(target)


SPARSE: dict[str, SparseVariant] = {v.name: v for v in (
    SparseVariant(Variant("bucket-edge", "fits admits bs = max_bs + 1 when max_bs is a multiple of 64 (>= 64)",
                          "fits", _bucket_edge), _bucket_edge_fires,
                  "capacity wrong only at bs = max_bs + 1 with max_bs >= 64"),
    SparseVariant(Variant("deep-walk", "kernel drops the root column of nodes at depth = spec_steps (>= 6) "
                          "with topk >= 4 when every request's tree reaches that depth",
                          "kernel", _deep_walk), _deep_walk_fires,
                  "kernel error only at depth = spec_steps with wide trees"),
    SparseVariant(Variant("context-edge", "FULL_MASK, bs = max_bs, last request at max_context_len: "
                          "its last diagonal cell is left unset on the reused buffer",
                          "verify", _context_edge), _context_edge_fires,
                  "error only when a request sits at max_context_len while bs = max_bs"),
    SparseVariant(Variant("stale-after-full", "FULL_MASK: a single request right after a full batch on the "
                          "same buffer is built from the previous batch's first seq_len", "verify", _stale_after_full),
                  _stale_after_full_fires, "stale state: a batch at max_bs, then a smaller one"),
    SparseVariant(Variant("pow2-tail", "FULL_MASK, d = 2^k + 1 (>= 9), every request the same length: "
                          "the one-column tail tile is not written", "kernel", _pow2_tail),
                  _pow2_tail_fires, "error only when d exceeds a power-of-two block"),
)}


# -- the uniform draw -----------------------------------------------------------------

def naive_case(rng: random.Random, b: Bounds = SPARSE_BOUNDS):
    """One uniform case, lazily: ``(config, [(seq_lens, trees)])`` with ``trees`` None or a thunk.

    Every number is uniform over ``b`` as in ``bench.naive_case``; each drawn
    tree gets its own seed and is drafted only when asked for (a topk 8,
    spec_steps 6 tree has 328 candidates: drafting every request of a
    500-request batch would cost more than checking it).
    """
    mode = rng.choice((TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY))
    is_read = True if mode == TreeMaskMode.FULL_MASK else rng.random() < 0.5
    max_bs, ctx = rng.randint(1, b.max_bs), rng.randint(1, b.max_context_len)
    if rng.randrange(TRIVIAL_SHARE) == 0:
        config = Config(mode, max_bs, ctx, 1, 1, 0, is_read)
        bs = rng.randint(1, 2 * max_bs + b.overshoot)
        return config, [(tuple(rng.randint(0, ctx) for _ in range(bs)), None)]
    topk, steps = rng.randint(1, b.topk), rng.randint(1, b.spec_steps)
    d = rng.randint(2, min(b.num_draft_tokens, 1 + num_candidates(topk, steps)))
    config = Config(mode, max_bs, ctx, d, topk, steps, is_read)
    out = []
    for _ in range(rng.randint(2, 5)):
        bs = rng.randint(1, 2 * max_bs + b.overshoot)
        trees = None
        if rng.random() < 0.5:
            trees = _tree_thunk(config, [rng.getrandbits(64) for _ in range(bs)])
        out.append((tuple(rng.randint(0, ctx) for _ in range(bs)), trees))
    return config, out


def _tree_thunk(config: Config, seeds: list[int]):
    def trees():
        return (_draft_one(config, s) for s in seeds)
    trees.materialize = lambda: tuple(_draft_one(config, s) for s in seeds)
    return trees


def _draft_one(config: Config, seed: int):
    r = random.Random(seed)
    n = num_candidates(config.topk, config.spec_steps)
    return draft(config.topk, config.spec_steps, config.d, [r.randint(0, 3) for _ in range(n)],
                 [r.randint(0, 3) for _ in range(n)])


def materialize(case) -> tuple[Config, list[Batch]]:
    config, steps = case
    return config, [Batch(s, None if t is None else t.materialize()) for s, t in steps]


def hit_rates(n: int, seed: int = 0, bounds: Bounds = SPARSE_BOUNDS) -> dict[str, dict]:
    """Monte Carlo over the uniform draw: the share of cases on which each variant fires."""
    rng = random.Random(seed)
    hits = dict.fromkeys(SPARSE, 0)
    for _ in range(n):
        case = naive_case(rng, bounds)
        for name, v in SPARSE.items():
            hits[name] += bool(v.fires(*case))
    out = {}
    for name, k in hits.items():
        p = k / n
        # A rule-of-three upper bound when nothing fired; else a normal 95 % interval.
        hi = 3 / n if k == 0 else p + 1.96 * (p * (1 - p) / n) ** 0.5
        out[name] = {"cases": n, "fired": k, "rate": p, "rate_95_upper": hi}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="uniform hit rate of each sparse variant")
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for name, r in hit_rates(args.cases, args.seed).items():
        print(f"{name:<18} fired on {r['fired']:>6} of {r['cases']} uniform cases: "
              f"{r['rate']:.2e} per case (95 % upper {r['rate_95_upper']:.2e})")


if __name__ == "__main__":
    main()
