"""reader-agreement's judgement of FlashAttention's topk > 1 verify metadata, against the tree's meaning.

FA3 splits a topk > 1 verify in two passes and merges them (``model.fa3_reads``).
What each must hold is worked out here from seq_lens and the oracle's trees
(``oracle.tree_facts``: node x sees itself and its ancestors), never from
FA3's arithmetic:

- prefix pass, row b (request b): its d query rows at ``cu_seqlens_q[b] = b * d``,
  ``cache_seqlens[b] = s_b``, ``cu_seqlens_k`` the running sum of those, and
  the first s_b page-table entries the KV slots of its tokens 0 .. s_b - 1;
- expand pass, row b * d + x (request b's draft node x, the query token at
  that place of the verify input): one query row, ``cache_seqlens`` = the number
  of tree nodes x sees, ``cu_seqlens_k`` the running sum, and the first that many
  page-table entries the KV slots of those nodes (node j is request b's token
  s_b + j). FA3 promises them first in the row, in node order; attention over
  them does not depend on their order, so they are judged as a set (each once).

A cuda-graph replay (bs <= max_bs) must give the same, in the buffers the
captured graph reads: the batch padded up to the graph's bs (``readers.captured_bs``)
by requests at the fill length, whose prefix rows are theirs exactly and whose
expand rows (no tree was drafted for them) may read only their own draft
tokens' slots: padding never reaches another request's KV.

Each is judged at page size 1 and at ``PAGE_SIZE`` tokens a page, over a
server built for it: there the prefix pass's first ceil(s_b / P) page-table
entries must be request b's pages in token order (``fa3_reads.prefix_pages``),
the full ones as a set, but a part-read last page last, since a row's last
entry is the one read only up to ``cache_seqlens``; the counts stay in tokens and
the expand pass is as at page size 1 (it reads the cache a token a page).

Slots come from the stand-in request-to-token table (``fa3_reads.table_slot``),
requests in pool slots ``readers.pool_slots`` (of the padded batch on a replay). Judged only where the step's mask
is the oracle's: a wrong mask is reference-agreement's finding, and FA3 would
rightly read it.
"""

from __future__ import annotations

import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.fa3_reads import Fa3Pass, prefix_pages, swa_slot, table_slot
from vmfuzz.harness.model.oracle import expected, tree_facts
from vmfuzz.harness.model.readers import capture_seq_len, pool_slots
from vmfuzz.harness.model.trees import trees_of
from vmfuzz.harness.model.validate import server_problem
from vmfuzz.harness.properties.kit import Difference, Observation, fail, known_goes_on

#: who extracts the per-node KV from the mask
WRITER = "FlashAttentionBackend.init_forward_metadata"
#: who refills the cuda graph's metadata buffers with it on a replay
REPLAY_WRITER = "FlashAttentionBackend._apply_cuda_graph_metadata"
#: who binds the slices of those buffers the captured graph reads
CAPTURE_WRITER = "FlashAttentionBackend.init_forward_metadata_out_graph"
#: the window, in tokens, of the windowed server judged at pages of one token: the metadata lists every
#: token a row may see and the kernel cuts the window, so any window makes the same metadata
WINDOW = 4
#: the paged server's page size: small, so the strategies' contexts (up to 64) span several pages
#: and a part-read last page is common
PAGE_SIZE = 4


def visible_nodes(config: Config, batch: Batch) -> list[list[list[int]]]:
    """[b][x]: the tree nodes request b's node x may see (itself and its ancestors), in node order."""
    if config.trivial:
        return [[[0]] for _ in range(batch.bs)]
    out = []
    for tree in trees_of(config, batch):
        rows = tree_facts(tree, config.topk, config.d)[0]
        out.append([[j for j, seen in enumerate(row) if seen] for row in rows])
    return out


def _ints(t, n: int | None = None) -> list[int]:
    flat = [] if t is None else [int(v) for v in t.reshape(-1).cpu().tolist()]
    return flat if n is None else flat[:n]


