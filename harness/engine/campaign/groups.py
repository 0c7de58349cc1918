"""One finding per cause: findings grouped by their typed origin (vmfuzz.harness.model.origin).

A single planted regression fails many properties at once (the same
too-small buffer is an out-of-bounds write to one, a short fallback region to
another, an unsound ``fits`` to a third). Shown one by one they read as many
bugs; grouped by the cause their origins name they read as the one cause they are.

The group key is ``Origin.cause()``: what was damaged and how (an overrun's
writer, buffer, side and whose cells the stray write were; a wrong output's
writer, buffer and cell class; a raise's type and innermost frame of the code
under test), never which step showed it and never the message's words.

One more rule joins causes: a wrong output of a writer that, in the same set
of findings, also overran that very buffer is the same misplaced write seen
from the other side (a row written one block too far lands in the wrong cells
*and* past the end), so it joins the overrun's group. Two overruns of one
buffer by different writers, or on different sides, or of a different
request class, stay two groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vmfuzz.harness.engine.search.results import Finding
from vmfuzz.harness.model.origin import Origin, key_text


def signature(finding: Finding) -> str:
    """The cause a finding is grouped under, in words (the group's title)."""
    return finding.origin.label()


def case_size(finding: Finding) -> tuple:
    """Smaller is simpler: fewer steps and requests, shorter contexts, smaller trees."""
    c, steps = finding.config, finding.batches
    if c is None:  # a worker that died outside any check: no case, the largest of all
        return (float("inf"),) * 8 + (str(finding.path),)
    return (len(steps), sum(b.bs for b in steps), sum(sum(b.seq_lens) for b in steps), c.max_bs,
            c.max_context_len, c.num_draft_tokens, c.topk, c.spec_steps, str(finding.path))


@dataclass
class FindingGroup:
    #: the cause's origin: the first finding whose own cause is the group's (its words are the title)
    origin: Origin
    findings: list[Finding] = field(default_factory=list)

    @property
    def signature(self) -> str:
        return self.origin.label()

    @property
    def key(self) -> str:
        return key_text(self.origin.cause())

    @property
    def properties(self) -> list[str]:
        return sorted({f.prop for f in self.findings})

    @property
    def repro(self) -> Finding:
        """The smallest member whose config a server could have (any member if none can)."""
        from vmfuzz.harness.model.validate import server_problem
        valid = [f for f in self.findings if f.config is not None and server_problem(f.config) is None]
        return min(valid or self.findings, key=case_size)

    def known_as(self, known_name) -> str | None:
        """The known entry naming every member (``known_name(finding)``); None when any member is not
        that entry's cause: a wrong output folded into a known overrun's group is still new."""
        names = {known_name(f) for f in self.findings}
        return names.pop() if len(names) == 1 and None not in names else None

    def as_dict(self) -> dict:
        from vmfuzz.harness.model.origin import encode
        from vmfuzz.harness.model.validate import server_problem
        r = self.repro
        return {"signature": self.signature, "key": self.key, "count": len(self.findings),
                "properties": self.properties, "origin": encode(self.origin),
                "repro": str(r.path), "repro_property": r.prop, "detail": r.detail,
                "server_valid": r.config is not None and server_problem(r.config) is None,
                "members": [str(f.path) for f in self.findings]}


def group_findings(findings: list[Finding]) -> list[FindingGroup]:
    """Groups in order of first appearance (the order the run found them)."""
    groups: dict[tuple, FindingGroup] = {}
    overruns = {(f.origin.writer, f.origin.buffer): f.origin.cause() for f in findings
                if f.origin.effect == "overrun" and f.origin.buffer}
    for f in findings:
        o = f.origin
        cause = o.cause()
        if o.effect == "wrong" and (o.writer, o.buffer) in overruns:
            cause = overruns[(o.writer, o.buffer)]  # the same misplaced write, seen as wrong cells
        if cause not in groups:
            groups[cause] = FindingGroup(next(g for g in findings if g.origin.cause() == cause).origin)
        groups[cause].findings.append(f)
    return list(groups.values())
