"""A changed line inside a statement that ran, which itself never did: the gate's "exercised", line by line.

``diff_coverage`` judges a changed statement by the lines coverage.py saw it run. A statement spanning
lines runs some of them only on some paths: ``None if ids is None else <changed>``, a short-circuited
operand, a call argument of a branch never taken. A changed line there with bytecode of its own must have
run itself, under a property the statement ran under; one with none (a bracket, a folded constant) runs
as its statement runs. Measured: coverage.py records such a line only when it runs
(tests/test_changed_operand.py). Two mutants of a sample passed the gate so (the LoRA ids' padding, the
KV canary's call: bench/mutation-0.5.23/survivors-seed20261207-analysis.md).
"""

from __future__ import annotations


def code_lines(text: str) -> set[int]:
    """The lines holding bytecode of their own (every code object's line table), or none when the text
    does not compile: a line of a multi-line statement with none (a bracket, a folded constant) runs as
    its statement runs."""
    try:
        todo = [compile(text, "<changed>", "exec")]
    except (SyntaxError, ValueError):
        return set()
    out: set[int] = set()
    while todo:
        co = todo.pop()
        out.update(line for _, _, line in co.co_lines() if line is not None)
        todo.extend(c for c in co.co_consts if isinstance(c, type(co)))
    return out


def unrun_lines(props: list[str], own: list[int], contexts, properties) -> list[int]:
    """The changed lines with code of their own that no property the statement ran under ran: a statement
    that ran is not its changed operand that ran (``None if x is None else <changed>``, a short-circuited
    ``and``, a call argument of a branch never taken)."""
    return [n for n in own if not set(props) & set(properties(contexts(n, n)))] if props else []


def ran_around(qual: str, props: list[str], unrun: list[int]) -> str:
    lines = ", ".join(map(str, unrun))
    return (f"{qual + ': ' if qual else ''}the statement starting there ran under {', '.join(props)}, but its "
            f"changed line{'s' if len(unrun) > 1 else ''} {lines} did not (an operand or a branch of an expression "
            "it holds that no example evaluated)")


def settle_operands(out) -> None:
    """After the provoked rule (``provoked_verdict.judge``): a judged statement whose changed line with code of
    its own never ran is could not check, unless that rule set its changed expression, evaluated whole, beside
    the base's and saw them differ (then the change was judged, whichever of its lines ran)."""
    for first, why in out.operands_unrun.items():
        if first not in out.judged or out.rules.get(first, "").startswith("provoked:"):
            continue
        out.judged.pop(first)
        out.rules.pop(first, None)
        out.never_ran.append(first)
        out.why_never[first] = why
    out.never_ran.sort()
