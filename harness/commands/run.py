"""``vmfuzz run``: search every property for a counterexample, then report.

``plan`` and ``execute_and_report`` are shared with ``gate``, which is a run
under the pr profile, taken only when the change touches mask code.
"""

from __future__ import annotations

import dataclasses
import random
import sys
from functools import partial
from pathlib import Path

from harness.commands.common import (check_device, check_places, check_property_names, check_run_options,
                                     check_shared_db, isolated, known_roots, local_db_dir, repro_roots,
                                     resolve_target, write_reports_somewhere)
from harness.engine.campaign.profiles import PROFILES
from harness.model import limits
from harness.model.bounds import Bounds
from harness.model.errors import (EXIT_COULD_NOT_CHECK, EXIT_FINDING, EXIT_OK, EXIT_OUT_OF_STEP,
                                  UsageError, out_of_step_line)
from harness.report.terminal import classes_line, paint, plural


def run(args) -> int:
    from harness.commands.common import import_finding
    from harness.engine.core.failures import ImportRaised
    try:
        plan_, target = plan(args, seed=args.seed, max_examples=args.max_examples, time_budget=args.time_budget,
                             deployment_file=args.deployment)
    except ImportRaised as exc:  # the code under test does not load: that is the finding
        return import_finding(args, "run", args.target, exc)
    return execute_and_report(plan_, target, verbose=args.verbose)


def plan(args, *, command: str = "run", profile_name: str | None = None, seed=None, max_examples=None,
         time_budget=None, deployment_file=None):
    """Checks the arguments shared by run and gate; returns (plan, target).

    The keyword arguments stand in for options ``gate`` does not have.
    """
    from harness.model.deployment_file import DeploymentError, load
    from harness.engine.campaign.session import RunPlan
    from harness.properties import PROPERTIES

    profile = PROFILES[profile_name or args.profile]
    properties = getattr(args, "properties", None) or list(PROPERTIES)
    check_property_names(properties)
    properties, profile = _shard(args, properties, profile)
    workers = check_run_options(args, properties)
    deployment = None
    if deployment_file:
        try:
            deployment = load(deployment_file)
        except DeploymentError as exc:
            raise UsageError(f"vmfuzz: {exc}") from None
    check_device(args.device)
    target = resolve_target(args.target)
    if seed is None:
        seed = profile.fixed_seed if profile.fixed_seed is not None else random.SystemRandom().randrange(2**31)
    # A slow target (sglang runs its kernel in the Triton interpreter) carries
    # its own example budget per profile and size ceiling.
    own_budget = getattr(target, "budget", {}).get(profile.name)
    report_dir = check_places(args, profile)
    db_url = check_shared_db(args.db, profile)
    run_plan = RunPlan(target=args.target, profile=profile, seed=seed,
                       max_examples=max_examples or min(profile.max_examples, own_budget or profile.max_examples),
                       time_budget=time_budget if time_budget is not None else profile.time_budget,
                       report_dir=report_dir,
                       properties=properties, workers=workers, device=args.device, db_dir=local_db_dir(args),
                       db_url=db_url, shard=getattr(args, "shard", None),
                       isolate=isolated(args.isolate, args.target),
                       # Production shapes in the Triton interpreter take tens of seconds a
                       # case: a slow target names its own limit per profile.
                       example_timeout=args.example_timeout
                       or getattr(target, "example_timeout", {}).get(profile.name) or 30.0,
                       deployment=deployment, command=command,
                       repro_roots=repro_roots(args), known_roots=known_roots(args),
                       fail_on_known=args.fail_on_known,
                       bounds=getattr(target, "bounds", None) or Bounds(), share=getattr(args, "share", True))
    user_bounds = getattr(args, "bounds", None)
    if user_bounds is not None:
        run_plan.bounds = parse_bounds(user_bounds, run_plan.bounds)
    else:
        # A slow target widens its bounds step by step where the profile's budget allows.
        run_plan.bounds_steps = tuple(getattr(target, "bounds_ladder", {}).get(profile.name, ()))
    return run_plan, target


