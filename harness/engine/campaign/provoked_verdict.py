"""The gate's verdict on each probed line: provoked, not provoked (exit 3), or judged by the older rule.

``campaign.provoked`` plans which changed expressions are set beside the base's and
``core.provoke`` counts, per property, how often each was evaluated and how often it
differed; this module reads those counts into the measured file's lines, and says
what would provoke a line no example did, where that is known.
"""

from __future__ import annotations

import ast

from vmfuzz.harness.engine.campaign.provoked import Probe

#: What would provoke an expression, by a name it reads: the inputs the gate's strategies do not make.
PROVOKERS = (
    ("multimodal_inputs", "a batch mixing requests with and without multimodal inputs"),
    ("mm_input", "a batch mixing requests with and without multimodal inputs"),
    ("is_cuda", "CUDA `seq_lens` (a GPU run)"),
    ("_is_cuda", "a CUDA device (a GPU run)"),
    ("_is_hip", "a ROCm device"),
    ("mrope", "an M-RoPE model"),
)


def described(probe: Probe) -> str:
    """The change in a reviewer's words: the guard or operands deleted or added, or both spellings."""
    if probe.kind == "guard":
        what = "its guard" if probe.head.startswith("True") else "the block it guarded"
        return f"`if {probe.base}:` with {what} deleted"
    try:
        head, base = (ast.parse(t, mode="eval").body for t in (probe.head, probe.base))
    except SyntaxError:
        return f"`{probe.head}` (the base's: `{probe.base}`)"
    if isinstance(head, ast.BoolOp) and isinstance(base, ast.BoolOp) and type(head.op) is type(base.op):
        hs, bs = [ast.unparse(v) for v in head.values], [ast.unparse(v) for v in base.values]
        gone, new = [v for v in bs if v not in hs], [v for v in hs if v not in bs]
        if gone and not new:
            return f"`{probe.base}` with its operand {', '.join(f'`{v}`' for v in gone)} deleted"
        if new and not gone:
            return f"`{probe.base}` with the operand {', '.join(f'`{v}`' for v in new)} added"
        if len(gone) == len(new) == 1:
            return f"`{probe.base}` with its operand `{gone[0]}` made `{new[0]}`"
    return f"`{probe.head}` (the base's: `{probe.base}`)"


def provoker(probe: Probe) -> str:
    """What input would make the head's expression give other than the base's, where that is known."""
    text = f"{probe.head} {probe.base}"
    hint = next((why for name, why in PROVOKERS if name in text), "")
    if probe.kind == "guard":  # the head's side is a constant: the base's test must come out the other way
        want = "false" if probe.head.startswith("True") else "true"
        return f"an example on which `{probe.base}` is {want}" + (f" ({hint})" if hint else "")
    return hint or f"an example on which `{probe.base}` is not what `{probe.head}` is"


def judge(measured, probes: list[Probe], counts: dict) -> None:
    """Moves each judged line whose changed expression no example provoked to ``unprovoked`` (exit 3), and
    says for every judged line which rule judged it (``measured.rules``)."""
    for p in probes:
        lines = [n for n in p.lines if n in measured.judged]
        if not lines:
            continue
        row = counts.get(p.ident) or {}
        by = {prop: c for prop, c in (row.get("by") or {}).items() if prop}  # under a property's check only
        evaluated, differed, raised = (sum(c[i] for c in by.values()) for i in range(3))
        said = described(p)
        reached = "reached, and its outputs compared by a property"
        unprovoked = ""
        if p.unsafe:
            rule = f"{reached}: the base's `{p.base}` is not evaluated beside it ({p.unsafe})"
        elif not row.get("installed"):
            rule = f"{reached}: {said} {row.get('why') or 'could not be probed'}"
        elif differed:
            who = sorted(prop for prop, c in by.items() if c[1])
            rule = f"provoked: {said} differed on {differed} of {evaluated} evaluation(s) under {', '.join(who)}"
        elif evaluated and raised == evaluated:
            rule = f"{reached}: the base's `{p.base}` cannot be evaluated here ({row.get('sample')})"
        else:
            ran = f"evaluated {evaluated} time(s), equal to the base's each time" if evaluated else \
                "never evaluated under a property"
            rule = unprovoked = f"{said} {ran}; what would provoke it: {provoker(p)}"
        for n in lines:
            if unprovoked:
                measured.judged.pop(n, None)
                measured.rules.pop(n, None)
                measured.unprovoked.append(n)
                measured.why_unprovoked[n] = unprovoked
            else:
                measured.rules[n] = rule
    measured.unprovoked.sort()
    for n in measured.judged:
        measured.rules.setdefault(n, "reached, and its outputs compared by a property: no changed expression "
                                     "of it can be set beside the base's")
