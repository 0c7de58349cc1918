"""The inputs of one verify step: an allocation config and the batches run against it.

A ``Config`` is what a server fixes at start-up (captured max_bs, context limit,
draft shape, the mask's layout); a ``Batch`` is what one scheduler step brings.
Both are frozen so a finding's inputs cannot drift after they were recorded.
"""

from __future__ import annotations

import msgspec

from vmfuzz.harness.model.layouts import PREALLOCATED_LAYOUTS, TreeMaskMode


class ConfigError(ValueError):
    """An inconsistent config or batch: the user's input, not a finding."""


def num_candidates(topk: int, spec_steps: int) -> int:
    """Draft candidates the EAGLE draft stage scores: topk at step 0, topk^2 per later step."""
    if spec_steps <= 0:
        return 0
    return topk + (spec_steps - 1) * topk * topk


#: Where a verify step decides reuse or fallback (docs/sglang-target.md, call sites):
#: "eagle" -- ``build_eagle_verify_input`` when drafting, ``EAGLEWorkerV2._build_trivial_verify_input``
#: when d = 1; "chain" -- ``build_eagle_verify_input`` on its ``build_chain_tree`` branch (what a
#: CUDA host takes for topk-1 chains in QLEN_ONLY; presented as such on CPU); "pp" --
#: ``Scheduler._pp_spec_rebuild_verify_input``, the pipeline-parallel rebuild. The first is the
#: default, so a repro written before the others existed still names its call site.
#: "frozen_kv_mtp" -- ``FrozenKVMTPDraftWorker.draft``, which calls the wrapper with no
#: buffer and its default layout: it always takes the per-batch FULL_MASK fallback.
CALL_SITES = ("eagle", "chain", "pp", "frozen_kv_mtp")


def site_takes(site: str, config: "Config") -> bool:
    """Can call site ``site`` run ``config``? The chain branch takes only chains; the
    frozen-KV MTP worker only drafts (d > 1) and only ever builds a FULL_MASK."""
    if site == "chain":
        return config.chain
    if site == "frozen_kv_mtp":
        return config.mode == TreeMaskMode.FULL_MASK and not config.trivial
    return True


def is_chain_shape(mode, topk: int, spec_steps: int, num_draft_tokens: int) -> bool:
    """The shape SGLang hands to ``build_chain_tree``: topk 1, every step kept, QLEN_ONLY."""
    return (mode == TreeMaskMode.QLEN_ONLY and topk == 1 and spec_steps >= 1
            and num_draft_tokens == spec_steps + 1)


def parent_list_width(topk: int, spec_steps: int) -> int:
    """Columns of ``parent_list``: the root marker, then the kept nodes of each step but the last."""
    if spec_steps <= 1:
        return 0
    return (topk + 1) + (spec_steps - 2) * topk


