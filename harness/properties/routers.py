"""``routing``: a router hands the call site the mask of the child that reads it.

For every case, every router kind (``vmfuzz.harness.model.routing.ROUTERS``) and both
speculative attention modes are checked, over children that each hold a
different verify mask, so a case stays (Config, [Batch]) and replays as such.
Per router and mode:

- the mask handed out is the mask of the child that runs TARGET_VERIFY
  (docs/properties.md, routing), and, where the target can observe it, the router dispatches
  the TARGET_VERIFY forward to that same child;
- unless the router keeps CPU sequence lengths (then the scheduler always
  passes the batch's exact length sum), the context it reports is a number
  covering every request the server admits and what that child's mask was
  sized for: the call site sizes a FULL_MASK fallback from it when the sum is
  unknown;
- one verify step through the call site, with the router as the attention
  backend, writes inside its buffers, into that child's buffer when the batch
  fits it (and into no other child's), and gives the oracle's outputs;
- the router's cuda-graph set-up and a replay's verify-buffer fix-up reach
  every child that runs TARGET_VERIFY, with the router's own arguments, and
  the fix-up no other child (``vmfuzz.harness.properties.router_graphs``).

Steps that would repeat one already run (the same handed mask, reported
context and length-sum policy) are skipped: their inputs are identical. The
routers' i-th children share one mask, so a case costs three verify steps:
the hybrid's two children (the hybrid-linear's full child repeats the first),
and the first child with the length sum known (TBO and the Dots wrapper).

Routers over routers (``NESTINGS``: TBO over a hybrid, a model wrapper over a
hybrid, a hybrid over a hybrid, ...) are checked the same way: the mask handed
out, the forward's dispatch and DFlash's policy must all reach the leaf that is
the verify child of the verify child. Their leaves take slots in order, so in
one nesting every leaf's mask differs.
"""

from __future__ import annotations

import msgspec
import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.oracle import expected
from vmfuzz.harness.model.origin import Origin
from vmfuzz.harness.properties.kit import (VERIFY_STEP, Observation, PropertyFailure, allocated, fail, fail_overrun, fill_stale,
                                    first_difference, known_as, known_goes_on, locator)
from vmfuzz.harness.model.routing import (NESTINGS, ROUTERS, SPEC_MODES, Child, dflash_needs_custom_mask, leaves,
                                   nested_children, nested_verify_leaf, verify_child)
from vmfuzz.harness.guard.shadow import ShadowHeap, describe_all
from vmfuzz.harness.properties.router_graphs import check_graphs
from vmfuzz.harness.properties.tbo_replay import check_tbo_replay

NAME = "routing"


def _raw(mask) -> torch.Tensor:
    return mask.buffer.detach().reshape(-1).view(torch.uint8).cpu().clone()


def _masks(target, config: Config, heap: ShadowHeap) -> list:
    """One verify mask per child slot, each with different leftovers (a nesting's leaves need the most)."""
    slots = max(max(len(roles) for roles in ROUTERS.values()),
                max(len(leaves(nested_children(o, i, lambda role, n: Child(role, None, None))))
                    for o, i in NESTINGS))
    masks = []
    for i in range(slots):
        mask = allocated(NAME, target, config, heap)
        fill_stale(mask.buffer, i)
        masks.append(mask)
    return masks


def _children(config: Config, router: str, masks: list) -> dict[str, Child]:
    # Slot i's mask serves every router's i-th child: within a router the masks
    # differ, and routers that hand out the same slot share one verify step.
    return {role: _leaf(config, masks, role, i) for i, role in enumerate(ROUTERS[router])}


def _leaf(config: Config, masks: list, role: str, slot: int) -> Child:
    # SGLang's linear-attention backends carry no context length at all. The first slot stands
    # for a backend that verifies causally, so DFlash's custom-mask answer differs between slots.
    return Child(role, masks[slot], None if role.endswith("linear") else config.max_context_len,
                 "TritonAttnBackend" if slot == 0 else None)


def _whose(children: dict, mask) -> str:
    if mask is None:
        return "no mask (None)"
    for role, child in leaves(children).items():
        if child.verify_mask is mask or (mask.buffer.data_ptr() == child.verify_mask.buffer.data_ptr()):
            return f"the {role} child's mask"
    return "a mask of no child"


