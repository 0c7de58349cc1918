"""Capacity policy at production scale, by arithmetic on the footprint.

``verify-policy`` asks a target's own sizing (``allocate`` on torch's meta
device, so nothing is materialized) and its own ``fits`` for every batch size
in ``[1, 4 * max_bs]`` over a grid of deployments far too large to allocate,
and compares each answer with the worst-case footprint
(``layouts.worst_case_size``): capacity-soundness (``fits`` => the worst case
fits the buffer) and capacity-liveness (``bs <= max_bs`` => ``fits``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Callable

from vmfuzz.harness.model.allocation import AllocatorChose
from vmfuzz.harness.model.config import Batch, Config, num_candidates
from vmfuzz.harness.model.layouts import TreeMaskMode, worst_case_size
from vmfuzz.harness.model.repro_file import dump, from_case

# Captured batch sizes a server is started with (CUDA-graph buckets, odd ones a
# user types, and the largest SGLang captures), draft sizes up to 64 and
# context limits from toy to 1M tokens.
GRID_MAX_BS = (1, 2, 3, 4, 7, 8, 16, 24, 32, 48, 64, 96, 128, 160, 256, 512, 1000, 1024)
GRID_DRAFT_TOKENS = (1, 2, 3, 4, 8, 16, 32, 63, 64)
GRID_CONTEXT = (0, 1, 2, 3, 4096, 32768, 131072, 1 << 20)
OVERSHOOT = 4  # bs is checked up to OVERSHOOT * max_bs: eager batches well past the captured size


def draft_shape(d: int) -> tuple[int, int]:
    """A (topk, spec_steps) that can draft ``d`` tokens: sizing and fits never look at it."""
    if d == 1:
        return 1, 0
    topk = min(d - 1, 8)
    steps = 1
    while num_candidates(topk, steps) < d - 1:
        steps += 1
    return topk, steps


def grid() -> list[Config]:
    out = []
    for mode, is_read in ((TreeMaskMode.FULL_MASK, True), (TreeMaskMode.QLEN_ONLY, True),
                          (TreeMaskMode.QLEN_ONLY, False)):
        for max_bs, d, ctx in product(GRID_MAX_BS, GRID_DRAFT_TOKENS, GRID_CONTEXT):
            topk, steps = draft_shape(d)
            out.append(Config(mode, max_bs, ctx, d, topk, steps, is_read).validate())
    return out


@dataclass
class PolicyViolation:
    prop: str
    config: Config
    bs: int
    detail: str
    path: Path | None = None


@dataclass
class PolicyReport:
    target: str
    configs: int = 0
    checks: int = 0
    seconds: float = 0.0
    violations: dict[str, int] = field(default_factory=dict)
    first: dict[str, PolicyViolation] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.first


def check_config(target, config: Config, report: PolicyReport) -> None:
    try:
        mask = target.allocate(config, None)
    except AllocatorChose as chose:
        why = str(chose)  # the except clause unbinds ``chose`` when it ends
        _note(report, "capacity-soundness", config, config.max_bs, lambda: why)
        return
    cap = mask.buffer.numel()
    d, ctx, max_bs = config.d, config.max_context_len, config.max_bs
    fits = target.fits
    for bs in range(1, OVERSHOOT * max_bs + 1):
        ok = fits(mask, bs)
        report.checks += 1
        if ok:
            worst = worst_case_size(mask.mode, bs, d, ctx)
            if worst > cap:
                _note(report, "capacity-soundness", config, bs, lambda: (
                      f"fits({bs}) is True for a {cap}-cell {mask.mode.name} buffer (max_bs {max_bs}), "
                      f"but {bs} requests at max_context_len {ctx} need {worst} cells"))
        elif bs <= max_bs:
            _note(report, "capacity-liveness", config, bs, lambda: (
                  f"fits({bs}) is False although bs <= max_bs {max_bs} "
                  f"({mask.mode.name}, d {d}, max_context_len {ctx}): every such step falls back"))


def _note(report: PolicyReport, prop: str, config: Config, bs: int, detail: Callable[[], str]) -> None:
    # ``detail`` is formatted only for the first violation: a broken policy
    # violates hundreds of thousands of (config, bs) pairs.
    report.violations[prop] = report.violations.get(prop, 0) + 1
    # The repro prefers a drafting config: replay runs capacity properties on d >= 2 only.
    held = report.first.get(prop)
    if held is None or (held.config.trivial and not config.trivial):
        report.first[prop] = PolicyViolation(prop, config, bs, detail())


def verify_policy(target, configs: list[Config] | None = None,
                  findings_dir: Path | None = None) -> PolicyReport:
    """Check every config of the grid; write one repro per violated property to ``findings_dir``."""
    report = PolicyReport(target.name)
    start = time.perf_counter()
    for config in configs if configs is not None else grid():
        check_config(target, config, report)
        report.configs += 1
    report.seconds = time.perf_counter() - start
    if findings_dir is not None:
        for v in report.first.values():
            # Every request at the context limit: the footprint the policy had to guard.
            batch = Batch((v.config.max_context_len,) * v.bs)
            repro = from_case(target.name, v.prop, v.config, [batch], detail=v.detail)
            v.path = dump(repro, Path(findings_dir) / f"{v.prop}.json")
    return report