class Config(msgspec.Struct, frozen=True):
    mode: TreeMaskMode
    max_bs: int
    max_context_len: int
    num_draft_tokens: int
    topk: int
    spec_steps: int
    is_read: bool = True
    call_site: str = "eagle"

    @property
    def d(self) -> int:
        return self.num_draft_tokens

    @property
    def trivial(self) -> bool:
        """d = 1: no drafting, the verify input is the bonus token alone."""
        return self.num_draft_tokens == 1

    @property
    def chain(self) -> bool:
        """A topk-1 chain in QLEN_ONLY: the chain writer's shape."""
        return is_chain_shape(self.mode, self.topk, self.spec_steps, self.num_draft_tokens)

    def validate(self) -> "Config":
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(msg)

        need(self.mode in PREALLOCATED_LAYOUTS,
             f"layout {self.mode.name} is never preallocated (use FULL_MASK or QLEN_ONLY)")
        need(self.max_bs >= 1, f"max_bs must be >= 1, got {self.max_bs}")
        need(self.max_context_len >= 0, f"max_context_len must be >= 0, got {self.max_context_len}")
        need(self.num_draft_tokens >= 1, f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        need(self.topk >= 1, f"topk must be >= 1, got {self.topk}")
        need(self.spec_steps >= 0, f"spec_steps must be >= 0, got {self.spec_steps}")
        need(self.is_read or self.mode == TreeMaskMode.QLEN_ONLY,
             "an unread mask is always QLEN_ONLY (SGLang allocates unread masks in that layout)")
        need(self.call_site in CALL_SITES,
             f"call_site {self.call_site!r} is not one of {', '.join(CALL_SITES)}")
        need(self.call_site != "chain" or self.chain,
             "call_site 'chain' is the build_chain_tree branch: it needs QLEN_ONLY, topk 1 and "
             f"num_draft_tokens = spec_steps + 1 (got {self.mode.name}, topk {self.topk}, "
             f"spec_steps {self.spec_steps}, num_draft_tokens {self.num_draft_tokens})")
        need(self.call_site != "frozen_kv_mtp" or (self.mode == TreeMaskMode.FULL_MASK and not self.trivial),
             "call_site 'frozen_kv_mtp' drafts and builds its mask in the wrapper's default layout: it "
             f"needs FULL_MASK and num_draft_tokens >= 2 (got {self.mode.name}, num_draft_tokens {self.d})")
        if self.trivial:
            need(self.spec_steps == 0, f"num_draft_tokens 1 is the no-draft path: spec_steps must be 0, got {self.spec_steps}")
        else:
            need(self.spec_steps >= 1, f"num_draft_tokens {self.d} needs spec_steps >= 1")
            have = num_candidates(self.topk, self.spec_steps)
            need(self.d - 1 <= have,
                 f"num_draft_tokens {self.d} needs {self.d - 1} candidates, but topk {self.topk} x "
                 f"spec_steps {self.spec_steps} drafts only {have}")
        return self


class DraftTree(msgspec.Struct, frozen=True):
    """The draft stage's output for one request, in the kernel's own encoding.

    ``top_scores_index`` holds the d-1 selected candidate ids, ascending;
    ``parent_list[id // topk]`` is the candidate id of that candidate's parent.
    """

    top_scores_index: tuple[int, ...]
    parent_list: tuple[int, ...]


class Batch(msgspec.Struct, frozen=True):
    seq_lens: tuple[int, ...]
    trees: tuple[DraftTree, ...] | None = None  # None: the simplest valid tree per request

    @property
    def bs(self) -> int:
        return len(self.seq_lens)

    def validate(self, config: Config) -> "Batch":
        if not self.seq_lens:
            raise ConfigError("a batch needs at least one request (seq_lens is empty)")
        for b, s in enumerate(self.seq_lens):
            if not 0 <= s <= config.max_context_len:
                raise ConfigError(f"seq_lens[{b}] = {s} is outside [0, max_context_len={config.max_context_len}]")
        if self.trees is not None:
            if len(self.trees) != self.bs:
                raise ConfigError(f"{len(self.trees)} draft trees for {self.bs} requests")
            for b, tree in enumerate(self.trees):
                validate_tree(config, tree, b)
        return self


def validate_tree(config: Config, tree: DraftTree, b: int) -> None:
    d, topk, steps = config.d, config.topk, config.spec_steps
    sel, parents = tree.top_scores_index, tree.parent_list
    where = f"request {b}"
    if len(sel) != d - 1:
        raise ConfigError(f"{where}: top_scores_index has {len(sel)} ids, num_draft_tokens {d} needs {d - 1}")
    if list(sel) != sorted(set(sel)):
        raise ConfigError(f"{where}: top_scores_index must be strictly ascending, got {list(sel)}")
    ncand = num_candidates(topk, steps)
    if sel and not (0 <= sel[0] and sel[-1] < ncand):
        raise ConfigError(f"{where}: candidate ids must lie in [0, {ncand}), got {list(sel)}")
    width = parent_list_width(topk, steps)
    if len(parents) != width:
        raise ConfigError(f"{where}: parent_list has {len(parents)} entries, topk {topk} spec_steps {steps} needs {width}")
    for i, p in enumerate(parents):
        if not -1 <= p < ncand:
            raise ConfigError(f"{where}: parent_list[{i}] = {p} is not -1 or a candidate id below {ncand}")
        # EAGLE's invariant: the kept nodes listed at slot i >= 1 were drafted at
        # step (i-1)//topk, so a parent always comes from an earlier step than
        # its child and no candidate can be its own ancestor.
        if i >= 1 and p != -1 and candidate_step(p, topk) != (i - 1) // topk:
            raise ConfigError(f"{where}: parent_list[{i}] = {p} is a candidate of step {candidate_step(p, topk)}, "
                              f"but slot {i} holds nodes kept at step {(i - 1) // topk} (a parent must come "
                              "from the step before its child's: this tree would have a cycle or skip a level)")
    if config.call_site == "chain" and tuple(parents) != tuple(range(-1, width - 1)):
        # The chain branch never reads parent_list: it assumes the draft stage
        # made a chain, which topk 1 with every step kept always does.
        raise ConfigError(f"{where}: call_site 'chain' needs the chain topology parent_list "
                          f"{list(range(-1, width - 1))}, got {list(parents)}")


def candidate_step(cid: int, topk: int) -> int:
    """The draft step that scored candidate ``cid``: topk ids at step 0, topk^2 at each later one."""
    return 0 if cid < topk else 1 + (cid - topk) // (topk * topk)
