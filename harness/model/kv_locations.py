"""Where the draft and accept steps of one EAGLE iteration write KV, from the meaning alone.

One iteration per request b (sequence length ``s`` before the draft, ``P`` the
page size, ``k`` topk, ``n`` spec_steps, ``d`` num_draft_tokens):

* the **allocation** gives row b of ``req_to_token`` the columns ``[0, nxt)``:
  the committed length plus a reserve of two decode footprints, rounded up to a
  whole page (``nxt`` is at least what was allocated before). The footprint ``L``
  is ``max(n·k, d)``, or for a paged tree (P > 1, k > 1) ``max(pages·P·k, d)``
  with ``pages`` the most pages one branch's ``n`` slots can straddle,
  ``ceil((P - 1 + n) / P)``. The row holds ``R`` columns: the context length
  plus the row's headroom.
* the **draft** writes each branch t's step i at one column of row b. Unpaged
  (P = 1) or a chain (k = 1), the branches lie one after another from ``s``:
  column ``s + t·n + i``. A paged tree gives each branch whole pages of its own,
  starting at the prefix's last page ``base = s - lp`` (``lp = s mod P``):
  branch t's pages start at ``base + t·pages_b·P`` (``pages_b = ceil((lp + n)/P)``),
  its first ``lp`` columns hold a copy of the prefix's tail (branch 0's are the
  tail itself), and step i is at column ``base + t·pages_b·P + lp + i``.
* the **verify** window is request b's ``d`` columns from ``s``, one per tree node.
* **accept**: the accepted path (node 0, then each accepted child) is moved to
  the front of the verify window: its j-th node's KV goes from the window's
  column of that node to the window's column j. The moves come in one list of
  ``bs·(n + 1)`` pairs (the accept index's size), real pairs first, packed in
  request order, the rest (0, 0).

Nothing here reads SGLang: these are the facts a property judges SGLang's index
arithmetic against.
"""

from __future__ import annotations

import msgspec

from vmfuzz.harness.model.config import ConfigError

#: page sizes a case of the kv-location property is run at when its config does not say (the engine's
#: configs carry none): unpaged, and a page wider than one step's writes so branches straddle pages
PAGE_SIZES = (1, 4)


class KvCase(msgspec.Struct, frozen=True):
    """One draft-verify-accept iteration: the server's draft shape and page size, the batch, and
    each request's accepted path (node ids from the root, a path down its draft tree)."""

    topk: int
    spec_steps: int
    num_draft_tokens: int
    page_size: int
    context_len: int
    seq_lens: tuple[int, ...]
    #: parent node of each node per request (node 0, the root, has -1)
    parents: tuple[tuple[int, ...], ...]
    #: accepted node ids per request, starting at the root (length = accept length, 1 ... n + 1)
    paths: tuple[tuple[int, ...], ...]

    @property
    def bs(self) -> int:
        return len(self.seq_lens)

    @property
    def d(self) -> int:
        return self.num_draft_tokens

    @property
    def paged_tree(self) -> bool:
        return self.page_size > 1 and self.topk > 1

    def validate(self) -> "KvCase":
        n, k, d = self.spec_steps, self.topk, self.d
        if min(n, k, self.page_size) < 1 or d < 2:
            raise ConfigError(f"a drafting case needs spec_steps, topk, page_size >= 1 and d >= 2 (got {self})")
        if not (len(self.parents) == len(self.paths) == self.bs >= 1):
            raise ConfigError("one tree and one accepted path per request")
        for b, (par, path) in enumerate(zip(self.parents, self.paths)):
            if len(par) != d or par[0] != -1:
                raise ConfigError(f"request {b}: a tree of {d} nodes rooted at node 0")
            if not 1 <= len(path) <= n + 1 or path[0] != 0:
                raise ConfigError(f"request {b}: an accepted path starts at the root, 1 ... {n + 1} nodes")
            if any(par[c] != p for p, c in zip(path, path[1:])):
                raise ConfigError(f"request {b}: accepted path {path} is not a path down the tree")
        if any(not 0 <= s <= self.context_len for s in self.seq_lens):
            raise ConfigError(f"seq_lens {self.seq_lens} outside [0, {self.context_len}]")
        return self


def ceil_to(x: int, p: int) -> int:
    return -(-x // p) * p


def branch_pages(page_size: int, steps: int, tail: int) -> int:
    """Pages one branch's ``steps`` slots straddle after a prefix tail of ``tail`` columns."""
    return -(-(tail + steps) // page_size)


def decode_footprint(case: KvCase) -> int:
    """L: KV columns one request may take in one decode step."""
    n, k, p = case.spec_steps, case.topk, case.page_size
    if not case.paged_tree:
        return max(n * k, case.d)
    return max(branch_pages(p, n, p - 1) * p * k, case.d)


def allocated_columns(case: KvCase, s: int, allocated_before: int | None = None) -> int:
    """nxt: the columns of a request's row allocated after this step's decode allocation."""
    need = ceil_to(s + 2 * decode_footprint(case), case.page_size)
    return max(need, s if allocated_before is None else allocated_before)


def row_width(case: KvCase) -> int:
    """R: columns a row must hold so that a request at the context length allocates inside it."""
    return allocated_columns(case, case.context_len)


def draft_column(case: KvCase, s: int, t: int, i: int) -> int:
    """The row column branch t's step i writes, for a request of length ``s``."""
    n, p = case.spec_steps, case.page_size
    if not case.paged_tree:
        return s + t * n + i
    tail = s % p
    return (s - tail) + t * branch_pages(p, n, tail) * p + tail + i


def draft_columns(case: KvCase, s: int) -> list[int]:
    """Every column the draft writes, in the order SGLang lays its draft slots out (b, t, i)."""
    return [draft_column(case, s, t, i) for t in range(case.topk) for i in range(case.spec_steps)]


def tail_copies(case: KvCase, s: int) -> list[tuple[int, int]]:
    """(target column, source column) of the prefix tail copied into each later branch's first page."""
    if not case.paged_tree:
        return []
    p, tail = case.page_size, s % case.page_size
    base, pages = s - tail, branch_pages(p, case.spec_steps, tail)
    return [(base + t * pages * p + c, base + c) for t in range(1, case.topk) for c in range(tail)]


def verify_columns(case: KvCase, s: int) -> list[int]:
    return list(range(s, s + case.d))


def accept_moves(case: KvCase, window: list[list[int]]) -> list[tuple[int, int]]:
    """The (target slot, source slot) pairs of the accept step, given each request's verify window
    (the slots its d nodes were written at): real pairs packed in request order, then (0, 0)."""
    real = [(window[b][j], window[b][x]) for b, path in enumerate(case.paths) for j, x in enumerate(path)]
    return real + [(0, 0)] * (case.bs * (case.spec_steps + 1) - len(real))


def bonus_nodes(case: KvCase) -> list[int]:
    """The node whose target prediction is each request's bonus token: its last accepted node."""
    return [path[-1] for path in case.paths]


def physical_slot(virtual: int, page_map: list[int], page_size: int) -> int:
    """A virtual slot's slot in a sub-pool whose page table is ``page_map`` (virtual page -> physical page,
    -1 for a page the sub-pool does not hold): the same offset inside the mapped page. A page the table does
    not hold (past its end, or -1) and a negative id have no slot of their own: they name the pool's
    padding slot 0, whose writes nothing reads."""
    page = virtual // page_size if virtual >= 0 else -1
    if not 0 <= page < len(page_map) or page_map[page] < 0:
        return 0
    return page_map[page] * page_size + virtual % page_size
