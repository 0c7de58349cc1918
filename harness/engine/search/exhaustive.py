"""Every configuration within small bounds, every property: the PR gate's first stage.

Small-scope hypothesis: a wrong capacity policy, sizing, fill or row offset
shows on a toy deployment as well as on a real one, and a toy scope can be
covered completely instead of sampled. The enumeration is deterministic, so a
failure here is the same failure on every machine.

Bounds (see ``BOUNDS``): layouts FULL_MASK, QLEN_ONLY read and unread;
max_bs 1..3; max_context_len 0..3; num_draft_tokens 1..4 with every
(topk 1..2, spec_steps 1..3) that can draft them; bs 1..min(5, max_bs + 2).

seq_lens: every ordered tuple in [0, max_context_len]^bs for bs <= 2, every
multiset of the boundary lengths {0, max_context_len} for bs >= 3 (request
order changes only where a block starts, which two requests already
exercise; interior lengths are swept at bs <= 2). This sweep runs on the first
(topk, spec_steps) of each d -- addresses depend on d and seq_lens, not on the
tree; the other draft shapes see bs = max_bs and max_bs + 1 with every request
at the context limit.

Trees: every distinct tree shape (node-level parent links, detached parents
included) the draft stage produces over child costs and tie-break ranks in
{0, 1} (for more than 6 candidates: every cost vector with ties broken by id
or against it), each at bs 1 and at max_bs + 1, every request at the context
limit. Capacity properties see every bs, with no allocation.

Call sites: every config runs through the default call site (``eagle``) as
above; every chain-shaped config also through the ``chain`` branch, with the
same sweep (it is another writer); every config also through the ``pp``
rebuild at bs 1, max_bs and max_bs + 1 with every request at the limit (it
shares the EAGLE tail's writer, so only its reuse decision is new), and every
FULL_MASK drafting config through the ``frozen_kv_mtp`` draft the same way (it
always falls back). The chain-writer property runs on each chain-shaped config once.
"""

from __future__ import annotations

import itertools
import time

import msgspec
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

from vmfuzz.harness.model.config import Batch, Config, ConfigError, DraftTree, num_candidates, site_takes
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.properties import PROPERTIES, Property, PropertyFailure
from vmfuzz.harness.model.repro_file import dump, from_case
from vmfuzz.harness.model.trees import draft, parents, simplest

BOUNDS = {"max_bs": 3, "bs": 5, "num_draft_tokens": 4, "topk": 2, "spec_steps": 3, "max_context_len": 3}
FULL_TIEBREAK_CANDIDATES = 6  # beyond this many candidates, 4^n cost x tie-break pairs is too many

LAYOUTS = ((TreeMaskMode.FULL_MASK, True), (TreeMaskMode.QLEN_ONLY, True), (TreeMaskMode.QLEN_ONLY, False))


def configs() -> list[Config]:
    out = []
    for (mode, is_read), max_bs, ctx, d in itertools.product(
            LAYOUTS, range(1, BOUNDS["max_bs"] + 1), range(BOUNDS["max_context_len"] + 1),
            range(1, BOUNDS["num_draft_tokens"] + 1)):
        shapes = [(1, 0)] if d == 1 else itertools.product(range(1, BOUNDS["topk"] + 1),
                                                          range(1, BOUNDS["spec_steps"] + 1))
        for topk, steps in shapes:
            try:
                config = Config(mode, max_bs, ctx, d, topk, steps, is_read).validate()
            except ConfigError:
                continue  # this (topk, spec_steps) cannot draft d tokens
            out.append(config)
            out.extend(msgspec.structs.replace(config, call_site=site) for site in ("chain", "pp", "frozen_kv_mtp")
                       if site_takes(site, config))
    return out


def _runs(prop: Property, config: Config) -> bool:
    """Does ``prop`` check ``config``? Arithmetic and the direct chain writer ignore the call site."""
    if not prop.applies(config):
        return False
    if prop.chain:
        return config.chain and config.call_site == "eagle"
    if prop.arithmetic:
        return config.call_site == "eagle"
    return True


def batch_sizes(config: Config) -> range:
    return range(1, min(BOUNDS["bs"], config.max_bs + 2) + 1)


def seq_lens_of(ctx: int, bs: int) -> list[tuple[int, ...]]:
    if bs <= 2:
        return list(itertools.product(range(ctx + 1), repeat=bs))
    return list(itertools.combinations_with_replacement(sorted({0, ctx}), bs))


def _sweeps_seq_lens(config: Config) -> bool:
    """Only the first draft shape of each d sweeps seq_lens: addresses depend on d, not on the tree."""
    if config.trivial:
        return True
    for topk, steps in itertools.product(range(1, BOUNDS["topk"] + 1), range(1, BOUNDS["spec_steps"] + 1)):
        if num_candidates(topk, steps) >= config.d - 1:
            return (topk, steps) == (config.topk, config.spec_steps)
    return False


