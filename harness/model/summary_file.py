"""summary.json's shape, as msgspec structs: the record other tools read.

Two shapes share the file name. ``run`` and ``gate`` write a ``RunSummary`` (a
search: properties, replays, margins, bounds); every other command writes a
``CommandSummary`` (one check per thing it decided). vmfuzz.harness.report.summary
builds each as a dict and passes it through ``conform`` before writing it, so
a key this module does not declare, or a value of the wrong type, is caught
where it is written (and by tests/test_schemas.py) rather than by a reader.

The JSON Schemas shipped in harness/schemas/ are generated from these
structs (scripts/gen_schemas.py); the nested objects whose keys belong to
another part of vmfuzz (the deployment verdict, the gate's change record, the
kernel timing) are typed as objects only.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from vmfuzz.harness.model.origin import Origin


class _Strict(msgspec.Struct, forbid_unknown_fields=True):
    pass


class Finding(_Strict):
    property: str
    kind: str
    detail: str
    repro: str
    #: which failure it is (vmfuzz.harness.model.origin.Origin): what every reader matches on
    origin: Union[Origin, None] = None
    #: the known entry (known/) this finding is, if any: listed, never a new group
    known: Union[str, None] = None


class PropertyResult(_Strict):
    name: str
    status: str
    examples: int
    rounds: int
    seconds: float
    max_margin: Union[float, None]
    classes: dict[str, int]
    bs_over_max_bs: dict[str, int]
    findings: list[Finding]
    #: the examples a search that ran to its end runs (its fixed cases and max_examples a round)
    planned: int = 0
    not_driven: Union[str, None] = None
    out_of_step: Union[str, None] = None
    #: the ledger of the sub-checks the property promises: each "done", or why no case judged it
    sub_checks: dict[str, str] = {}
    #: the deep boundary corpus's cases this property ran before its search, and their time
    deep_cases: list[str] = []
    deep_seconds: float = 0.0
    #: seconds spent at each bound step of a stepped (nightly) search, widest last
    seconds_by_bound_step: list[float] = []
    #: the shared run (``shared:A,B,...``) this property was judged on: ``seconds`` is its
    #: share of that run; the run's time is the sum of its members' seconds
    shared_run: Union[str, None] = None


class FindingGroup(_Strict):
    """One cause: the findings whose origins name it, and the one repro to start from.

    ``key`` (the origin's cause, fields joined) is what compare and merge match
    groups on; ``signature`` is the same cause in words."""

    signature: str
    count: int
    properties: list[str]
    repro: str
    repro_property: str
    detail: str
    server_valid: bool
    members: list[str]
    key: str = ""
    origin: Union[Origin, None] = None
    known: Union[str, None] = None
    #: a new group one known entry names in part: that entry, and the causes it leaves new (labels)
    partly_known: Union[str, None] = None
    not_known: list[str] = []


class DeepCorpus(_Strict):
    """The production-shape cases run before the search, and where their sizes came from."""

    cases: list[str]
    runs: int
    seconds: float
    sized_from: str


class Replay(_Strict):
    repro: str
    property: str
    recorded_target: str
    source: str
    status: str
    detail: Union[str, None]
    still_fails_on_recorded: Union[bool, None]
    finding: Union[str, None]


class KnownFinding(_Strict):
    name: str
    property: str
    sglang: str
    reason: str
    status: str
    detail: str
    repro: str


class RunCounts(_Strict):
    properties: int
    held: int
    failed: int
    skipped: int
    not_driven: int
    out_of_step: int
    examples: int
    replays: int
    replays_failed: int
    findings: int
    known: int
    groups: int = 0
    #: groups no known entry names, plus known entries that now fail differently: what fails a run
    new_groups: int = 0
    #: what the run could not check (exit 3, never held): properties the time cap (pr) or budget stopped,
    #: the gate's changed lines no property could judge, saved repros that could not be replayed
    could_not_check: int = 0
    #: properties that held with a promised sub-check no case judged (exit 3; not in ``held``)
    held_in_part: int = 0
    #: properties whose search lane died before they were checked (exit 3)
    lane_lost: int = 0


class VerdictRecord(_Strict):
    """The run's one verdict (``vmfuzz.harness.model.verdict.Verdict``): every report and the exit code read it."""

    #: one of ``vmfuzz.harness.model.verdict.Kind``'s values
    kind: str
    exit_code: int
    #: the words every report opens with ("could not check" for every exit 3)
    headline: str
    #: why, in one line ("" for a plain pass)
    why: str


class Timings(_Strict):
    replay_seconds: float
    search_seconds: float
    total_seconds: float


class TimeCap(_Strict):
    """A fixed-count profile's (pr) wall-clock cap: a hang guard; reaching it is could not check."""

    cap_seconds: float
    used_seconds: float
    reached: bool


class RunSummary(_Strict):
    """summary.json of ``run`` and ``gate``."""

    command: str
    target: str
    profile: str
    interrupted: bool
    seed: Union[int, None]
    max_examples: Union[int, None]
    time_budget: Union[float, None]
    workers: int
    isolation: bool
    device: Union[str, None]
    versions: dict[str, Any]
    started: str
    counts: RunCounts
    properties: list[PropertyResult]
    boundary_classes: dict[str, int]
    overflow_margin: dict[str, int]
    overflow_margin_by_path: dict[str, dict[str, int]]
    findings: list[Finding]
    replays: list[Replay]
    known_findings: list[KnownFinding]
    deployment: Union[dict[str, Any], None]
    gate: Union[dict[str, Any], None]
    timings: Timings
    bounds: list[dict[str, Any]]
    reached: dict[str, int]
    kernel: Union[dict[str, Any], None]
    warnings: list[str]
    groups: list[FindingGroup] = []
    deep_boundary_corpus: Union[DeepCorpus, None] = None
    #: "K/N" when this run is one shard of a run split over N (``--shard``); None otherwise
    shard: Union[str, None] = None
    #: the properties the run was asked for, before ``--shard`` split them (its ``properties`` are this
    #: shard's); None in a summary from a vmfuzz that did not record it
    selection: Union[list[str], None] = None
    #: ``vmfuzz merge``: the shards this summary joins
    shards: list[Union[str, None]] = []
    #: a nightly's records of its last nights (the database's history file), this one last
    history: list[dict[str, Any]] = []
    #: known findings fail the run too (``--fail-on-known``)
    fail_on_known: bool = False
    #: the pr profile's cap and how close the run came to it; None where a budget bounds the search
    time_cap: Union[TimeCap, None] = None
    #: could-not-check lines for work no property's result carries that the run did not finish: what a
    #: gate's time cap stopped, a known entry whose replay never ended (exit 3)
    unfinished: list[str] = []
    #: the run's verdict, decided once before any report was written; None only in a summary from an
    #: older vmfuzz (readers then decide it from the summary: ``vmfuzz.harness.report.decide``)
    verdict: Union[VerdictRecord, None] = None


class Check(_Strict):
    name: str
    status: str
    detail: str
    kind: str
    repro: Union[str, None]
    seconds: float
    origin: Union[Origin, None] = None


class CommandCounts(_Strict):
    checks: int
    held: int
    caught: int
    failed: int
    skipped: int
    error: int
    findings: int
    known: int = 0


class CommandSummary(msgspec.Struct):
    """summary.json of every other command. Unknown keys are allowed: each command
    adds its own record beside the checks (bisect's revisions, surface's rows)."""

    command: str
    target: str
    started: str
    verdict: str
    headline: str
    counts: CommandCounts
    checks: list[Check]
    seconds: float
    #: a ``run`` or ``gate`` that ended before its search (its code under test did not load): its
    #: verdict's kind (``vmfuzz.harness.model.verdict.Kind``) and exit code, as a search's ``verdict`` has them
    verdict_kind: Union[str, None] = None
    exit_code: Union[int, None] = None


class SummaryError(Exception):
    """A summary vmfuzz built that does not have summary.json's declared shape: a harness bug."""


def conform(summary: dict, shape: type) -> None:
    """Raise SummaryError unless ``summary`` converts to ``shape`` exactly (no coercion)."""
    try:
        msgspec.convert(summary, shape, strict=True)
    except msgspec.ValidationError as exc:
        raise SummaryError(f"summary.json does not match {shape.__name__}: {exc}") from None


def shared_runs(props: list[dict]) -> dict[str, list[dict]]:
    """The shared runs of a summary's properties (``shared_run``), each with its members in order."""
    runs: dict[str, list[dict]] = {}
    for p in props:
        if p.get("shared_run"):
            runs.setdefault(p["shared_run"], []).append(p)
    return runs
