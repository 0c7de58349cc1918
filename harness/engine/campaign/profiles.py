"""The three ways a campaign is run: dev (local), pr (a gate), nightly (a long search).

A profile fixes what a CI maintainer should not have to choose per run: how many
examples, whether the seed is fixed, what is replayed before the search, and
whether the example database is read, written, or left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The pr profile's seed: fixed, so a gate gives the same verdict on a rerun.
PR_SEED = 33127


@dataclass(frozen=True)
class Profile:
    name: str
    max_examples: int  # per property, per round
    time_budget: float | None  # seconds for the whole run, unless --time-budget says otherwise
    fixed_seed: int | None  # None: a fresh random seed, recorded in the report
    replay_repros: bool  # replay every repro/*/*.json first (they must hold on the target)
    database: str  # "none", "read" (replay what CI cached, never write) or "write"
    replay_last_failures: bool  # replay the previous run's findings first
    summary: str
    #: keep searching with fresh seeds until the budget is spent; False: one
    #: fixed search of max_examples per property, the budget only a safety cap whose
    #: reaching is "could not check" (what makes the pr verdict independent of machine speed)
    rounds: bool = True


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("dev", 100, None, None, False, "none", False,
            "fast and local: random seed, no database, no replays"),
    # The cap is only a hang guard: reaching it is "could not check" (exit 3), so it sits far
    # above the gate's measured time (sglang: ~36 s quiet on 2 cores, 8x under it).
    Profile("pr", 200, 300.0, PR_SEED, True, "read", False,
            "deterministic gate (~40 s on 2 cores; 300 s cap, a hang guard: reaching it is exit 3): "
            "replays repro/ and the cached example database, fixed seed",
            rounds=False),
    Profile("nightly", 500, 1800.0, None, False, "write", True,
            "long search: random seed (recorded), persistent example database, last run's failures first"),
)}

DEFAULT_DB_DIR = ".vmfuzz-db"