def _shard(args, properties: list[str], profile):
    """``--shard K/N``: this shard's properties, and its profile (only shard 1 replays saved repros)."""
    text = getattr(args, "shard", None)
    if text is None:
        return properties, profile
    from harness.engine.campaign.shard import parse_shard, shard_properties
    try:
        k, n = parse_shard(text, len(properties))
    except ValueError as exc:
        raise UsageError(f"vmfuzz: {exc}") from None
    args.shard = f"{k}/{n}"
    if k > 1:
        profile = dataclasses.replace(profile, replay_repros=False, replay_last_failures=False)
    return shard_properties(properties, k, n), profile


#: ``--bounds`` keys: Bounds fields, and the short names a person types
BOUND_KEYS = {"max_bs": "max_bs", "context": "max_context_len", "max_context_len": "max_context_len",
              "d": "num_draft_tokens", "num_draft_tokens": "num_draft_tokens", "topk": "topk",
              "spec_steps": "spec_steps", "overshoot": "overshoot"}
BOUND_FLOORS = {"num_draft_tokens": 2}


def parse_bounds(text: str, base: Bounds) -> Bounds:
    """``k=v,...`` over ``base``; a bad key or value is one UsageError line."""
    changes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        field = BOUND_KEYS.get(key.strip())
        if field is None or not eq:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {part!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(sorted(BOUND_KEYS))}")
        try:
            n = int(value)
        except ValueError:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {key.strip()} must be an integer, got {value!r}") from None
        if field in changes:  # last-one-wins would silently drop what the user wrote first
            raise UsageError(f"vmfuzz: --bounds {text!r}: {key.strip()} is given more than once")
        floor = BOUND_FLOORS.get(field, 1)
        if n < floor:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {key.strip()} must be at least {floor}, got {n}")
        changes[field] = n
    if not changes:
        raise UsageError(f"vmfuzz: --bounds {text!r}: give at least one KEY=VALUE")
    bounds = dataclasses.replace(base, **changes)
    _check_bounds_limits(text, bounds)
    return bounds


def _check_bounds_limits(text: str, bounds: Bounds) -> None:
    """The limits of harness/model/limits.py hold for searched cases too: a ceiling whose
    largest case would allocate past MAX_BUFFER_CELLS is refused before the search,
    never left to fail with a MemoryError that would read as the target's finding."""
    for field, cap, name in (("num_draft_tokens", limits.MAX_DRAFT_TOKENS, "MAX_DRAFT_TOKENS"),
                             ("topk", limits.MAX_TOPK, "MAX_TOPK"), ("spec_steps", limits.MAX_SPEC_STEPS, "MAX_SPEC_STEPS"),
                             ("max_bs", limits.MAX_SEARCH_REQUESTS, "MAX_SEARCH_REQUESTS")):
        if getattr(bounds, field) > cap:
            raise UsageError(f"vmfuzz: --bounds {text!r}: {field} {getattr(bounds, field)} is over {name} "
                             f"({cap}, harness/model/limits.py)")
    # the largest step a search draws: a FULL_MASK fallback for 2 * max_bs + overshoot
    # requests, every one at the context limit
    d = bounds.num_draft_tokens
    cells = (2 * bounds.max_bs + bounds.overshoot) * d * (bounds.max_context_len + d)
    if cells > limits.MAX_BUFFER_CELLS:
        raise UsageError(f"vmfuzz: --bounds {text!r}: its largest case needs a {cells}-cell buffer, over "
                         f"MAX_BUFFER_CELLS ({limits.MAX_BUFFER_CELLS}, harness/model/limits.py); "
                         "lower max_bs, context or d")


def show_result(res, log, *, verbose: bool = False) -> None:
    """One property's lines, printed as it finishes."""
    if res.out_of_step and not res.findings:
        log(f"  {res.prop:<22} {paint('out of step')}: {res.out_of_step} (could not check; not a finding)")
        return
    if res.not_driven and not res.findings:
        log(f"  {res.prop:<22} {paint('not driven')}: {res.not_driven}")
        return
    from harness.properties import sub_checks_not_driven
    gaps = sub_checks_not_driven(res.prop, res.classes) if not res.findings and not res.unchecked else {}
    status = "FAILED" if res.findings else ("could not check" if res.unchecked else
                                            "held in part" if gaps else "held")
    # cut short: how far it got of the count a full search runs
    count = plural(res.examples, 'example')
    if res.unchecked:
        count = f"{res.examples:,}/{res.planned:,} examples" if res.planned else "not started"
    log(f"  {res.prop:<22} {paint(status, width=7)} {count:>14} {res.seconds:6.1f}s")
    for name, why in gaps.items():
        log(f"      sub-check {name}: {why}")
    if res.classes:
        log("      " + classes_line(res.classes, verbose))
    if res.corpus:
        log(f"      deep boundary corpus: {plural(len(res.corpus), 'case')} first"
            + ("".join(f"\n        {c}" for c in res.corpus) if verbose else " (-v: each)"))
    for f in res.findings:
        log(f"      finding ({f.kind}): {f.detail}")
        log(f"      repro:   {f.path}")


