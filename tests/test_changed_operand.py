"""A changed operand the statement around it ran without: not judged (the gate's "exercised").

A mutation sample (bench/mutation-0.5.23/survivors-seed20261207-analysis.md) left two mutants green whose
changed line sat inside a statement that ran while the line itself never did: the LoRA ids' padding in the
``else`` of ``None if forward_batch.lora_ids is None else ...`` (no server vmfuzz builds serves LoRA), and
the KV canary's call in the ``if`` of ``c.with_...(0) if (c := ...canary_manager) is not None else
nullcontext()`` (the canary is off). The gate judged a changed statement by any of its lines, so both read
as judged. A changed line with bytecode of its own must now have run itself; one with none (a bracket, a
folded constant) runs as its statement runs.
"""

from __future__ import annotations

from vmfuzz.harness.engine.campaign.diff_coverage import measure
from vmfuzz.harness.engine.campaign.operand_lines import code_lines, settle_operands

TEXT = """def pad(ids, bs):
    return dict(
        a=1,
        lora=(
            None
            if ids is None
            else ids + [None] * (bs - len(ids))
        ),
        b=(2 +
           3),
    )
"""
#: what coverage.py records for pad(None, 3): the else operand (line 7) never runs
RAN_WITHOUT_IDS = {n: {"graph-replay-equivalence"} for n in (1, 2, 3, 5, 6, 9)}


def test_a_changed_operand_no_example_evaluated_is_could_not_check():
    m = measure("p.py", TEXT, "/x/p.py", frozenset({7}), {}, RAN_WITHOUT_IDS)
    settle_operands(m)
    assert m.never_ran == [2] and not m.judged and not m.exercised
    assert "changed line 7 did not" in m.why_never[2] and "graph-replay-equivalence" in m.why_never[2]


def test_the_provoked_rule_keeps_an_expression_it_saw_differ():
    """The provoked rule evaluates a side-effect-free changed expression whole, beside the base's: where it
    saw them differ, the change was judged, whichever of its lines ran."""
    m = measure("p.py", TEXT, "/x/p.py", frozenset({7}), {}, RAN_WITHOUT_IDS)
    m.rules[2] = "provoked: `x` differed on 1 of 1 evaluation(s) under graph-replay-equivalence"
    settle_operands(m)
    assert m.judged == {2: ["graph-replay-equivalence"]} and not m.never_ran


def test_the_operand_once_evaluated_is_judged():
    ran = {**RAN_WITHOUT_IDS, 7: {"graph-replay-equivalence"}}
    m = measure("p.py", TEXT, "/x/p.py", frozenset({7}), {}, ran)
    settle_operands(m)
    assert m.judged == {2: ["graph-replay-equivalence"]} and not m.never_ran


def test_a_changed_line_with_no_code_of_its_own_runs_with_its_statement():
    assert 10 not in code_lines(TEXT) and 7 in code_lines(TEXT)  # 2 + 3 is folded onto line 9
    m = measure("p.py", TEXT, "/x/p.py", frozenset({10}), {}, RAN_WITHOUT_IDS)
    settle_operands(m)
    assert m.judged == {2: ["graph-replay-equivalence"]}


def test_coverage_records_the_operand_line_only_when_it_runs(tmp_path):
    """What the rule reads, measured: coverage.py's raw lines name line 7 only when the else is taken."""
    import importlib.util
    import sys

    import coverage
    path = tmp_path / "pad_mod.py"
    path.write_text(TEXT)
    spec = importlib.util.spec_from_file_location("pad_mod", path)
    module = importlib.util.module_from_spec(spec)
    seen = []
    for ids in (None, [1]):
        cov = coverage.Coverage(data_file=None, include=[str(path)])
        cov.start()
        try:
            if ids is None:
                spec.loader.exec_module(module)
            module.pad(ids, 3)
        finally:
            cov.stop()
        seen.append(7 in set(cov.get_data().lines(str(path)) or []))
    sys.modules.pop("pad_mod", None)
    assert seen == [False, True]
