"""The KV allocation one decode step reserves per request, as the installed SGLang sizes it.

``allocation`` gives the reserve (``get_alloc_reserve_per_decode``), each request's allocation end
and the ``req_to_token`` row headroom for a ``KvCase``'s server, each setting answered under the name
this release's sizing reads it by. Where the release has no ``page_aligned_decode_alloc_lens`` (0.5.17,
0.5.18) the ends are computed inside ``eagle_prepare_for_decode``: that is run up to the allocation
call it hands them to (``decode_alloc_lens``).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import torch

from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.model.kv_locations import KvCase
from vmfuzz.harness.targets.sglang.binding import bound


def spec_context(case: KvCase):
    """(the speculative settings, the schedule, the parallel sizes) of the case's server."""
    spec = SimpleNamespace(speculative_algorithm="EAGLE", speculative_num_steps=case.spec_steps,
                           speculative_eagle_topk=case.topk, speculative_num_draft_tokens=case.d,
                           speculative_use_rejection_sampling=False)
    return spec, SimpleNamespace(page_size=case.page_size), SimpleNamespace(attn_dcp_size=1)


def allocation(sg, case: KvCase) -> tuple[int, list[int], int, tuple[list[int], int] | None]:
    """(reserve, nxt per request, row headroom, (cur per request, the token count it asks the allocator
    for) or None where the release sizes inside the decode preparation) as SGLang sizes them for this case's server. Each setting is answered under the name this release's
    sizing reads it by (0.5.17 off ``get_server_args()``, later ones off the runtime context); a lookup
    its module does not hold is one its code cannot make."""
    sizing = sg.sizing
    spec, schedule, parallel = spec_context(case)
    args = SimpleNamespace(speculative_algorithm=spec.speculative_algorithm,
                           speculative_num_steps=case.spec_steps, speculative_eagle_topk=case.topk,
                           max_speculative_num_draft_tokens=case.d, page_size=case.page_size)
    answers = {"get_spec": lambda: spec, "get_schedule": lambda: schedule, "get_parallel": lambda: parallel,
               "get_server_args": lambda: args, "max_speculative_num_draft_tokens": lambda: case.d}
    with bound(*[(sizing, name, answer) for name, answer in answers.items() if hasattr(sizing, name)]):
        reserve = sizing.get_alloc_reserve_per_decode()
        if hasattr(sizing, "page_aligned_decode_alloc_lens"):
            reqs = [SimpleNamespace(kv=SimpleNamespace(kv_allocated_len=s, kv_committed_len=s))
                    for s in case.seq_lens]
            cur, nxt, needed = sizing.page_aligned_decode_alloc_lens(reqs, reserve=reserve,
                                                                     page_size=case.page_size)
            asked = ([int(v) for v in cur], int(needed))
        extra = _call_with_args(sizing.get_req_to_token_extra_context_len, args)
        if not hasattr(sizing, "page_aligned_decode_alloc_lens"):
            nxt = decode_alloc_lens(sg, case, spec, int(reserve), case.context_len + int(extra))
            asked = None
    return int(reserve), [int(v) for v in nxt], int(extra), asked


def _call_with_args(fn, args):
    """``fn()``, handed the server args where this release's signature asks for them (0.5.17)."""
    if "server_args" in inspect.signature(fn).parameters:
        return fn(server_args=args)
    return fn()


class _Allocated(Exception):
    """Raised by the stand-in allocation call to end the decode preparation once its sizes are known."""

    def __init__(self, nxt):
        super().__init__("allocated")
        self.nxt = nxt


def decode_alloc_lens(sg, case: KvCase, spec, reserve: int, row_width: int) -> list[int]:
    """Each request's allocation end as a release without ``page_aligned_decode_alloc_lens`` computes it
    (0.5.17, 0.5.18): inside ``eagle_utils.eagle_prepare_for_decode``, run up to the allocation call it
    hands the sizes to (``alloc_for_spec_decode``, stood in to take them and stop there)."""
    eu = sg.eagle_utils
    if not hasattr(eu, "eagle_prepare_for_decode") or not hasattr(eu, "alloc_for_spec_decode"):
        raise OutOfStep("page_aligned_decode_alloc_lens", "srt/mem_cache/allocation_sizing.py",
                        "neither it nor eagle_utils.eagle_prepare_for_decode's allocation call is in this SGLang")

    def alloc_for_spec_decode(*_, nxt_kv_lens_cpu=None, **__):
        raise _Allocated(nxt_kv_lens_cpu)
    bs = case.bs
    reqs = [SimpleNamespace(kv=SimpleNamespace(kv_allocated_len=s, kv_committed_len=s), kv_committed_len=s,
                            decode_batch_idx=0) for s in case.seq_lens]
    batch = SimpleNamespace(
        reqs=reqs, batch_size=lambda: bs, maybe_evict_swa=lambda: None, device="cpu",
        sampling_info=SimpleNamespace(penalizer_orchestrator=SimpleNamespace(is_required=False)),
        token_to_kv_pool_allocator=SimpleNamespace(page_size=case.page_size),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros((bs + 1, row_width), dtype=torch.int32)),
        tree_cache=None, req_pool_indices=torch.arange(bs, 0, -1))
    patches = [(eu, "alloc_for_spec_decode", alloc_for_spec_decode)]
    patches += [(eu, "get_spec", lambda: spec)] if hasattr(eu, "get_spec") else []
    try:
        with bound(*patches):
            eu.eagle_prepare_for_decode(batch)
    except _Allocated as done:
        if done.nxt is None:
            raise OutOfStep("eagle_prepare_for_decode", "srt/speculative/eagle_utils.py",
                            "its allocation call names no nxt_kv_lens_cpu") from None
        return [int(v) for v in done.nxt.reshape(-1)]
    raise OutOfStep("eagle_prepare_for_decode", "srt/speculative/eagle_utils.py",
                    "it returned without the allocation call vmfuzz stops it at")
