"""Every small shape through the multi-layer draft-extend prepare kernel; its buffers printed as JSON.

Run in a subprocess whose ``sglang`` may be an altered copy (``tests/sglang_copies.py``), under the
Triton interpreter: for every captured size ``max_bs`` up to ``MAX_BS``, graph bs ``bs <= max_bs``,
raw bs ``raw_bs <= bs`` and window ``w`` in ``WIDTHS``, the static buffers start stale (values no
prepare writes, different per row) and the sources hold ``raw_bs`` rows followed by poison, as a
server's batch tensors are followed by whatever memory lies past them. One JSON line per shape:
``{"shape": [max_bs, bs, raw_bs, w], "buffers": {name: values}}``.
"""

from __future__ import annotations

import json
import sys

MAX_BS = 6
WIDTHS = (2, 3)
#: the length a padded row takes (SGLang's fill value on a Triton server)
FILL = 1
#: what a read past a source's raw rows meets
POISON = 77


def _source(values, extra: int, dtype):
    import torch
    whole = torch.full((len(values) + extra,), POISON, dtype=dtype)
    whole[:len(values)] = torch.tensor(values, dtype=dtype)
    return whole[:len(values)]


def run_shape(fill, max_bs: int, bs: int, raw: int, w: int) -> dict:
    import torch
    n, stale = max_bs * w, torch.arange(max_bs) + 40
    bufs = dict(input_ids=torch.arange(n) + 500, positions=torch.arange(n) + 600, out_cache_loc=torch.arange(n) + 700,
                seq_lens=(stale + 100).to(torch.int32), req_pool_indices=stale + 200,
                num_correct_drafts=(stale % w).to(torch.int32), num_accept_tokens=(stale + 300).to(torch.int32),
                select_index=stale + 400, temperatures=(stale.float() + 0.5).reshape(max_bs, 1))
    src = dict(src_input_ids=_source(list(range(1, raw * w + 1)), n, torch.long),
               src_positions=_source(list(range(10, 10 + raw * w)), n, torch.long),
               src_out_cache_loc=_source(list(range(1000, 1000 + raw * w)), n, torch.long),
               src_seq_lens=_source([5 + b for b in range(raw)], n, torch.int32),
               src_req_pool_indices=_source(list(range(raw, 0, -1)), n, torch.long),
               src_num_correct_drafts=_source([b % w for b in range(raw)], n, torch.int32),
               src_num_accept_tokens=_source([b % w + 1 for b in range(raw)], n, torch.int32),
               src_temperatures=_source([0.25] * raw, n, torch.float).reshape(raw, 1))
    fill(**bufs, **src, hidden_states=None, src_hidden_states=None, global_num_tokens=None,
         global_num_tokens_for_logprob=None, raw_bs=raw, bs=bs, num_tokens_per_bs=w, num_front_tokens=0,
         seq_len_fill_value=FILL)
    return {name: t.reshape(-1).tolist() for name, t in bufs.items()}


def main() -> int:
    from sglang.kernels.ops.speculative.multi_layer_eagle import fill_draft_extend_prepare_buffers_triton as fill
    for max_bs in range(1, MAX_BS + 1):
        for bs in range(1, max_bs + 1):
            for raw in range(1, bs + 1):
                for w in WIDTHS:
                    print(json.dumps({"shape": [max_bs, bs, raw, w],
                                      "buffers": run_shape(fill, max_bs, bs, raw, w)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