def execute_and_report(plan_, target, gate=None, *, verbose: bool = False) -> int:
    """``gate(outcome) -> dict``: the gate's coverage, computed from what ran, for the reports."""
    from harness.engine.campaign.session import execute
    from harness.report.summary import write_reports
    from harness.report.terminal import gate_line

    budget = f", budget {plan_.time_budget:g}s" if plan_.time_budget else ""
    # a searching profile's count is per round: it searches round after round until its budget is spent
    count = (f"rounds of {plural(plan_.max_examples, 'example')} per property until the budget is spent"
             if plan_.profile.rounds and plan_.time_budget else f"{plural(plan_.max_examples, 'example')} per property")
    print(f"vmfuzz {plan_.command}: target {target.name}, seed {plan_.seed}, profile {plan_.profile.name}, "
          f"{count}{budget}, {plural(plan_.workers, 'worker')}{', isolated' if plan_.isolate else ''}", flush=True)
    outcome = execute(plan_, target, partial(show_result, verbose=verbose))
    from harness.engine.search.deep_corpus import constants_of
    outcome.shape_constants = constants_of(target).source
    if gate is not None:
        outcome.gate = gate(outcome)
        print(gate_line(outcome.gate))
    summary, written = write_reports_somewhere(write_reports, outcome, plan_.report_dir)
    if outcome.deployment:
        _say_deployment(outcome.deployment)
    print(f"reports: {written}/ (summary.json, summary.md, junit.xml, report.html)" if written
          else "reports: none written (see above)")
    return _verdict(plan_, target, outcome, summary, written)


def _out_of_step(outcome) -> bool:
    """Exit 3's one line when a check could not be made: a saved repro that could not be
    replayed (never a pass), or a check vmfuzz is out of step for.

    The gate counts only the out-of-step checks that drive a file the change
    touches (the rest are warnings in its summary); a run counts every one.
    """
    gate = outcome.gate or {}
    stuck = gate["out_of_step"] if "out_of_step" in gate else [why for _, why in outcome.out_of_step]
    for w in gate.get("warnings", []):
        print(f"vmfuzz: warning: {w}", file=sys.stderr)
    unreplayed = [o for o in outcome.replays if o.source == "saved" and o.status == "error"]
    if unreplayed:
        o = unreplayed[0]
        print(f"vmfuzz: could not check: saved repro {o.path} could not be replayed: {o.detail}", file=sys.stderr)
        return True
    if stuck:
        print(out_of_step_line(stuck[0]), file=sys.stderr)
    return bool(stuck)


def _lines_unchecked(outcome) -> bool:
    """The gate's measured lines: a changed line on the mask's path that no property ran,
    a mask-path function never entered, a file this machine cannot run. Each is a line."""
    stuck = (outcome.gate or {}).get("could_not_check") or []
    for line in stuck:
        print(f"vmfuzz: could not check: {line}", file=sys.stderr)
    return bool(stuck)


def _say_deployment(d: dict) -> None:
    print(f"deployment {d['label']}: {'CAN' if d['can_write_out_of_range'] else 'cannot'} "
          f"write out of range: {d['why']}")
    for part in ("routing", "allocation"):
        v = d.get(part)
        if v:
            state = {True: "held", False: "FAILED", None: "not checked"}[v["ok"]]
            print(f"  {part}: {state}: {v['why']}")


def _say_known(plan_, outcome) -> None:
    """Known findings (upstream's defects): listed by every command, failing only with --fail-on-known;
    one whose replay ran and held is said retired, one that fails another way is a finding."""
    from harness.engine.regression.known import DIFFERENT, GONE, REPRODUCES
    for o in outcome.known:
        k = o.entry
        if o.status == GONE:
            print(f"known finding {k.name} no longer reproduces on this SGLang (its replay held; sglang {k.sglang} "
                  "in known/): retire it or narrow its range")
        elif o.status == DIFFERENT:
            print(f"{paint('known finding fails differently', 'FAILED')} {k.name} ({k.repro.property}): "
                  f"{o.detail}\n      repro:   {o.repro}")
        elif o.status == REPRODUCES:
            state = paint("known finding", "FAILED") if plan_.fail_on_known else "known finding"
            print(f"{state} (upstream's to fix, not a new cause): {k.name} ({k.repro.property}): {k.reason}"
                  + (f"\n      repro:   {o.repro}" if o.repro else ""))
        else:
            print(f"known finding {k.name}: its replay could not run ({o.detail})")


