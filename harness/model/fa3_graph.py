"""What FlashAttention's cuda-graph set-up must preallocate for a server's numbers.

``FlashAttentionBackend.init_cuda_graph_state(max_bs, ...)`` sizes, once, the
metadata buffers every captured graph binds slices of: for a batch of ``bs <=
max_bs`` a replay binds rows ``[:bs]`` (``[:bs + 1]`` of a running sum) and the
page-table columns its requests' pages fill. A buffer sized for fewer is a
replay that binds a short slice (the graph then reads and writes past what the
metadata says) or a capture that raises. So each must have at least the shape
the captured max batch needs, worked out here from the server's numbers alone
(max_bs B, the draft width d, topk k, the context length C, KV pages of P
tokens, so a request's context spans ceil(C / P) pages):

- ``target_verify_metadata`` (a chain's verify, topk 1): a row per request, a
  running sum over B + 1, ceil(C / P) pages a row. Judged at every topk: the set-up
  allocates it for every drafting server, its size does not depend on topk, so
  one too small is wrong for the chain server of the same numbers.
- ``target_verify_metadata_topk_normal`` (a tree's prefix pass, topk > 1): the same.
- ``target_verify_metadata_topk_expand`` (a tree's expand pass): a row per
  (request, draft node), B * d of them, each over at most the d draft nodes
  (it reads the cache a token a page, whatever P).
- ``draft_decode_metadata_topk_normal`` / ``_topk_expand`` (topk > 1): the
  draft runner's decode graphs of the same captured max batch, preallocated by
  the same set-up for the same B: a row per request, and a row per (request,
  branch), B * k, each over at least the one token a branch drafts per step
  (its width grows with the draft step, which is the draft runner's, not the
  server's). Judged because the verify replay's buffers are only half of what
  this one preallocation sizes for B: a too-small draft buffer is the same bug.

Larger than needed is never a finding: over-allocation costs memory, not soundness.
"""

from __future__ import annotations

from vmfuzz.harness.model.allocation import ServerNumbers

#: the backend's set-up that sizes these buffers
WRITER = "FlashAttentionBackend.init_cuda_graph_state"

#: a buffer's key in its dict -> which dimension means what, for the finding's words
DIMENSIONS = {"cache_seqlens": ("rows",), "cu_seqlens_q": ("entries",), "cu_seqlens_k": ("entries",),
              "page_table": ("rows", "columns")}


def _metadata(rows: int, columns: int) -> dict[str, tuple[int, ...]]:
    """A pass of ``rows`` attention rows, each over at most ``columns`` pages: its lengths, the two
    running sums (one entry more than rows) and its page table."""
    return {"cache_seqlens": (rows,), "cu_seqlens_q": (rows + 1,), "cu_seqlens_k": (rows + 1,),
            "page_table": (rows, columns)}


#: the page sizes every case's footprint is judged at: a token a page, and the paged reads' size
FIXED_PAGE_SIZES = (1, 4)
#: one more per case, drawn by the case's numbers, so page arithmetic is judged where P divides
#: nothing, divides C, and exceeds C
CASE_PAGE_SIZES = (2, 8, 16, 64)


def page_sizes(n: ServerNumbers) -> tuple[int, ...]:
    """The page sizes the footprint of a server started with ``n`` is judged at."""
    return FIXED_PAGE_SIZES + (CASE_PAGE_SIZES[(n.max_bs + n.context_len + n.num_draft_tokens) % 4],)


def graph_needs(n: ServerNumbers, page_size: int = 1) -> dict[str, tuple[int, ...]]:
    """"dict.key" -> the least shape each buffer needs for a graph of ``n.max_bs`` requests, KV pages
    of ``page_size`` tokens."""
    b, d, k, pages = n.max_bs, n.num_draft_tokens, n.topk, -(-n.context_len // page_size)
    dicts = {"target_verify_metadata": _metadata(b, pages)}
    if k > 1:
        dicts["target_verify_metadata_topk_normal"] = _metadata(b, pages)
        dicts["target_verify_metadata_topk_expand"] = _metadata(b * d, d)
        dicts["draft_decode_metadata_topk_normal"] = _metadata(b, pages)
        dicts["draft_decode_metadata_topk_expand"] = _metadata(b * k, 1)
    return {f"{name}.{key}": shape for name, buffers in dicts.items() for key, shape in buffers.items()}


def constant_sums(n: ServerNumbers) -> dict[str, int]:
    """"dict.key" -> the step of a running sum of query rows the set-up fills once (an ``arange`` from 0)
    and every replay then binds as it is: the query tokens each row of its pass holds (a chain's or a
    tree prefix pass's request: its d draft tokens; a draft decode request: its k branches; an expand
    pass's row: one token). A wrong start or step is every captured batch's query ranges wrong, at
    capture and at each replay alike, so no capture-against-replay comparison would see it."""
    d, k = n.num_draft_tokens, n.topk
    sums = {"target_verify_metadata.cu_seqlens_q": d}
    if k > 1:
        sums |= {"target_verify_metadata_topk_normal.cu_seqlens_q": d,
                 "target_verify_metadata_topk_expand.cu_seqlens_q": 1,
                 "draft_decode_metadata_topk_normal.cu_seqlens_q": k,
                 "draft_decode_metadata_topk_expand.cu_seqlens_q": 1}
    return sums


def length_sums(n: ServerNumbers) -> dict[str, str]:
    """A running sum of key lengths filled once -> the constant lengths it sums (a draft branch's expand pass
    reads the same number of its own chain tokens every row: the sum steps by that number); topk > 1 only."""
    if n.topk < 2:
        return {}
    return {"draft_decode_metadata_topk_expand.cu_seqlens_k": "draft_decode_metadata_topk_expand.cache_seqlens"}


def short_dimension(got: tuple[int, ...], need: tuple[int, ...]) -> int | None:
    """The first dimension of ``got`` smaller than ``need``'s (a missing one counts as 0); None: it holds."""
    for i, want in enumerate(need):
        if (got[i] if i < len(got) else 0) < want:
            return i
    return None
