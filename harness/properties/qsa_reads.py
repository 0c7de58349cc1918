"""reader-agreement's judgement of Qwen's sparse-attention (QSA) verify read, against the chain's meaning.

QSA reads no mask (``model.qsa_reads``): verify row b * d + x attends causally
over its request's first ``sequence_lengths`` tokens. What it must read is
worked out here from seq_lens, d and the oracle's trees (node x sees itself
and its ancestors): ``sequence_lengths`` = s_b + the nodes x sees, its pool slot
request b's (``readers.pool_slots``), and its first that many token slots
exactly request b's prefix and the draft tokens of the nodes it sees (node j is
token s_b + j). Judged only where the step's positions are the oracle's: QSA
takes its lengths from them, and a wrong position is reference-agreement's
finding.

A cuda-graph replay (bs <= max_bs) must give the real rows the same, in the
buffers the captured graph reads, requests in pool slots ``readers.pool_slots``
of the batch padded up to the graph's bs. A padding row's read is discarded,
so it is held only to this: it reads through a pool slot of the padded batch
and no further than the tokens that slot's request holds (its prefix and d
draft tokens; a padding request's prefix is the fill length), in order from
its first. SGLang's host replay points every padding row at the first request's
slot, one token long: inside that request, so it holds.
"""

from __future__ import annotations

import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.fa3_reads import table_slot
from vmfuzz.harness.model.oracle import expected
from vmfuzz.harness.model.readers import capture_seq_len, pool_slots
from vmfuzz.harness.model.validate import server_problem
from vmfuzz.harness.properties.fa3_reads import visible_nodes
from vmfuzz.harness.properties.kit import Difference, Observation, fail

#: who turns the verify batch into per-row reads
WRITER = "QwenSparseAttnBackend.init_forward_metadata"
#: who refills the cuda graph's per-row buffers on a replay
REPLAY_WRITER = "QwenSparseAttnBackend._replay_cuda_graph_metadata"


def _padding_read(r: int, length: int, owner: int, have: list[int], config: Config, holds: dict,
                  where: str) -> Difference | None:
    """Padding row ``r``'s read: through a pool slot of the padded batch, within what its request holds."""
    row = f"padding row {r}"
    if owner not in holds:
        return Difference(f"{where}: {row} reads through pool slot {owner}, which no request of the padded "
                          f"batch holds", buffer="row_req_pool_indices", cell="padding row")
    if not 0 <= length <= holds[owner]:
        return Difference(f"{where}: {row} reads {length} tokens of the request in pool slot {owner}, which "
                          f"holds {holds[owner]}", buffer="sequence_lengths", cell="padding row")
    want = [table_slot(owner, t, config) for t in range(length)]
    if have != want:
        return Difference(f"{where}: the first {length} token slots of {row} are {have}, but pool slot "
                          f"{owner}'s first tokens are {want}", buffer="token_slot_table", cell="padding row")
    return None


def qsa_mismatch(view, config: Config, batch: Batch) -> Difference | None:
    """The first verify row whose QSA read is not what ``batch`` must read (on a replay, padded up to
    ``view.graph_bs`` requests at the fill length)."""
    d, graph = config.d, view.graph_bs or batch.bs
    pools = pool_slots(graph)
    path = f"cuda-graph replay, padded to {graph}" if view.graph_bs else "eager"
    where = f"QSA verify, {path} (seq_lens {list(batch.seq_lens)}, d {d}, pool slots {pools})"
    seen = visible_nodes(config, batch)
    per = d if not config.trivial else 1
    rows = [(b, x) for b in range(graph) for x in range(per)]
    lengths = [int(v) for v in view.sequence_lengths.reshape(-1).tolist()]
    owners = [int(v) for v in view.row_req_pool_indices.reshape(-1).tolist()]
    for name, have in (("sequence_lengths", lengths), ("row_req_pool_indices", owners)):
        if len(have) != len(rows):
            return Difference(f"{where}: {name} has {len(have)} entries for {len(rows)} verify rows",
                              buffer=name, cell="chain node row count")
    table = view.token_slot_table
    fill = capture_seq_len(config)
    holds = {p: (batch.seq_lens[b] if b < batch.bs else fill) + per for b, p in enumerate(pools)}
    for r, (b, x) in enumerate(rows):
        have = [int(v) for v in table[r, :max(lengths[r], 0)].tolist()] if r < table.shape[0] else []
        if b >= batch.bs:
            diff = _padding_read(r, lengths[r], owners[r], have, config, holds, where)
            if diff:
                return diff
            continue
        s = batch.seq_lens[b]
        row = f"request {b}'s node {x} (verify row {r}, sees nodes {seen[b][x]})"
        want = [table_slot(pools[b], t, config) for t in range(s)] + [table_slot(pools[b], s + j, config)
                                                                       for j in seen[b][x]]
        if lengths[r] != len(want):
            return Difference(f"{where}: sequence_lengths of {row} is {lengths[r]}, but it sees {len(want)} tokens",
                              buffer="sequence_lengths", cell="chain node row")
        if owners[r] != pools[b]:
            return Difference(f"{where}: {row} reads through pool slot {owners[r]}, request {b}'s is {pools[b]}",
                              buffer="row_req_pool_indices", cell="chain node row")
        if sorted(have) != sorted(want):
            return Difference(f"{where}: the first {len(want)} token slots of {row} are {have}, but it reads "
                              f"{sorted(want)}", buffer="token_slot_table", cell="chain node row")
    return None


def check_qsa(target, obs: Observation, config: Config, batch: Batch, step) -> None:
    """Fail reader-agreement unless QSA's verify read gives each chain node exactly its request's prefix
    and the nodes it may see."""
    if config.topk != 1:
        return
    unserved = server_problem(config)
    if unserved:
        # QSA reads a topk-1 draft as a chain because SGLang makes it one (num_draft_tokens = spec_steps + 1);
        # a tree with skipped steps is a kernel case, never a QSA deployment
        obs.classes.add("qsa verify: not judged, no server runs this config")
        return
    read = getattr(target, "read_qsa_verify", None)
    why = "not driven by this target" if read is None else getattr(target, "qsa_not_driven", lambda c: None)(config)
    if why:
        obs.classes.add(f"qsa verify: {why}")
        return
    oracle = expected(config, batch).positions
    if not torch.equal(step.positions.reshape(-1).cpu(), oracle):
        obs.classes.add("qsa verify: not judged, the step's positions are not the oracle's")
        return
    diff = qsa_mismatch(read(config, batch, step), config, batch)
    if diff:
        fail("reader-agreement", diff, writer=WRITER, stage="eager")
    obs.classes.add("qsa verify")
    replay = getattr(target, "read_qsa_replay", None)
    if replay is None or batch.bs > config.max_bs:
        return  # past the captured max_bs the server runs eagerly: no graph to replay
    view = replay(config, batch, step)
    diff = qsa_mismatch(view, config, batch)
    if diff:
        fail("reader-agreement", diff, writer=REPLAY_WRITER, stage="replay")
    obs.classes.add("qsa verify, cuda-graph replay" + (" padded to a captured bs" if view.graph_bs > batch.bs else ""))
