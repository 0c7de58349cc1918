"""Runs the properties as Hypothesis searches and collects what they found.

Each property becomes one ``@given`` search over its case strategy. A failure
is shrunk by Hypothesis, then written to disk as a repro file *before* it is
reported, and the campaign moves on to the next property: nothing found is lost
because a later property crashed or the user pressed Ctrl-C.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Phase, event, example, given, seed as hseed, settings, strategies as st
from hypothesis import target as hypothesis_target

from harness.config import Batch, Config, num_candidates
from harness.layouts import TreeMaskMode
from harness.properties import PROPERTIES, Property, PropertyFailure
from harness.repro_file import dump, from_case
from strategies import batches, configs, step_sequences, trivial_configs


@dataclass(frozen=True)
class Bounds:
    """Size ceiling of generated cases: keeps one example in the millisecond range."""

    max_bs: int = 8
    max_context_len: int = 64
    num_draft_tokens: int = 8
    topk: int = 4
    spec_steps: int = 4
    overshoot: int = 8


def cases(prop: Property, bounds: Bounds) -> st.SearchStrategy[tuple[Config, list[Batch]]]:
    if prop.trivial:
        cfgs = trivial_configs(max_bs=(1, bounds.max_bs), max_context_len=(1, bounds.max_context_len))
    else:
        cfgs = configs(max_bs=(1, bounds.max_bs), max_context_len=(1, bounds.max_context_len),
                       num_draft_tokens=(2, bounds.num_draft_tokens), topk=(1, bounds.topk),
                       spec_steps=(1, bounds.spec_steps))

    # One case strategy per config, built once: flatmap calls this for every example.
    @lru_cache(maxsize=8192)
    def with_batches(config: Config):
        if prop.steps:
            steps = step_sequences(config, overshoot=bounds.overshoot)
        else:
            steps = batches(config, overshoot=bounds.overshoot).map(lambda b: [b])
        return steps.map(lambda bs: (config, bs))

    return cfgs.flatmap(with_batches)


def boundary_cases(prop: Property, bounds: Bounds) -> list[tuple[Config, list[Batch]]]:
    """A seed corpus run before the search: each layout at the capacity boundary.

    Hypothesis starts from minimal examples and then mutates their tails, so its
    first dozen cases share one config; the boundary classes of DESIGN.md
    section 2 (bs = max_bs, bs = max_bs + 1, every request at the context limit,
    both layouts) are too important to wait for. Four cases per property at
    most, the same for every target.
    """
    m, c = min(2, bounds.max_bs), bounds.max_context_len
    if prop.trivial:
        shapes = [(1, 1, 0)]
    else:
        d = min(4, bounds.num_draft_tokens)
        topk = min(2, bounds.topk, d - 1)
        steps = next((s for s in range(1, bounds.spec_steps + 1) if num_candidates(topk, s) >= d - 1), None)
        if steps is None:
            return []
        shapes = [(d, topk, steps)]
    out = []
    for mode in (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY):
        for d, topk, steps in shapes:
            config = Config(mode, m, c, d, topk, steps)
            at, past = Batch((c,) * m), Batch((c,) * (m + 1))
            if prop.steps:
                out.append((config, [at, past]))  # a full captured step leaves stale cells, then an eager one
            else:
                out.extend([(config, [past]), (config, [at])])
    return out


@dataclass
class Finding:
    prop: str
    detail: str
    path: Path
    config: Config
    batches: list[Batch]


@dataclass
class PropertyResult:
    prop: str
    examples: int = 0
    classes: Counter = field(default_factory=Counter)
    max_margin: float = float("-inf")
    seconds: float = 0.0
    finding: Finding | None = None
    #: seconds from the start of the search to the first failing example (before shrinking)
    seconds_to_failure: float | None = None


def run_property(target, prop: Property, *, seed: int, max_examples: int, bounds: Bounds,
                 findings_dir: Path, device: str = "cpu", database=None) -> PropertyResult:
    result = PropertyResult(prop.name)
    state = {"case": None, "failed": False}

    @settings(max_examples=max_examples, deadline=None, database=database, print_blob=False,
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
    @hseed(seed)
    @given(cases(prop, bounds))
    def search(case):
        state["case"] = case
        config, steps = case
        # Counted before the check: "examples to first detection" includes the failing one.
        if not state["failed"]:
            result.examples += 1
        try:
            obs = prop.check(target, config, steps, device)
        except Exception:
            if not state["failed"]:
                result.seconds_to_failure = time.perf_counter() - start
            state["failed"] = True
            raise
        if not state["failed"]:
            result.classes.update(obs.classes)
            result.max_margin = max(result.max_margin, obs.margin)
        for cls in sorted(obs.classes):
            event(cls)
        hypothesis_target(obs.margin, label="overflow margin (cells)")

    for case in reversed(boundary_cases(prop, bounds)):  # @example runs them in listed order
        search = example(case)(search)
    start = time.perf_counter()
    try:
        search()
    except PropertyFailure as exc:
        result.finding = _record(target, prop.name, exc.detail, state["case"], seed, findings_dir)
    except Exception as exc:  # the target itself broke on this case: that is a finding too
        detail = f"target raised {type(exc).__name__}: {exc}"
        result.finding = _record(target, prop.name, detail, state["case"], seed, findings_dir)
    result.seconds = time.perf_counter() - start
    return result


def _record(target, prop: str, detail: str, case, seed: int, findings_dir: Path) -> Finding:
    config, steps = case
    repro = from_case(target.name, prop, config, steps, detail=detail, seed=seed)
    path = findings_dir / f"{prop}.json"
    n = 1
    while path.exists():
        n += 1
        path = findings_dir / f"{prop}-{n}.json"
    dump(repro, path)
    return Finding(prop, detail, path, config, steps)


def run_campaign(target, *, seed: int, max_examples: int, bounds: Bounds, findings_dir: Path,
                 properties: list[str] | None = None, device: str = "cpu",
                 on_result: Callable[[PropertyResult], None] = lambda r: None) -> list[PropertyResult]:
    results = []
    for name in properties or list(PROPERTIES):
        res = run_property(target, PROPERTIES[name], seed=seed, max_examples=max_examples,
                           bounds=bounds, findings_dir=findings_dir, device=device)
        on_result(res)
        results.append(res)
    return results
