"""``routing`` at cuda-graph replay: TBO's split of a TARGET_VERIFY batch across its overlap children.

On replay, ``TboAttnBackend`` hands each overlap child a view of the padded
batch to set its attention metadata up from. Each child must get exactly its
share, in the batch's order: requests ``[0, s)`` to the first and ``[s, bs)``
to the second, with ``s`` from ``vmfuzz.harness.model.routing.tbo_verify_split``,
and for each request its pool row, its length, its tokens' ids and cache slots,
its draft tokens and its block of the (FULL_MASK) custom mask. Together the two
views are the batch, each request once. A child with no share must not be set
up. A request handed to the wrong child (or to none, or twice) has attention
planned over another request's KV and mask.
"""

from __future__ import annotations

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode, request_extents
from vmfuzz.harness.model.routing import ROUTERS, ReplayView, tbo_verify_split
from vmfuzz.harness.properties.kit import Observation, fail

NAME = "routing"

#: judged in this order, so a misplaced request is named by its pool row first
FIELDS = ("req_pool_indices", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "batch_size", "input_ids",
          "out_cache_loc", "draft_token", "custom_mask")


def check_tbo_replay(target, obs: Observation, config: Config, batch: Batch) -> None:
    """Each overlap child's view of one TARGET_VERIFY replay is its share of the parent's."""
    replay = getattr(target, "tbo_replay", None)
    if not callable(replay):
        return
    parent, children = replay(config, batch)
    bs, d = batch.bs, config.d
    split = tbo_verify_split(bs)
    blocks = request_extents(TreeMaskMode.FULL_MASK, batch.seq_lens, d)
    where = f"TBO's cuda-graph replay at TARGET_VERIFY (bs {bs}, {d} draft tokens a request)"
    for i, (lo, hi) in enumerate(((0, split), (split, bs))):
        role = ROUTERS["tbo"][1 + i]
        got = children[i]
        origin = dict(effect="wrong", writer="router", cell="replay split", stage="replay", router="tbo",
                      role=role)
        if got is None:
            if hi > lo:
                fail(NAME, f"{where}: the {role} child is not set up, but requests {lo}..{hi - 1} are its share: "
                           "they run with no attention metadata of theirs", buffer="batch split", **origin)
            continue
        want = _share(parent, lo, hi, d, blocks)
        for field in FIELDS:
            if getattr(got, field) != getattr(want, field):
                fail(NAME, f"{where}: the {role} child is handed {field} {getattr(got, field)}, but its share "
                           f"is requests {lo}..{hi - 1} of the batch, whose {field} is {getattr(want, field)}: "
                           "together the children must hold the batch exactly once, in order",
                     buffer=field, **origin)
    obs.classes.add(f"tbo: replay split {split}+{bs - split}")


def _share(parent: ReplayView, lo: int, hi: int, d: int, blocks) -> ReplayView:
    """Requests ``[lo, hi)`` of ``parent``: what the child taking them must be handed."""
    cells = parent.custom_mask[blocks[lo].start:blocks[hi - 1].stop] if hi > lo else []
    return ReplayView(hi - lo, parent.req_pool_indices[lo:hi], parent.seq_lens[lo:hi], parent.seq_lens_cpu[lo:hi],
                      sum(parent.seq_lens_cpu[lo:hi]), parent.input_ids[lo * d:hi * d],
                      parent.out_cache_loc[lo * d:hi * d], parent.draft_token[lo * d:hi * d], cells)
