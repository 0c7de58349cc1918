"""Shrinks one externally supplied failing case until no single simplification keeps it failing.

Hypothesis shrinks what it generated; a case from production (a deployment
description, a repro file from a bug report) was not generated, so it is
shrunk here, greedily: try each one-step simplification, take the first that
still fails the same way, start over; stop when none does. Every candidate is
re-validated, so the result is always a case a server could have produced.
"""

from __future__ import annotations

from typing import Callable, Iterator

from vmfuzz.harness.model.config import Batch, Config, ConfigError

Case = tuple[Config, list[Batch]]

#: For a deployment: the first of these the observed batch fails is the one kept failing.
DEPLOYMENT_ORDER = ("no-oob-write", "capacity-soundness", "fallback-equivalence", "reference-agreement",
                    "capacity-liveness", "multi-step-reuse")


def _lower(v: int, floor: int) -> list[int]:
    """Smaller values to try, boldest first."""
    return [x for x in dict.fromkeys((floor, v // 2, v - 1)) if floor <= x < v]


def _valid(config: Config, steps: list[Batch], server: bool = False) -> Case | None:
    """The candidate, validated; ``server``: also within what a server can run (else None)."""
    from vmfuzz.harness.model.validate import server_problem
    try:
        config.validate()
        case = config, [b.validate(config) for b in steps]
    except ConfigError:
        return None
    return None if server and server_problem(config) is not None else case


def _with(config: Config, **kw) -> Config:
    fields = {f: getattr(config, f) for f in config.__struct_fields__}
    return Config(**{**fields, **kw})


def _drop_requests(b: Batch) -> Iterator[Batch]:
    """Halves, quarters, ... then single requests: 48 requests shrink in a few dozen tries."""
    n = b.bs
    size = n // 2
    while size >= 1:
        for start in range(0, n, size):
            keep = [i for i in range(n) if not start <= i < start + size]
            if keep:
                yield Batch(tuple(b.seq_lens[i] for i in keep),
                            None if b.trees is None else tuple(b.trees[i] for i in keep))
        size //= 2


def _first(b: Batch, n: int) -> Batch:
    """The batch's first ``n`` requests."""
    return Batch(b.seq_lens[:n], None if b.trees is None else b.trees[:n])


def candidates(case: Case) -> Iterator[Case]:
    config, steps = case
    if len(steps) > 1:
        for i in range(len(steps)):
            yield config, steps[:i] + steps[i + 1:]
    for i, b in enumerate(steps):
        for smaller in _drop_requests(b):
            yield config, steps[:i] + [smaller] + steps[i + 1:]
    for m in _lower(config.max_bs, 1):
        yield _with(config, max_bs=m), steps
        # linked: the captured max_bs and each batch's size past it lowered together, so a batch
        # that overflows the capture by k requests still does (max_bs 8, bs 9 -> max_bs 1, bs 2)
        if any(b.bs > config.max_bs for b in steps):
            yield _with(config, max_bs=m), [_first(b, b.bs - (config.max_bs - m)) if b.bs > config.max_bs else b
                                             for b in steps]
    longest = max(max(b.seq_lens) for b in steps)
    for c in dict.fromkeys([longest] + _lower(config.max_context_len, 0)):
        if c < config.max_context_len:
            yield _with(config, max_context_len=c), [
                Batch(tuple(min(s, c) for s in b.seq_lens), b.trees) for b in steps]
    # the draft's shape before the lengths: a smaller d or fewer steps is a simpler case at any
    # length, while lengths lowered first can leave a case that fails only at the wider draft
    if not config.trivial:
        simple = [Batch(b.seq_lens) for b in steps]  # a new tree shape: simplest trees
        for d in _lower(config.d, 2):
            yield _with(config, num_draft_tokens=d), simple
        for k in _lower(config.topk, 1):
            yield _with(config, topk=k), simple
        for s in _lower(config.spec_steps, 1):
            yield _with(config, spec_steps=s), simple
            # linked: a draft's width is bounded by its steps (a chain's is steps + 1), so neither
            # lowers alone; the context that must hold a verify pass follows in a later step
            for d in _lower(config.d, 2):
                yield _with(config, num_draft_tokens=d, spec_steps=s), simple
    for i, b in enumerate(steps):
        if any(b.seq_lens):
            yield config, steps[:i] + [Batch((0,) * b.bs, b.trees)] + steps[i + 1:]
        for j, s in enumerate(b.seq_lens):
            for t in _lower(s, 0):
                lens = b.seq_lens[:j] + (t,) + b.seq_lens[j + 1:]
                yield config, steps[:i] + [Batch(lens, b.trees)] + steps[i + 1:]
    for i, b in enumerate(steps):
        if b.trees is not None:
            yield config, steps[:i] + [Batch(b.seq_lens)] + steps[i + 1:]


def minimize(case: Case, still_fails: Callable[[Case], str | None], *, on_step=lambda case, detail: None
             ) -> tuple[Case, str, int]:
    """Greedy fixpoint. ``still_fails(case)`` is the failure detail, or None. Returns (case, detail, tries)."""
    from vmfuzz.harness.model.validate import server_problem
    detail = still_fails(case)
    if detail is None:
        raise ValueError("the case does not fail to begin with")
    # A case a server could have shrinks only to cases a server could have: a
    # repro ending at context 0 would be a bug report no one can reproduce.
    server = server_problem(case[0]) is None
    tries = 0
    improved = True
    while improved:
        improved = False
        for cand in candidates(case):
            cand = _valid(*cand, server=server)
            if cand is None:
                continue
            tries += 1
            d = still_fails(cand)
            if d is not None:
                case, detail, improved = cand, d, True
                on_step(case, detail)
                break
    return case, detail, tries


def describe(case: Case) -> str:
    config, steps = case
    c = config
    head = (f"{c.mode.name}{'' if c.is_read else ' (unread)'} max_bs {c.max_bs}, context {c.max_context_len}, "
            f"d {c.d}, topk {c.topk}, steps {c.spec_steps}")
    def lens(b: Batch) -> str:
        s = list(b.seq_lens)
        shown = s if len(s) <= 8 else s[:4] + ["..."] + s[-2:]
        return f"bs {b.bs} seq_lens [{', '.join(map(str, shown))}]" + ("" if b.trees is None else " (custom trees)")
    return head + "; " + "; ".join(f"step {i}: {lens(b)}" for i, b in enumerate(steps))


class Failed(str):
    """A candidate's failure: the detail (words) and its typed origin (what is kept)."""

    def __new__(cls, detail: str, origin):
        self = super().__new__(cls, detail)
        self.origin = origin
        return self


def checker(prop, target, device: str, fault: str | None, timeout: float, keep=None):
    """``(still_fails, close)``: whether a case still fails ``prop`` *the same way*: a ``Failed``
    whose origin has the cause of ``keep`` (the repro's recorded origin), or else of the first
    failure seen, or None. A candidate failing another way is not a smaller case of this finding
    (ClusterFuzz keeps a crash state the same way), so minimizing never drifts to another bug."""
    from vmfuzz.harness.engine.core.failures import consulted_check, failure_of
    wanted = {"cause": keep.cause() if keep is not None else None}

    def same(exc) -> Failed | None:
        origin, detail = failure_of(prop.name, exc)
        if origin.property != prop.name:
            return None
        if wanted["cause"] is None:
            wanted["cause"] = origin.cause()
        return Failed(detail, origin) if origin.cause() == wanted["cause"] else None

    if fault is None:
        def still_fails(case: Case) -> Failed | None:
            try:
                with consulted_check():
                    prop.check(target, case[0], case[1], device)
            except KeyboardInterrupt as exc:
                from vmfuzz.harness.engine.core.signals import from_user
                if from_user(exc):
                    raise
                return same(exc)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - a target that raises fails too
                from vmfuzz.harness.model.errors import OutOfStep
                if isinstance(exc, OutOfStep):
                    if wanted["cause"] is None:
                        raise  # the input itself cannot be checked: exit 3, never a finding
                    return None  # a candidate the harness cannot drive is not this failure
                return same(exc)
            return None
        return still_fails, lambda: None
    from vmfuzz.harness.engine.core.isolation import IsolatedChecker, TargetFault
    iso = IsolatedChecker(target, timeout)

    def still_fails_isolated(case: Case) -> Failed | None:
        try:
            iso(prop, case[0], case[1], device)
        except TargetFault as exc:
            return same(exc) if exc.kind == fault else None
        except Exception:  # noqa: BLE001 - a different failure is not the one being kept
            return None
        return None
    return still_fails_isolated, iso.close
