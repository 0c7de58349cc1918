"""Several properties judged on one run of a case: each verify step launched once per path.

Run one by one, the drafting core properties relaunch the kernel for the same
batch again and again: no-oob-write (reuse, fallback), fallback-equivalence
(reuse, fallback), reference-agreement (reuse, fallback), multi-step-reuse
(carried buffer, fresh allocation every step). Under the Triton interpreter a
launch is milliseconds, so that repetition is most of a run's time. Here a
case is run once: per step the carried buffer (reused step after step, as a
server reuses it), and the per-batch fallback -- unless the step did not fit
and already fell back, then that one call is both; every property that opted
in (``Property.shared``) is judged on those outputs.

A third launch, a fresh allocation, is made only when a step's reuse output
disagrees with its fallback or with the oracle after the first step: it tells a
stale-state failure (multi-step-reuse: the fresh buffer agrees) from a reuse
path that is wrong on any buffer (fallback-equivalence, reference-agreement).
The price, recorded here: a reuse path that is right on the carried buffer but
wrong on a freshly allocated one is judged only when multi-step-reuse runs
alone (``--property multi-step-reuse``, or while shrinking its finding), where
every step's fresh allocation is launched, as before.

A failure names the property that failed; ``judge`` with one name judges only
that property, launching only what it needs -- the campaign shrinks a finding
that way, so the minimal case is minimal for its own property.
"""

from __future__ import annotations

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.properties.core import capacity_liveness, capacity_soundness
from vmfuzz.harness.properties.kit import (VERIFY_STEP, Difference, Observation, allocated, capacity_of, fail, fail_overrun, fill_stale,
                                    first_difference, locator)
from vmfuzz.harness.model.oracle import expected
from vmfuzz.harness.guard.shadow import ShadowHeap, describe_all

#: The order failures are looked for in a step (the cheap arithmetic first, then the guard).
ORDER = ("capacity-soundness", "capacity-liveness", "no-oob-write", "fallback-equivalence",
         "reference-agreement", "multi-step-reuse")
GROUP_PREFIX = "shared:"


def judge(target, config: Config, batches: list[Batch], device="cpu", names=ORDER) -> Observation:
    """Every property in ``names`` on one case; raises ``PropertyFailure`` naming the first that fails."""
    want = set(names)
    unknown = want - set(ORDER)
    if unknown:
        raise ValueError(f"not judged on a shared run: {', '.join(sorted(unknown))}")
    obs = Observation()
    for name, check in (("capacity-soundness", capacity_soundness), ("capacity-liveness", capacity_liveness)):
        if name in want:
            part = check(target, config, batches, device)
            obs.classes |= part.classes
            obs.by_property[name] = set(part.classes)
            obs.margin = max(obs.margin, part.margin)
            for path, m in part.path_margins.items():
                obs.path_margins[path] = max(obs.path_margins.get(path, float("-inf")), m)
    stepping = want - {"capacity-soundness", "capacity-liveness"}
    if not stepping:
        return obs
    stepped = Observation()  # the batches the kernel-launching members judged, at their own lengths
    _run_steps(target, config, batches, device, want, stepped)
    obs.classes |= stepped.classes
    obs.margin = max(obs.margin, stepped.margin)
    for path, m in stepped.path_margins.items():
        obs.path_margins[path] = max(obs.path_margins.get(path, float("-inf")), m)
    for name in stepping:
        obs.by_property[name] = set(stepped.classes)
    return obs


