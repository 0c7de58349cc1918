"""The second writer: ``build_chain_tree``, reached directly (not through a call site).

Through a call site the chain writer already answers to the core properties
(``call_site`` "chain"); here it is called as a writer, with the preallocated
buffer and with its own allocation, and checked three ways:

- no write leaves any buffer it writes (mask, positions, retrieve arrays,
  tokens, KV-cache slots, M-RoPE positions);
- its verify input equals the oracle's (ancestor sets and depths: a chain node
  sees the root and every node before it), and its other outputs equal what
  they mean: the bonus token then the drafts, request b's page-table entry at
  position s_b + x, three copies of the positions;
- it equals the tree kernel's verify input on the same chain (the pp rebuild,
  which never takes the chain branch, on the fallback path).
"""

from __future__ import annotations

import msgspec
import torch

from vmfuzz.harness.guard.chain_write import chain_inputs
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.oracle import expected
from vmfuzz.harness.properties.kit import (Difference, Observation, capacity_of, fail, fail_overrun, first_difference,
                                    guarded_step, locator, reused_mask)
from vmfuzz.harness.guard.shadow import describe_all

CHAIN_WRITER = "chain writer"


def _own_outputs(out, inputs, width: int) -> Difference | None:
    """The outputs the oracle does not cover, against what they mean."""
    bs = inputs.seq_lens.numel()
    x = torch.arange(width).view(1, width)
    pos = (inputs.seq_lens.cpu().view(bs, 1) + x)
    want_tokens = torch.cat([inputs.bonus_tokens.cpu().view(bs, 1), inputs.draft_tokens.cpu()], 1)
    checks = [("tokens", out.tokens, want_tokens)]
    if out.out_cache_loc is not None:
        table = inputs.req_to_token.cpu().long()
        checks.append(("out_cache_loc", out.out_cache_loc, table[inputs.req_pool_indices.cpu().view(bs, 1), pos]))
    if out.mrope is not None:
        checks.append(("mrope", out.mrope, pos.reshape(1, -1).expand(3, -1)))
    for name, got, want in checks:
        got, want = got.reshape(-1).long(), want.reshape(-1).long()
        if got.shape != want.shape or not torch.equal(got, want):
            idx = int(torch.nonzero(got != want).flatten()[0]) if got.shape == want.shape else -1
            return Difference(f"{name} differs from its meaning" + (
                f" at {idx}: {int(got[idx])} vs {int(want[idx])}" if idx >= 0 else f" in shape {tuple(got.shape)}"),
                buffer=name, cell="value" if idx >= 0 else "length")
    return None


def chain_writer(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    if not config.chain:
        # SGLang hands the chain writer nothing else; a config of another
        # shape (a deployment-scoped search, a repro) has nothing to check here.
        obs.classes.add("not a chain shape")
        return obs
    tree_site = msgspec.structs.replace(config, call_site="pp")  # the pp rebuild never takes the chain branch
    w = config.d
    for batch in batches:
        want = expected(config, batch)
        inputs = chain_inputs(batch.seq_lens, w, config.max_context_len, device)
        heap, mask = reused_mask(target, config, device, "chain-writer")
        buffers = [("its own allocation", None)]
        if batch.bs * w * w <= mask.buffer.numel():
            buffers.insert(0, ("the preallocated buffer", mask.buffer))
        outs = []
        for label, buf in buffers:
            out = target.chain_write(inputs, buf, heap)
            violations = heap.check(locator(config, batch))
            if violations:
                fail_overrun("chain-writer", f"out-of-bounds write by the chain writer into {label} "
                                             f"(bs {batch.bs}, w {w}): " + describe_all(violations), violations,
                             writer=CHAIN_WRITER, capacity_bs=config.max_bs if buf is not None else batch.bs)
            if buf is None and out.tree_mask.numel() > batch.bs * w * w:
                # Its own allocation, seen as returned. One too small never returns:
                # build_chain_tree's own assert on the size raises first.
                fail("chain-writer", f"the chain writer's own allocation holds {out.tree_mask.numel()} cells, "
                                     f"bs {batch.bs} chains of width {w} need {batch.bs * w * w}",
                     effect="wrong", writer=CHAIN_WRITER, buffer="tree_mask", cell="footprint over the layout's")
            if buf is not None and not out.reused:
                fail("chain-writer", "the chain writer was given the preallocated buffer and returned another",
                     effect="unsound", writer=CHAIN_WRITER, buffer="tree_mask", cell="reuse")
            obs.add_step(config, batch, out, capacity_of(mask))
            for diff in (first_difference(f"chain writer on {label} vs oracle", out, want, config, batch, want.compared),
                         _own_outputs(out, inputs, w)):
                if diff:
                    fail("chain-writer", diff, writer=CHAIN_WRITER)
            outs.append(out)
        tree = guarded_step("chain-writer", target, None, tree_site, batch, heap)
        diff = first_difference("chain writer vs the tree kernel on the same chain", outs[-1], tree, config, batch,
                     want.compared)
        if diff:
            fail("chain-writer", diff, writer=CHAIN_WRITER, cell=f"{diff.cell} (vs the tree kernel)")
    return obs