def _routers(present, config: Config, masks: list):
    """(label, chain, router, children, spec_mode, verify leaf) for every router and every nesting present
    (``chain``: the routers outermost first, as a finding's origin names them, e.g. ``tbo>hybrid``)."""
    for router in present:
        children = _children(config, router, masks)
        for spec_mode in SPEC_MODES:
            yield f"{router} router", router, router, children, spec_mode, verify_child(router, spec_mode)
    for outer, inner in NESTINGS:
        if outer not in present or inner not in present:
            continue
        children = nested_children(outer, inner, lambda role, slot: _leaf(config, masks, role, slot))
        for spec_mode in SPEC_MODES:
            yield (f"{outer} router over {inner} routers", f"{outer}>{inner}", outer, children, spec_mode,
                   nested_verify_leaf(outer, inner, spec_mode))


def routing(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    if config.call_site == "frozen_kv_mtp":
        # That draft step never asks the attention backend for a mask, so no router
        # hands it one: the case is routed through the EAGLE call site instead.
        config = msgspec.structs.replace(config, call_site="eagle")
    for batch in batches:
        heap = ShadowHeap(device)
        masks = _masks(target, config, heap)
        stepped = set()
        present = getattr(target, "routers", None) or tuple(ROUTERS)
        obs.classes.update(f"{router}: not in this SGLang" for router in ROUTERS if router not in present)
        if "tbo" in present:
            with known_goes_on(target, obs, "tbo replay"):
                check_tbo_replay(target, obs, config, batch)
        for label, chain, router, children, spec_mode, role in _routers(present, config, masks):
            where = _Where(f"{label}, speculative_attention_mode {spec_mode}",
                           {"router": chain, "role": role, "spec_mode": spec_mode})
            r = target.route(router, spec_mode, children, config.max_context_len)
            name = label.removesuffix(" router")  # a plain router's classes keep its bare name
            # a known defect of one router ends only that router's checks: the others are still judged
            with known_goes_on(target, obs, f"{name} ({spec_mode})"):
                _check_router(target, obs, config, batch, heap, stepped, where, name, children, role, r)
                obs.classes.add(f"{name} ({spec_mode}) -> {role}")
    return obs


def _check_router(target, obs: Observation, config: Config, batch: Batch, heap: ShadowHeap, stepped: set,
                  where: str, label: str, children: dict, role: str, r) -> None:
    """What one built router hands out, reports, dispatches and resolves, and one step through it."""
    every = leaves(children)
    want = every[role]
    if r.verify_mask is not want.verify_mask:
        fail(NAME, f"{where}: hands out {_whose(children, r.verify_mask)}, but TARGET_VERIFY "
                    f"runs on the {role} child, which reads its own mask",
             effect="unsound", writer="router", buffer="verify_mask", cell="handed out", **where.origin)
    if r.verify_served is not None and len(r.verify_served) != 1:
        fail(NAME, f"{where}: a TARGET_VERIFY forward through the router asks "
                    + (f"{len(r.verify_served)} children ({', '.join(r.verify_served)})" if r.verify_served
                       else "no child") + f" to run attention, but exactly one, the {role} child, must: "
                    "verification then attends with no backend's mask, or with several",
             effect="unsound", writer="router", buffer="verify_mask", cell="dispatch", **where.origin)
    if r.serves_verify is not None and r.serves_verify != role:
        fail(NAME, f"{where}: dispatches the TARGET_VERIFY forward to the {r.serves_verify} child, "
                    f"but hands out the {role} child's mask",
             effect="unsound", writer="router", buffer="verify_mask", cell="dispatch", **where.origin)
    check_graphs(obs, where, label, children, r)
    if r.dflash_resolves is not None:
        _check_dflash(target, obs, where, label, role, r.dflash_resolves)
        if r.dflash_resolves == role and r.dflash_custom_mask is not None:
            _check_dflash_custom_mask(obs, where, label, want, r.dflash_custom_mask)
    need = max(config.max_context_len, want.max_context_len or 0)
    if r.needs_cpu_seq_lens:
        obs.classes.add(f"{label}: length sum always known")
    elif not isinstance(r.max_context_len, int) or isinstance(r.max_context_len, bool) \
            or r.max_context_len < need:
        fail(NAME, f"{where}: reports max_context_len {r.max_context_len!r}, but requests reach "
                    f"{config.max_context_len} tokens and the {role} child's mask was sized for "
                    f"{want.max_context_len}: a FULL_MASK fallback sized from it is too short",
             effect="unsound", writer="router", buffer="max_context_len", cell="reported", **where.origin)
    # with the length sum known, the reported context is never read
    key = (id(r.verify_mask), None if r.needs_cpu_seq_lens else r.max_context_len, r.needs_cpu_seq_lens)
    if key in stepped:
        return
    stepped.add(key)
    _step_through(target, obs, config, batch, heap, where, every, role, r)


def _step_through(target, obs: Observation, config: Config, batch: Batch, heap: ShadowHeap, where: str,
                  every: dict, role: str, r) -> None:
    want = every[role]
    before = {k: _raw(c.verify_mask) for k, c in every.items() if c.verify_mask is not want.verify_mask}
    out = target.verify_routed(r, config, batch, heap)
    bad = heap.check(locator(config, batch))
    if bad:
        fail_overrun(NAME, f"{where}: out-of-bounds write (bs {batch.bs}, max_bs {config.max_bs}): "
                     + describe_all(bad), bad, writer=VERIFY_STEP, capacity_bs=config.max_bs, **where.origin)
    reuses = target.fits(want.verify_mask, batch.bs)
    wrote = out.tree_mask.data_ptr()
    if reuses and wrote != want.verify_mask.buffer.data_ptr():
        fail(NAME, f"{where}: bs {batch.bs} fits the {role} child's mask, but the call site "
                    f"wrote {_whose(every, _Written(out.tree_mask))} instead",
             effect="unsound", writer="call site", buffer="verify_mask", cell="reuse", **where.origin)
    if not reuses and any(wrote == c.verify_mask.buffer.data_ptr() for c in every.values()):
        fail(NAME, f"{where}: bs {batch.bs} does not fit the {role} child's mask (max_bs "
                    f"{config.max_bs}), but the call site wrote {_whose(every, _Written(out.tree_mask))}",
             effect="unsound", writer="call site", buffer="verify_mask", cell="fallback", **where.origin)
    for k, raw in before.items():
        if not torch.equal(raw, _raw(every[k].verify_mask)):
            fail(NAME, f"{where}: the verify step changed the {k} child's mask, which no "
                        "TARGET_VERIFY forward reads",
                 effect="wrong", writer=VERIFY_STEP, buffer="another child's mask", **where.origin)
    out = out.as_cpu()
    obs.add_step(config, batch, out, want.verify_mask.buffer.numel())
    want_out = expected(config, batch)
    diff = first_difference(f"{where}: step through the router vs oracle", out, want_out, config, batch,
                            want_out.compared)
    if diff:
        fail(NAME, diff, writer=VERIFY_STEP, **where.origin)


def _check_dflash(target, obs: Observation, where: "_Where", router: str, role: str, resolved: str) -> None:
    """DFlash's verify-mask policy must decide for the child that runs TARGET_VERIFY.

    Every router is a wrapper the policy must see through: its own docstring's
    promise. A mismatch that is a known finding is recorded, not failed, so the
    rest of the case (and every other router) is still checked.
    """
    if resolved == role:
        obs.classes.add(f"{router}: dflash policy -> {role}")
        return
    detail = (f"{where}: DFlash's verify-mask policy resolves the router to {resolved}, but TARGET_VERIFY "
              f"runs on the {role} child, whose mask is handed out: the custom-mask decision is made for the "
              "wrong backend")
    origin = Origin(NAME, "unsound", writer="dflash policy", resolved=resolved, **where.origin)
    known = known_as(target, origin)
    if known is None:
        raise PropertyFailure(origin, detail)
    obs.classes.add(f"{router}: known finding {known}")


def _check_dflash_custom_mask(obs: Observation, where: "_Where", router: str, want: Child, builds: bool) -> None:
    """Having landed on the verify child, DFlash's policy must build a custom mask exactly when
    that child's backend needs one (``vmfuzz.harness.model.routing.dflash_needs_custom_mask``)."""
    needs = dflash_needs_custom_mask(want.backend)
    backend = want.backend or "a backend with no causal verify path"
    if builds != needs:
        fail(NAME, f"{where}: DFlash's verify-mask policy lands on the {want.role} child ({backend}) but "
                    + ("builds a custom mask it does not need" if builds else
                       "builds no custom mask, which that backend needs to keep the draft's tokens apart"),
             effect="unsound", writer="dflash policy", buffer="custom_mask", cell="built" if builds else "skipped",
             resolved=want.role, **where.origin)
    obs.classes.add(f"{router}: dflash custom mask {'built' if builds else 'skipped'}")


class _Where(str):
    """Where in the case a router was checked: the words, and the origin fields they stand for."""

    def __new__(cls, text: str, origin: dict):
        self = super().__new__(cls, text)
        self.origin = origin
        return self


class _Written:
    """A written tensor in the shape ``_whose`` compares (it reads ``.buffer``)."""

    def __init__(self, buffer: torch.Tensor):
        self.buffer = buffer