@lru_cache(maxsize=None)
def tree_shapes(topk: int, spec_steps: int, d: int) -> tuple[DraftTree, ...]:
    """One draft tree per distinct shape, the first found in a fixed order."""
    n = num_candidates(topk, spec_steps)
    binary = list(itertools.product((0, 1), repeat=n))
    ties = binary if n <= FULL_TIEBREAK_CANDIDATES else [(0,) * n, tuple(range(n, 0, -1))]
    seen: dict[tuple[int, ...], DraftTree] = {}
    for costs in binary:
        for tiebreak in ties:
            tree = draft(topk, spec_steps, d, costs, tiebreak)
            seen.setdefault(tuple(parents(tree, topk)), tree)
    return tuple(seen.values())


def batches_of(config: Config) -> list[Batch]:
    ctx = config.max_context_len
    if config.call_site in ("pp", "frozen_kv_mtp"):
        # Sites that add no index arithmetic of their own: the boundary sizes suffice.
        return [Batch((ctx,) * bs) for bs in sorted({1, config.max_bs, config.max_bs + 1})]
    if _sweeps_seq_lens(config):
        out = [Batch(lens) for bs in batch_sizes(config) for lens in seq_lens_of(ctx, bs)]
    else:
        # At the capacity boundary and one request past it; the tree sweep below adds bs 1.
        out = [Batch((ctx,) * bs) for bs in sorted({config.max_bs, config.max_bs + 1})]
    if not config.trivial:
        base = simplest(config.topk, config.spec_steps, config.d)
        for tree in tree_shapes(config.topk, config.spec_steps, config.d):
            if tree == base:
                continue  # the seq_lens sweep already runs the simplest tree
            for bs in (1, config.max_bs + 1):
                out.append(Batch((ctx,) * bs, (tree,) * bs))
    return out


def capacity_batches(config: Config) -> list[Batch]:
    # Capacity properties read only bs; every request at the limit is the worst case.
    return [Batch((config.max_context_len,) * bs) for bs in batch_sizes(config)]


@dataclass
class PropertyTally:
    prop: str
    configs: int = 0
    batches: int = 0
    seconds: float = 0.0
    failure: str | None = None
    path: Path | None = None
    #: why the target cannot drive it (a seam it lacks): reported, never held
    not_driven: str | None = None


@dataclass
class ExhaustiveReport:
    target: str
    tallies: list[PropertyTally] = field(default_factory=list)
    seconds: float = 0.0
    #: Ctrl-C or SIGTERM: ``tallies`` are the properties that finished
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return all(t.failure is None for t in self.tallies)


def _fails(prop: Property, target, config: Config, batches: list[Batch], device: str) -> PropertyFailure | None:
    from vmfuzz.harness.engine.core.failures import consulted_check
    try:
        with consulted_check():
            prop.check(target, config, batches, device)
    except PropertyFailure as exc:
        return exc
    except OutOfStep:
        raise  # vmfuzz no longer fits the code: the command says so (exit 3), never a finding
    except (Exception, SystemExit) as exc:  # the target itself broke (even exit()): a finding, as in the campaign
        from vmfuzz.harness.engine.core.failures import failure_of
        return PropertyFailure(*failure_of(prop.name, exc))
    return None


def _smallest_failing(prop: Property, target, config: Config, batches: list[Batch],
                      device: str) -> tuple[list[Batch], PropertyFailure]:
    """The failing step and, for multi-step reuse, the fewest steps before it that still fail.

    Steps are deterministic, so "the prefix of length k fails" is monotone in k:
    bisect for the first failing step instead of re-running every prefix.
    """
    lo, hi = 1, len(batches)
    while lo < hi:
        mid = (lo + hi) // 2
        if _fails(prop, target, config, batches[:mid], device):
            hi = mid
        else:
            lo = mid + 1
    prefix = batches[:lo]
    if not prop.steps:
        prefix = prefix[-1:]
    else:
        for start in range(len(prefix) - 1, -1, -1):  # usually one or two steps back
            if _fails(prop, target, config, prefix[start:], device):
                prefix = prefix[start:]
                break
    return prefix, _fails(prop, target, config, prefix, device)


_worker_target = None


def _init_worker(spec: str) -> None:
    import torch

    from vmfuzz.harness.engine.core.signals import ignore_in_child
    from vmfuzz.harness.targets import resolve
    global _worker_target
    ignore_in_child()  # Ctrl-C reaches the whole group: the parent stops the pool
    torch.set_num_threads(1)
    _worker_target = resolve(spec)


