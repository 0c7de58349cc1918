"""A run's findings and known findings as summary.json records them, each with its typed origin.

Every reader downstream (compare, merge, junit.xml, the mutation table) matches
on the ``origin`` recorded here and on whether a known entry names it
(``known``), never on the detail's words.
"""

from __future__ import annotations

from vmfuzz.harness.model.known_file import DIFFERENT
from vmfuzz.harness.model.origin import encode


def _known(o) -> dict:
    k = o.entry
    return {"name": k.name, "property": k.repro.property, "sglang": k.sglang, "reason": k.reason,
            "status": o.status, "detail": o.detail, "repro": str(o.repro) if o.repro else str(o.path)}


def finding_record(f, outcome=None) -> dict:
    known = outcome.known_name(f.origin) if outcome is not None and f.origin is not None else None
    return {"property": f.prop, "kind": f.kind, "detail": f.detail, "repro": str(f.path),
            "origin": encode(f.origin) if f.origin is not None else None, "known": known}


def findings_and_known(outcome) -> tuple[list[dict], list[dict]]:
    findings = [finding_record(f, outcome) for r in outcome.results for f in r.findings]
    findings += [finding_record(o.finding, outcome) for o in outcome.replays if o.finding]
    known = [_known(o) for o in getattr(outcome, "known", [])]
    # a known entry whose repro fails another way is a finding of this run (its origin is new): the
    # property's own failure, or the target raising, as its origin says
    findings += [{"property": k["property"], "kind": o.origin.kind(), "repro": k["repro"],
                  "detail": f"known entry {k['name']}'s repro fails differently: {k['detail']}",
                  "origin": encode(o.origin), "known": None}
                 for k, o in zip(known, getattr(outcome, "known", [])) if k["status"] == DIFFERENT]
    return findings, known


def new_groups(outcome) -> int:
    """What fails a run: its groups no known entry names (a known entry's repro that fails
    differently is one of them: vmfuzz.harness.engine.campaign.session)."""
    return sum(g.get("known") is None for g in getattr(outcome, "groups", []))