def _run_steps(target, config: Config, batches: list[Batch], device, want: set, obs: Observation) -> None:
    """The kernel-launching members' part of ``judge``: every step of the case, judged for ``want``."""
    oob = [n for n in ("no-oob-write", "multi-step-reuse") if n in want]
    needs_fallback = bool(want & {"no-oob-write", "fallback-equivalence", "reference-agreement"})
    needs_oracle = bool(want & {"fallback-equivalence", "reference-agreement", "multi-step-reuse"})
    only_multi_step = not needs_fallback and "multi-step-reuse" in want
    heap = ShadowHeap(device)
    mask = allocated(next(n for n in ORDER if n in want), target, config, heap)
    fill_stale(mask.buffer)  # what an earlier step would have left behind
    try:
        for k, batch in enumerate(batches):
            locate = locator(config, batch)
            out = target.verify(mask, config, batch, heap)
            _guarded(heap, oob[:1], locate, batch, config, "reused buffer" if out.reused else "fallback allocation")
            reuse = out.as_cpu()
            del out
            heap.release(keep=1)  # the carried buffer stays; this step's own allocations go back to the pool
            obs.add_step(config, batch, reuse, capacity_of(mask))
            want_out = expected(config, batch) if needs_oracle else None
            fallback = None
            if needs_fallback and not reuse.reused:
                fallback = reuse  # the step fell back already: the same call a fallback run would make
            elif needs_fallback:
                fallback = _launch(target, None, config, batch, device, ["no-oob-write"] if "no-oob-write" in want
                                   else [], locate)
            if only_multi_step:
                if k > 0:
                    fresh = _fresh(target, config, batch, device, oob[:1], locate)
                    _judge_multi_step(reuse, fresh, config, batch, want_out, k, len(batches))
                continue
            complaint = None  # (property, detail) against the reuse output
            if "fallback-equivalence" in want:
                diff = first_difference("reuse vs fallback", reuse, fallback, config, batch, want_out.compared)
                if diff:
                    complaint = ("fallback-equivalence", Difference(
                        diff + f" [reuse path taken: {reuse.reused}]", **diff.origin_fields()))
            if complaint is None and "reference-agreement" in want:
                diff = first_difference("reuse path vs oracle", reuse, want_out, config, batch, want_out.compared)
                if diff:
                    complaint = ("reference-agreement", diff)
            if complaint is None and needs_fallback and "multi-step-reuse" in want and k > 0:
                # Still owed to multi-step-reuse: the carried buffer vs what a fresh one
                # gives. The fallback stands in for the fresh buffer until they disagree.
                if first_difference("", reuse, fallback, config, batch, want_out.compared):
                    complaint = ("multi-step-reuse", None)
            if complaint is not None and "multi-step-reuse" in want and k > 0:
                fresh = _fresh(target, config, batch, device, oob[:1], locate)
                stale_only = first_difference("", fresh, fallback, config, batch, want_out.compared) is None
                if stale_only or complaint[0] == "multi-step-reuse":
                    _judge_multi_step(reuse, fresh, config, batch, want_out, k, len(batches))
            if complaint is not None and complaint[1] is not None:
                fail(*complaint, writer=VERIFY_STEP, step=k, steps=len(batches))
            if "reference-agreement" in want:
                diff = first_difference("fallback path vs oracle", fallback, want_out, config, batch, want_out.compared)
                if diff:
                    fail("reference-agreement", diff, writer=VERIFY_STEP, step=k, steps=len(batches))
    finally:
        del mask
        heap.release()


def _guarded(heap: ShadowHeap, props: list[str], locate, batch: Batch, config: Config, path: str) -> None:
    if not props:
        return
    violations = heap.check(locate)
    if violations:
        fail_overrun(props[0], f"out-of-bounds write on the {path} (bs {batch.bs}, max_bs {config.max_bs}): "
                     + describe_all(violations), violations, writer=VERIFY_STEP,
                     capacity_bs=config.max_bs if path == "reused buffer" else batch.bs)


def _launch(target, mask, config: Config, batch: Batch, device, oob: list[str], locate):
    heap = ShadowHeap(device)
    out = target.verify(mask, config, batch, heap)
    try:
        _guarded(heap, oob, locate, batch, config, "reused buffer" if out.reused else "fallback allocation")
        return out.as_cpu()
    finally:
        del out
        heap.release()


def _fresh(target, config: Config, batch: Batch, device, oob: list[str], locate):
    """The step on a freshly allocated buffer, as multi-step-reuse compares the carried one with."""
    heap = ShadowHeap(device)
    mask = allocated("multi-step-reuse", target, config, heap)
    out = target.verify(mask, config, batch, heap)
    try:
        _guarded(heap, oob, locate, batch, config, "reused buffer" if out.reused else "fallback allocation")
        return out.as_cpu()
    finally:
        del out, mask
        heap.release()


def _judge_multi_step(reuse, fresh, config: Config, batch: Batch, want_out, k: int, n: int) -> None:
    compared = (want_out if want_out is not None else expected(config, batch)).compared
    diff = first_difference(f"step {k} of {n}: reused vs fresh allocation", reuse, fresh, config, batch, compared)
    if diff:
        fail("multi-step-reuse", diff, writer=VERIFY_STEP, step=k, steps=n)


def group_name(names) -> str:
    return GROUP_PREFIX + ",".join(names)


def group_members(name: str) -> tuple[str, ...] | None:
    if not name.startswith(GROUP_PREFIX):
        return None
    return tuple(name[len(GROUP_PREFIX):].split(","))