def _running_sum(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def _pages_right(have: list[int], want: list[int], length: int, page_size: int) -> bool:
    """Does a row of ``length`` tokens read its pages ``want`` as ``have`` lists them? Attention over whole
    pages does not depend on their order; a part-read page must stay last, where the length cuts it."""
    if length % page_size:
        return have[-1:] == want[-1:] and sorted(have[:-1]) == sorted(want[:-1])
    return sorted(have) == sorted(want)


def _pass_mismatch(got: Fa3Pass, lengths: list[int | None], slots: list[list[int]], rows_of: list[str],
                   queries: int | list[int], where: str, cells: list[str], page_size: int = 1,
                   ordered: bool = False) -> Difference | None:
    """The first entry of one pass that is not its meaning: row r reads ``queries`` query rows (or
    ``queries[r]``, where each row verifies its own number) and
    ``lengths[r]`` KV tokens, held first in its page table by exactly the pages ``slots[r]`` of
    ``page_size`` tokens (at 1: KV slots), in that order where ``ordered`` (a window counts back from a
    row's end, so there each entry's place is its token's position). A row of length None is a replay's
    padding, whose tree no one drafted: it may read any of its own request's ``slots[r]``, each once,
    but never another request's nor past them."""
    n = len(lengths)
    seqlens = _ints(got.cache_seqlens)
    for r in range(min(n, len(seqlens))):
        if lengths[r] is None and not 0 <= seqlens[r] <= len(slots[r]):
            return Difference(f"{where}: cache_seqlens of {rows_of[r]} is {seqlens[r]}, but its request has only "
                              f"{len(slots[r])} draft tokens", buffer="cache_seqlens", cell=cells[r])
    free = {r for r, want in enumerate(lengths) if want is None}
    # a padding row's count is its own to pick: the running sum must still run over it
    lengths = [seqlens[r] if want is None and r < len(seqlens) else want for r, want in enumerate(lengths)]
    # FA's varlen kernels take the batch from these lengths: an extra entry is a row that reads
    # past the queries, a missing one a row never attended.
    if len(seqlens) != n and seqlens[:n] == lengths:
        return Difference(f"{where}: cache_seqlens has {len(seqlens)} entries for {n} rows",
                          buffer="cache_seqlens", effect="wrong", cell=f"{cells[-1]} count")
    if seqlens[:n] != lengths:
        r = next((i for i in range(n) if i >= len(seqlens) or seqlens[i] != lengths[i]))
        have = seqlens[r] if r < len(seqlens) else "no entry"
        return Difference(f"{where}: cache_seqlens of {rows_of[r]} is {have}, but it sees {lengths[r]} KV tokens",
                          buffer="cache_seqlens", cell=cells[r])
    per_row = queries if isinstance(queries, list) else [queries] * n
    for name, want in (("cu_seqlens_q", _running_sum(per_row)), ("cu_seqlens_k", _running_sum(lengths))):
        have = _ints(getattr(got, name))
        if have[:n + 1] == want and len(have) != n + 1:
            return Difference(f"{where}: {name} has {len(have)} entries for {n} rows ({name} {have})",
                              buffer=name, cell=f"{cells[-1]} count")
        if have != want:
            r = next((i for i in range(n + 1) if i >= len(have) or have[i] != want[i]))
            what = "query rows" if name == "cu_seqlens_q" else "KV tokens"
            return Difference(f"{where}: {name}[{r}] is {have[r] if r < len(have) else 'missing'}, but the rows "
                              f"before {rows_of[r] if r < n else 'the end'} hold {want[r]} {what} "
                              f"({name} {have}, want {want})", buffer=name, cell=cells[min(r, n - 1)])
    if got.max_seq_len_q is None or int(got.max_seq_len_q) < max(per_row, default=0):
        return Difference(f"{where}: max_seq_len_q is {got.max_seq_len_q!r}, below the {max(per_row)} query rows "
                          "each row has", buffer="max_seq_len_q", cell=cells[0])
    table = got.page_table
    if table is None or table.dim() != 2 or table.shape[0] < n:
        return Difference(f"{where}: page_table has shape {None if table is None else tuple(table.shape)}, "
                          f"not a row for each of {n}", buffer="page_table", cell=cells[0])
    for r in range(n):
        entries = -(-lengths[r] // page_size)
        have = _ints(table[r], entries)
        ok = (len(set(have)) == len(have) == lengths[r] and set(have) <= set(slots[r]) if r in free
              else have == slots[r] if ordered
              else len(have) == entries and _pages_right(have, slots[r], lengths[r], page_size))
        if not ok:
            what = (f"KV slots {have}, but it reads {slots[r]} in position order" if ordered and r not in free
                    else f"KV slots {have}, but it reads {sorted(slots[r])}" if page_size == 1 else
                    f"pages {have}, but its {lengths[r]} tokens lie in pages {slots[r]} ({page_size} a page)")
            return Difference(f"{where}: the first {entries} page-table entries of {rows_of[r]} are {what}",
                              buffer="page_table", cell=cells[r])
    return None


def fa3_mismatch(view, config: Config, batch: Batch, page_size: int = 1) -> Difference | None:
    """The first metadata entry of FA3's split verify that is not what ``batch`` must read on a server
    of ``page_size`` tokens a page; on a replay (``view.graph_bs``) the batch is padded up to the graph
    with requests at the fill length."""
    d = config.d
    rows = view.graph_bs or batch.bs
    pad = rows - batch.bs
    seq_lens = list(batch.seq_lens) + [capture_seq_len(config)] * pad
    pools = pool_slots(rows)
    path = f"cuda-graph replay, padded to {rows}" if view.graph_bs else "eager"
    paged = f", page size {page_size}" if page_size > 1 else ""
    where = (f"{label(config)}, {path}{paged} (seq_lens {list(batch.seq_lens)}, d {d}, topk {config.topk}, "
             f"pool slots {pools})")
    requests = [f"request {b}" if b < batch.bs else f"padding request {b}" for b in range(rows)]
    if config.topk <= 1:
        # one causal pass: request b's v_b query rows (d, unless it verifies fewer) over its prefix and
        # its own first v_b draft tokens
        verify = list(view.verify_lens) if view.verify_lens else [d] * rows
        ragged = f", ragged (verify lens {verify})" if view.verify_lens else ""
        # A replay's row whose draft runs past the context (SGLang's request table holds those tokens:
        # it is d wider) has its own cell: its tokens outnumber the graph's page-table columns, sized
        # for the context (the known entry fa3-chain-graph-page-table-past-context).
        past = [bool(view.graph_bs) and s + v > config.max_context_len for s, v in zip(seq_lens, verify)]
        return _pass_mismatch(
            view.prefix, [s + v for s, v in zip(seq_lens, verify)],
            [prefix_pages(pools[b], s + verify[b], config, page_size) for b, s in enumerate(seq_lens)],
            requests, verify if view.verify_lens else d, where + ragged + ", causal pass",
            [("past context" if past[b] else "chain row") if b < batch.bs else "padding row" for b in range(rows)],
            page_size)
    prefix = _pass_mismatch(
        view.prefix, seq_lens, [prefix_pages(pools[b], s, config, page_size) for b, s in enumerate(seq_lens)],
        requests, d, where + ", prefix pass", ["prefix row"] * batch.bs + ["padding row"] * pad, page_size)
    if prefix:
        return prefix
    seen = visible_nodes(config, batch)
    nodes = [(b, x) for b in range(rows) for x in range(d)]
    return _pass_mismatch(
        view.expand, [len(seen[b][x]) if b < batch.bs else None for b, x in nodes],
        [[table_slot(pools[b], seq_lens[b] + j, config, page_size) for j in (seen[b][x] if b < batch.bs else range(d))]
         for b, x in nodes],
        [f"{requests[b]}'s node {x} (expand row {b * d + x}" + (f", sees nodes {seen[b][x]})" if b < batch.bs else ")")
         for b, x in nodes],
        1, where + ", expand pass", ["tree node row" if b < batch.bs else "padding row" for b, _ in nodes])


def window_mismatch(view, config: Config, batch: Batch) -> Difference | None:
    """The first entry of a windowed server's merged pass (``view.window``) that is not its meaning: row
    b * d + x (request b's node x) reads s_b + (nodes x sees) KV tokens, its prefix's in token order and
    then the nodes it sees from the root down, so each entry sits at its token's position (s_b + depth
    for a node), the place a sliding window is cut by; each is the token's slot in the window pool
    (``fa3_reads.swa_slot``), which the windowed layers read. A replay's padding rows may read only their
    own request's prefix and draft tokens, each once."""
    d, rows = config.d, view.graph_bs or batch.bs
    seq_lens = list(batch.seq_lens) + [capture_seq_len(config)] * (rows - batch.bs)
    pools = pool_slots(rows)
    seen, depths = visible_nodes(config, batch), [tree_facts(t, config.topk, d)[1] for t in trees_of(config, batch)]
    path = f"cuda-graph replay, padded to {rows}" if view.graph_bs else "eager"
    where = (f"{label(config)} on a windowed server, {path} (seq_lens {list(batch.seq_lens)}, d {d}, "
             f"topk {config.topk}, pool slots {pools}), merged windowed pass")
    nodes = [(b, x) for b in range(rows) for x in range(d)]
    slots = []
    for b, x in nodes:
        tree = sorted(seen[b][x], key=lambda j: depths[b][j]) if b < batch.bs else range(d)
        tokens = [*range(seq_lens[b]), *(seq_lens[b] + j for j in tree)]
        slots.append([swa_slot(table_slot(pools[b], t, config)) for t in tokens])
    return _pass_mismatch(
        view.window, [seq_lens[b] + len(seen[b][x]) if b < batch.bs else None for b, x in nodes], slots,
        [f"request {b}'s node {x} (windowed row {b * d + x})" if b < batch.bs else f"padding request {b}'s row {x}"
         for b, x in nodes], 1, where, ["tree node row" if b < batch.bs else "padding row" for b, _ in nodes],
        ordered=True)


def captured_span_mismatch(view, config: Config) -> Difference | None:
    """The first buffer the capture bound over the wrong number of rows: the prefix pass a row per
    request of the graph, the expand pass one per (request, draft node), each running sum one entry
    more, a page-table row for each (more rows are never read). The values are the replay's to fill."""
    rows = view.graph_bs
    where = f"{label(config)}, cuda graph captured at bs {rows} (d {config.d}, topk {config.topk})"
    passes = [("prefix pass", view.prefix, rows)] + [(what, got, rows * config.d) for what, got in (
        ("expand pass", view.expand), ("merged windowed pass", view.window)) if got is not None]
    for name, got, n in passes:
        spans = {"cache_seqlens": (n, got.cache_seqlens), "cu_seqlens_q": (n + 1, got.cu_seqlens_q),
                 "cu_seqlens_k": (n + 1, got.cu_seqlens_k)}
        for buffer, (want, t) in spans.items():
            have = None if t is None else t.reshape(-1).numel()
            if have != want:
                return Difference(f"{where}, {name}: the graph reads {buffer} over {have} entries, its {n} rows "
                                  f"need {want}", buffer=buffer, cell="captured span")
        table = got.page_table
        if table is None or table.dim() != 2 or table.shape[0] < n:
            return Difference(f"{where}, {name}: the graph reads a page_table of shape "
                              f"{None if table is None else tuple(table.shape)}, not a row for each of {n}",
                              buffer="page_table", cell="captured span")
    return None


def label(config: Config) -> str:
    """What a finding calls FA3's read of ``config``'s verify."""
    return "FA3 topk > 1 verify" if config.topk > 1 else "FA3 topk 1 verify"


def _class(config: Config) -> str:
    """What an observed class calls it."""
    return "fa3 topk>1 verify" if config.topk > 1 else "fa3 topk 1 verify"


def check_fa3(target, obs: Observation, config: Config, batch: Batch, step, written: torch.Tensor) -> None:
    """Fail reader-agreement unless FA3's verify metadata gives each request its prefix and each draft
    node exactly the tree nodes it may see (at topk 1: its chain, causally). ``written``: the step's
    mask as it wrote it."""
    name = _class(config)
    read = getattr(target, "read_fa3_verify", None)
    why = "not driven by this target" if read is None else getattr(target, "fa3_not_driven", lambda: None)()
    if config.topk <= 1 and not why and server_problem(config):
        # a topk-1 server drafts spec_steps + 1 tokens (SGLang sets it): any other d is no deployment
        why = "not judged, no server runs this config"
    if why:
        obs.classes.add(f"{name}: {why}")
        return
    oracle = expected(config, batch).tree_mask
    n = oracle.numel()
    mine = written.reshape(-1)[:n]
    # a chain's read is causal and takes nothing from the mask: only a tree's is judged on the oracle's mask
    if config.topk > 1 and (mine.numel() < n or not torch.equal(mine.cpu().view(torch.uint8),
                                                                 oracle.view(torch.uint8))):
        obs.classes.add(f"{name}: not judged, the step's mask is not the oracle's")
        return
    for page_size in (1, PAGE_SIZE):
        _judge_at(target, obs, config, batch, step, page_size)


def _window(config: Config, page_size: int) -> int | None:
    """The window of the server judged at ``page_size``: at pages of one token a tree's server is a
    windowed one (it runs every line the unwindowed one does, and the merged windowed pass too; SGLang
    windows a tree's verify only at pages of one token); otherwise none."""
    return WINDOW if config.topk > 1 and page_size == 1 else None


def ragged_verify_lens(config: Config, batch: Batch) -> list[int]:
    """How many of its d draft tokens each request verifies on the ragged chain server (judged at the paged
    page size; a chain's server at pages of one token verifies all d): between 1 (the anchor) and d, varied
    with the request's length and place, so the drawn batches give every mix."""
    return [1 + (s + b) % config.d for b, s in enumerate(batch.seq_lens)]


def _judge_at(target, obs: Observation, config: Config, batch: Batch, step, page_size: int) -> None:
    """Eager, then (up to max_bs) in a cuda-graph replay, on a server of ``page_size`` tokens a page."""
    paged = f", page size {page_size}" if page_size > 1 else ""
    name, window = _class(config), _window(config, page_size)
    verify = ragged_verify_lens(config, batch) if config.topk <= 1 and page_size > 1 else None
    eager = target.read_fa3_verify(config, batch, step, page_size, window=window, verify_lens=verify)
    diff = fa3_mismatch(eager, config, batch, page_size) or (window_mismatch(eager, config, batch) if eager.window else None)
    if diff:
        fail("reader-agreement", diff, writer=WRITER, stage="eager")
    obs.classes.add(name + paged + (", windowed" if eager.window else "") + (", ragged" if eager.verify_lens else ""))
    replay = getattr(target, "read_fa3_replay", None)
    if replay is None or batch.bs > config.max_bs:
        return  # past the captured max_bs the server runs eagerly: no graph to replay
    why = getattr(target, "fa3_replay_not_driven", lambda c: None)(config)
    if why:
        obs.classes.add(f"{name}, cuda-graph replay: {why}")
        return
    # a target that reads no ragged verify is asked as before; the view says whether it was one
    view = replay(config, batch, step, page_size, window=window, **({"verify_lens": verify} if verify else {}))
    if view.raised is not None:
        diff = captured_span_mismatch(view, config)
        if diff:
            fail("reader-agreement", diff, writer=CAPTURE_WRITER, stage="capture")
        raise view.raised  # the capture bound every span right: the replay's raise is the finding
    diff = fa3_mismatch(view, config, batch, page_size) or (window_mismatch(view, config, batch) if view.window else None)
    if diff:
        # a known defect of one page size's replay ends only that replay: the other page size is still judged
        with known_goes_on(target, obs, f"{name}, cuda-graph replay{paged}"):
            fail("reader-agreement", diff, writer=REPLAY_WRITER, stage="replay")
        return
    obs.classes.add(f"{name}, cuda-graph replay"
                    + (" padded to a captured bs" if (view.graph_bs or 0) > batch.bs else "") + paged
                    + (", windowed" if view.window else "") + (", ragged" if view.verify_lens else ""))
