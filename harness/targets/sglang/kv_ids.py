"""The KV-index translator's gather, standing in for the Triton backend's readers.

SGLang's target-verify metadata asks its KV-index translator to gather each
request's KV slots into ``kv_indices``; the real translator reads the request-
to-token pool, which vmfuzz does not build. The stand-in's table hands out a
distinct slot per (pool slot, token) (``vmfuzz.harness.model.readers.kv_slot``), so a
gather of the wrong request's slots, the wrong tokens, too few or too many
shows in what the reader reads or in the buffer's redzone.
"""

from __future__ import annotations


import torch

from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.model.readers import kv_slot_stride, stale_kv_indices
from vmfuzz.harness.targets.sglang.seams import TranslatesNothing, bind

TRANSLATOR = "srt/mem_cache/kv_index_translator.py"


class GathersKvSlots(TranslatesNothing):
    """The KV-index translator, standing in: its gather writes real, distinct KV slots.

    ``pack_read_stream`` fills request b's CSR row of ``out`` -- ``seq_lens[b]``
    ids from ``indptr[b]`` on, as SGLang's gather does -- with the slots the
    stand-in request-to-token table holds for the request in pool slot
    ``req_pool_indices[b]`` (``readers.kv_slot``), through the shadow heap: a row
    written past ``out`` lands in its redzone. Everything else does as
    ``TranslatesNothing`` does.
    """

    def __init__(self, heap: ShadowHeap, max_context_len: int):
        super().__init__()
        self.heap, self.max_context_len = heap, max_context_len
        #: where this gather wrote (``out``'s data pointers): a buffer it never wrote is not judged for ids
        self.gathered_into: set[int] = set()

    def pack_read_stream(self, *args, **kwargs):
        self.calls.append("pack_read_stream")
        from vmfuzz.harness.targets.sglang.imports import sglang_module
        try:
            # a translator module that raises on import is decided there (a finding, or out of step)
            real = sglang_module("sglang." + TRANSLATOR.removesuffix(".py").replace("/", "."))
            fn = real.KVIndexTranslator.pack_read_stream
        except (ImportError, AttributeError) as exc:
            raise OutOfStep("KVIndexTranslator.pack_read_stream", TRANSLATOR, f"not found ({exc})") from None
        got = bind(fn, "KVIndexTranslator.pack_read_stream", TRANSLATOR, self, *args, **kwargs).arguments
        missing = [n for n in ("req_pool_indices", "seq_lens", "indptr", "out") if n not in got]
        if missing or got.get("token_mapping") is not None:
            raise OutOfStep("KVIndexTranslator.pack_read_stream", TRANSLATOR,
                            f"the call names no {', '.join(missing)}" if missing else
                            "the call remaps ids (token_mapping), which the stand-in gather does not")
        self.gathered_into.add(got["out"].data_ptr())
        _gather(self.heap, got["out"], got["req_pool_indices"], got["seq_lens"], got["indptr"],
                got.get("kv_start_idx"), self.max_context_len)
        return True  # the stand-in's slots are final ids


def _gather(heap: ShadowHeap, out: torch.Tensor, pool: torch.Tensor, seq_lens: torch.Tensor,
            indptr: torch.Tensor, start: torch.Tensor | None, max_context_len: int) -> None:
    lanes = int(seq_lens.numel())
    assert pool.numel() >= lanes, f"pack_read_stream: {lanes} stream lanes, {pool.numel()} request rows"
    slots, lens, rows = pool.reshape(-1).tolist(), seq_lens.reshape(-1).tolist(), indptr.reshape(-1).tolist()
    first = [0] * lanes if start is None else start.reshape(-1).tolist()
    stride = kv_slot_stride(max_context_len)
    if heap.backing_of(out) is None:
        out.copy_(stale_kv_indices(out.numel(), out.device))  # what torch.empty left: no slot id

    def gather(t):
        buf = t["kv_indices"]
        # A launch's programs run in no set order; last first, so a row written
        # into the next one's cells is not hidden by that row's own writes.
        for b in reversed(range(lanes)):
            tokens = torch.arange(int(first[b]), int(first[b]) + max(int(lens[b]), 0), device=buf.device)
            ids = (int(slots[b]) + 1) * stride + tokens
            heap.store(buf, int(rows[b]) + tokens - int(first[b]), ids.to(buf.dtype))

    # a gather from a start token is a sliding window's: a stray write names that buffer
    name = "kv_indices" if start is None else "window_kv_indices"
    heap.run_kernel(lambda t: gather({"kv_indices": t[name]}), {name: out}, {name: max(64, int(seq_lens.sum()))})