def _say_groups(groups: list[dict]) -> None:
    """One block per cause: what it is, which properties saw it, its one minimal repro."""
    for i, g in enumerate(groups, 1):
        head = f"known group ({g['known']})" if g.get("known") else paint("finding group", "FAILED")
        print(f"{head} {i}: {g['signature']} ({plural(g['count'], 'finding')}, "
              f"seen by {', '.join(g['properties'])})")
        print(f"      repro:   {g['repro']} ({g['repro_property']}): {g['detail']}")


def _verdict(plan_, target, outcome, summary: dict, written: Path) -> int:
    if outcome.interrupted:
        from harness.engine.core.signals import exit_code, name
        print(f"vmfuzz: interrupted by {name()} (findings written so far are kept, reports cover what ran)",
              file=sys.stderr)
        return exit_code()
    from harness.report.unchecked import cap_line, unchecked_line
    if cap_line(summary):
        print(cap_line(summary))
    _say_known(plan_, outcome)
    if outcome.failed:
        where = plan_.findings_dir if written == plan_.report_dir else "the repro paths above"
        groups = summary.get("groups", [])
        _say_groups(groups)
        new = [g for g in groups if not g.get("known") or plan_.fail_on_known]
        known = len(groups) - len(new)
        also = f", and {plural(known, 'known group')} (listed above)" if known else ""
        print(f"{paint(plural(len(new), 'finding group'), 'FAILED')} "
              f"({plural(sum(g['count'] for g in new), 'finding')}){also} "
              f"written under {where}; replay a group's repro with: vmfuzz replay FILE")
        return EXIT_FINDING
    if written != plan_.report_dir:
        # the reports are not where CI looks for them (stderr said where, if anywhere): not a pass
        print("vmfuzz: could not check: the reports could not be written to " + str(plan_.report_dir), file=sys.stderr)
        return EXIT_COULD_NOT_CHECK
    if _out_of_step(outcome):
        return EXIT_OUT_OF_STEP
    if _lines_unchecked(outcome):
        return EXIT_COULD_NOT_CHECK
    if outcome.deployment and any((outcome.deployment.get(p) or {}).get("ok") is False
                                  for p in ("routing", "allocation")):
        print(f"the deployment's routing or allocation fails (recorded in {written}/summary.json)")
        return EXIT_FINDING
    known_groups = [g for g in summary.get("groups", []) if g.get("known")]
    if known_groups:
        _say_groups(known_groups)
        print(f"no new finding group; {plural(len(known_groups), 'known group')} listed above "
              "(upstream's to fix; --fail-on-known fails on them)")
    # A property the clock stopped before it was checked (the pr cap, or a budget spent before
    # its search) is never "held", and a run that checked none is never "all 0 held".
    if unchecked_line(summary):
        print(paint(unchecked_line(summary), "could not check"))
        return EXIT_COULD_NOT_CHECK
    undriven = [r.prop for r in outcome.results if r.not_driven]
    if undriven and len(undriven) == len(outcome.results):
        # Nothing was judged: "0 properties held" is not a pass.
        print(f"vmfuzz: could not check: none of the {plural(len(undriven), 'selected property', 'selected properties')} "
              f"could be driven on {target.name} (" + "; ".join(f"{r.prop}: {r.not_driven}" for r in outcome.results)
              + ")", file=sys.stderr)
        return EXIT_COULD_NOT_CHECK
    if undriven:
        held = len(outcome.results) - len(undriven)
        print(f"{plural(held, 'property', 'properties')} {paint('held')}; "
              f"not driven on {target.name}: " + ", ".join(undriven))
    elif len(outcome.results) == 1:
        print(f"{outcome.results[0].prop} {paint('held')}")
    else:
        print(f"all {len(outcome.results)} properties {paint('held')}")
    return EXIT_OK
