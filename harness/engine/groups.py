"""One finding per cause: findings grouped by a signature of what went wrong.

A single planted regression fails many properties at once (the same
too-small buffer is an out-of-bounds write to one, a short fallback region to
another, an unsound ``fits`` to a third). Shown one by one they read as many
bugs; grouped by where the damage lands they read as the one cause they are.

The signature is built from facts of the failure, not from which property
saw it:

- an overrun (a redzone touched, or a buffer too small for what it must
  hold): the buffer and the side it was overrun on (below / above);
- a wrong answer: the first differing cell's class (which field, and for the
  mask which kind of cell: a prefix column, a tree cell that should be
  visible or hidden, padding past the batch);
- a raise: the exception's type and the innermost frame of the code under test.

Anything else keeps its property and its detail with the numbers taken out, so
two unrelated failures never share a group by accident.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from harness.engine.results import Finding

_REDZONE = re.compile(r"(\w+): \d+ cell\(s\) written at offsets \[(-?\d+), -?\d+\) outside its \d+ cells "
                      r"\((front|back|beyond) redzone")
#: a buffer smaller than the cells its batch needs: the writes would land past its end
_TOO_SMALL = (re.compile(r"tree_mask holds \d+ cells, the batch's logical region needs \d+"),
              re.compile(r"the verify step's mask holds \d+ cells"),
              re.compile(r"fits\(\d+\) is True for a \d+-cell"),
              re.compile(r"mask admits \d+ requests, which need \d+ cells"),
              re.compile(r"run captured but the mask was sized for fewer"),
              re.compile(r"FULL_MASK row was sized for"),
              re.compile(r"the mask was sized for \d+"),
              re.compile(r"host-side check let a \d+-byte packed mask into"))
_MASK_CELL = re.compile(r"tree_mask differs at \d+ cell\(s\), first at cell (\d+) \(request (?:\d+|None)\): "
                        r"(\d+) vs (\d+)")
_FIELD = re.compile(r"\b(positions|retrieve_index|retrieve_next_token|retrieve_next_sibling) differs")
_RAISED = re.compile(r"target raised (\w[\w.]*)")
_STEP = re.compile(r"\bstep (\d+) of \d+")
#: a bit-packed mask byte unlike the mask's bits (the packing, not the mask)
_PACKED = re.compile(r"packed byte \d+ .* is 0b[01]+, the mask's bits")


def _side(side: str) -> str:
    return "below" if side == "front" else "above"


def raise_place(exc: BaseException | None) -> str | None:
    """``file:function`` of the innermost frame outside vmfuzz (the code under test raised there)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tb, place = getattr(exc, "__traceback__", None), None
    while tb is not None:
        path = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not path.startswith(here + os.sep) and "hypothesis" not in path:
            parts = path.split(os.sep)
            place = f"{'/'.join(parts[-2:])}:{tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return place


def cell_class(finding: Finding, cell: int, got: int, want: int) -> str:
    """What kind of mask cell ``cell`` is: in the step the detail names ("step K of N"),
    else in the first step whose region holds it."""
    from harness.model.layouts import TreeMaskMode, block_start, logical_size, row_stride
    config = finding.config
    named = _STEP.search(finding.detail)
    steps = finding.batches
    if named and int(named.group(1)) < len(steps):
        steps = [steps[int(named.group(1))]]
    for batch in steps:
        if cell >= logical_size(config.mode, batch.seq_lens, config.d):
            continue
        prefix = 0
        for b, s in enumerate(batch.seq_lens):
            start = block_start(config.mode, prefix, b, config.d)
            stride = row_stride(config.mode, s, config.d)
            if start <= cell < start + config.d * stride:
                if config.mode == TreeMaskMode.FULL_MASK and (cell - start) % stride < s:
                    return "prefix column"
                return "tree cell that should be " + ("visible" if want else "hidden")
            prefix += s
    return "padding past the batch's region"


def signature(finding: Finding) -> str:
    """The cause a finding is grouped under (see the module's docstring)."""
    if finding.kind != "property":
        return finding.kind  # a crash or a hang: the worker died, no frame to name
    detail = finding.detail
    raised = _RAISED.search(detail)  # anywhere: a saved repro's replay says "fails again: target raised ..."
    if raised:
        place = getattr(finding, "place", None)
        return f"raise {raised.group(1)}" + (f" at {place}" if place else "")
    hit = _REDZONE.search(detail)
    if hit:
        return f"overrun {hit.group(1)} {_side(hit.group(3))}"
    if any(p.search(detail) for p in _TOO_SMALL):
        return "overrun tree_mask above"
    cell = _MASK_CELL.search(detail)
    if cell:
        return "wrong tree_mask: " + cell_class(finding, int(cell.group(1)), int(cell.group(2)),
                                                int(cell.group(3)))
    other = _FIELD.search(detail)
    if other:
        return f"wrong {other.group(1)}"
    if _PACKED.search(detail):
        return "wrong packed_mask byte"
    # the first clause, numbers left out: the same wording with other sizes is the same cause
    head = re.split(r": | \(", detail, maxsplit=1)[0].strip()
    return f"{finding.prop}: " + re.sub(r"-?\d+", "N", head)[:80]


def case_size(finding: Finding) -> tuple:
    """Smaller is simpler: fewer steps and requests, shorter contexts, smaller trees."""
    c, steps = finding.config, finding.batches
    return (len(steps), sum(b.bs for b in steps), sum(sum(b.seq_lens) for b in steps), c.max_bs,
            c.max_context_len, c.num_draft_tokens, c.topk, c.spec_steps, str(finding.path))


@dataclass
class FindingGroup:
    signature: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def properties(self) -> list[str]:
        return sorted({f.prop for f in self.findings})

    @property
    def repro(self) -> Finding:
        """The smallest member whose config a server could have (any member if none can)."""
        from harness.model.validate import server_problem
        valid = [f for f in self.findings if server_problem(f.config) is None]
        return min(valid or self.findings, key=case_size)

    def as_dict(self) -> dict:
        from harness.model.validate import server_problem
        r = self.repro
        return {"signature": self.signature, "count": len(self.findings), "properties": self.properties,
                "repro": str(r.path), "repro_property": r.prop, "detail": r.detail,
                "server_valid": server_problem(r.config) is None,
                "members": [str(f.path) for f in self.findings]}


def group_findings(findings: list[Finding]) -> list[FindingGroup]:
    """Groups in order of first appearance (the order the run found them)."""
    groups: dict[str, FindingGroup] = {}
    for f in findings:
        groups.setdefault(signature(f), FindingGroup(signature(f))).findings.append(f)
    return list(groups.values())
