"""Every small shape through two of cache_locs.py's extend-slot kernels; their outputs printed as JSON.

Run in a subprocess whose ``sglang`` may be an altered copy (``tests/sglang_copies.py``), under the
Triton interpreter. ``assign_extend_cache_locs``: every batch of 1 to 3 requests whose (start, end)
offsets are drawn from ``OFFSETS`` (empty, within one 32-token block, across blocks), each request's
slots read from its own pool row. ``assign_extend_cache_locs_uniform_func`` on the launch a GPU takes
(``_is_cuda`` set, the interpreter standing in), with and without translation tables, positions and
anchors, for 1 to 3 requests of 1 to 5 draft tokens. One JSON line per shape: ``{"shape": ..., "out": ...}``.
"""

from __future__ import annotations

import itertools
import json
import sys

OFFSETS = ((0, 0), (0, 1), (3, 9), (0, 32), (5, 40), (31, 33), (30, 70), (64, 64))
POOL_LEN = 80


def _pool(rows: int):
    import torch
    return (torch.arange(rows * POOL_LEN, dtype=torch.int64).reshape(rows, POOL_LEN) * 3 + 7).to(torch.int32)


def variable_lengths(m) -> None:
    import torch

    import triton
    for bs in (1, 2, 3):
        for spans in itertools.product(OFFSETS, repeat=bs):
            start = torch.tensor([s for s, _ in spans], dtype=torch.int64)
            end = torch.tensor([e for _, e in spans], dtype=torch.int64)
            total = int((end - start).sum())
            out = torch.full((total + 64,), -5, dtype=torch.int64)  # the tail shows a write past the total
            rows = torch.tensor(list(range(bs, 0, -1)), dtype=torch.int64)
            m.assign_extend_cache_locs[(bs,)](rows, _pool(bs + 1), start, end, out, POOL_LEN,
                                              triton.next_power_of_2(bs))
            print(json.dumps({"shape": ["variable", [list(s) for s in spans]], "out": out.tolist()}), flush=True)


def uniform(m) -> None:
    import torch
    m._is_cuda = True  # the GPU launch; the interpreter runs it on the CPU
    for bs, d, page, translated, extras in itertools.product((1, 2, 3), (1, 2, 5), (1, 4), (False, True),
                                                             (False, True)):
        start = torch.tensor([2 + 7 * b for b in range(bs)], dtype=torch.int64)
        rows = torch.tensor(list(range(bs, 0, -1)), dtype=torch.int64)
        kw = {"page_size": page}
        if translated:
            kw.update(full_v2p=torch.arange(200, dtype=torch.int64).flip(0).contiguous(),
                      swa_v2p=(torch.arange(200, dtype=torch.int64) % 50).contiguous(),
                      full_out=torch.full((bs * d,), -5, dtype=torch.int64),
                      swa_out=torch.full((bs * d,), -5, dtype=torch.int64))
        if extras:
            kw.update(positions_out=torch.full((bs, d), -5, dtype=torch.int64),
                      anchor_src=torch.arange(bs, dtype=torch.int64) + 90,
                      anchor_out=torch.full((bs, 2), -5, dtype=torch.int64))
        out = m.assign_extend_cache_locs_uniform_func(rows, _pool(bs + 1), start, bs, d, "cpu", **kw)
        shown = {"out": out.tolist(), **{k: v.tolist() for k, v in kw.items() if k.endswith("_out")}}
        print(json.dumps({"shape": ["uniform", bs, d, page, translated, extras], "out": shown}), flush=True)


def main() -> int:
    # as a run loads the target: the interpreter's repair of a one-element loop bound (range(tl.cdiv(...)))
    from vmfuzz.harness.targets.sglang import interpreter_speed
    interpreter_speed.install()
    from sglang.kernels.ops.speculative import cache_locs
    variable_lengths(cache_locs)
    uniform(cache_locs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