def _resolvable(spec: str) -> bool:
    from vmfuzz.harness.targets import TargetUnavailable, resolve
    try:
        resolve(spec)
    except TargetUnavailable:
        return False
    return True


def _check_one(job) -> bool:
    name, config, device = job
    # Batches are rebuilt here rather than pickled: cheaper than shipping them.
    return _fails(PROPERTIES[name], _worker_target, config, batches_of(config), device) is None


def run_exhaustive(target, *, findings_dir: Path | None = None, device: str = "cpu",
                   properties: list[str] | None = None, workers: int = 1, stop_at_first: bool = False,
                   echo: Callable[[str], None] = lambda line: None) -> ExhaustiveReport:
    """Check every property on every configuration within ``BOUNDS``.

    ``workers > 1`` checks configurations in that many processes, where the
    target is rebuilt with ``resolve(target.name)``: pass it only for a target
    that name rebuilds (the CLI's are); results are consumed in enumeration order, so the
    reported failure is the same with any number of workers. ``stop_at_first``
    ends the run at the first finding of any property.
    """
    report = ExhaustiveReport(target.name)
    start = time.perf_counter()
    all_configs = configs()
    echo(f"vmfuzz exhaustive: target {target.name}, {len(all_configs)} configurations "
         f"(max_bs <= {BOUNDS['max_bs']}, bs <= {BOUNDS['bs']}, d <= {BOUNDS['num_draft_tokens']}, "
         f"topk <= {BOUNDS['topk']}, spec_steps <= {BOUNDS['spec_steps']}, "
         f"max_context_len <= {BOUNDS['max_context_len']})")
    pool = None
    if workers > 1 and not _resolvable(target.name):
        workers = 1  # a worker re-resolves the target by name; one that cannot checks here
    if workers > 1:
        import multiprocessing
        from vmfuzz.harness.engine.core.signals import held
        with held():
            pool = multiprocessing.get_context("fork").Pool(workers, _init_worker, (target.name,))
    try:
        _run(target, report, all_configs, properties, device, findings_dir, pool, stop_at_first, echo)
    except KeyboardInterrupt:
        from vmfuzz.harness.engine.core.signals import received
        if received() is None:
            raise  # the target raised it, no signal came: not an interrupt of the run
        report.interrupted = True
    finally:
        if pool is not None:
            pool.terminate()
    report.seconds = time.perf_counter() - start
    if report.interrupted:
        echo(f"interrupted after {len(report.tallies)} propert{'y' if len(report.tallies) == 1 else 'ies'} "
             f"in {report.seconds:.1f}s")
        return report
    verdict = "all properties held" if report.ok else \
        f"{sum(t.failure is not None for t in report.tallies)} finding(s)"
    echo(f"{verdict} in {report.seconds:.1f}s")
    return report


def _run(target, report, all_configs, properties, device, findings_dir, pool, stop_at_first, echo) -> None:
    for name in properties or list(PROPERTIES):
        prop = PROPERTIES[name]
        tally = PropertyTally(name)
        if prop.missing(target):
            tally.not_driven = f"{target.name} lacks {', '.join(prop.missing(target))}"
            report.tallies.append(tally)
            echo(f"  {name:<22} not driven: {tally.not_driven}")
            continue
        t0 = time.perf_counter()
        arithmetic = prop.arithmetic
        jobs = [(name, config, capacity_batches(config) if arithmetic else batches_of(config), device)
                for config in all_configs if _runs(prop, config)]
        if pool is not None and not arithmetic:
            verdicts = pool.imap(_check_one, [(name, config, device) for _, config, _, _ in jobs], chunksize=4)
        else:
            verdicts = (_fails(prop, target, config, batches, device) is None for _, config, batches, _ in jobs)
        for (_, config, batches, _), held in zip(jobs, verdicts):
            tally.configs += 1
            tally.batches += len(batches)
            if held:
                continue
            repro_batches, exc = _smallest_failing(prop, target, config, batches, device)
            tally.failure = exc.detail
            if findings_dir is not None:
                repro = from_case(target.name, name, config, repro_batches, detail=exc.detail, origin=exc.origin)
                tally.path = dump(repro, Path(findings_dir) / f"{name}.json")
            break  # the first failure per property is the finding; the next property runs
        tally.seconds = time.perf_counter() - t0
        report.tallies.append(tally)
        status = "FAILED" if tally.failure else "held"
        echo(f"  {name:<22} {status:<6} {tally.configs:>4} configs {tally.batches:>6} batches "
             f"{tally.seconds:6.1f}s")
        if tally.failure:
            echo(f"      finding: {tally.failure}")
            if tally.path:
                echo(f"      repro:   {tally.path}")
            if stop_at_first:
                return
