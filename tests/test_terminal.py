"""What the terminal shows: plurals, colour only on a terminal, the short classes line."""

from __future__ import annotations

import io
import json

import pytest

from vmfuzz.harness.report import terminal
from vmfuzz.harness.report.terminal import classes_line
from tests.helpers import vmfuzz


def test_plural():
    assert terminal.plural(1, "example") == "1 example"
    assert terminal.plural(2, "example") == "2 examples"
    assert terminal.plural(1, "property", "properties") == "1 property"
    assert terminal.plural(1200, "example") == "1,200 examples"


def test_colour_only_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr("sys.stdout", Tty())
    assert terminal.paint("held") == "\033[32mheld\033[0m"
    assert terminal.paint("FAILED", width=8).startswith("\033[1;31mFAILED\033[0m  ")
    monkeypatch.setenv("NO_COLOR", "1")
    assert terminal.paint("held") == "held"
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("CI", "true")
    assert terminal.paint("FAILED", width=7) == "FAILED "


def test_classes_line_is_short_unless_verbose():
    classes = {"path reuse": 40, "path fallback": 12, "layout FULL_MASK": 30, "layout QLEN_ONLY": 22,
               "bs = max_bs+1": 9, "seq_len 0": 4, "tree with unselected parent": 2}
    short = classes_line(classes)
    assert short == "classes: 7 classes reached; reuse 40, fallback 12; FULL_MASK/QLEN_ONLY (-v: every class)"
    full = classes_line(classes, verbose=True)
    assert all(f"{k} ({v})" in full for k, v in classes.items())


def test_run_output_under_ci_is_plain_and_counts_right(tmp_path):
    r = vmfuzz("run", "--seed", "1", "--max-examples", "1", "--property", "capacity-liveness",
               "--report-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "\033[" not in r.stdout
    assert "1 example per property, 1 worker" in r.stdout
    assert "capacity-liveness held" in r.stdout and "1 properties" not in r.stdout


def test_a_nightly_s_header_says_its_count_is_per_round_until_the_budget_is_spent(tmp_path):
    """A nightly searches round after round: "500 examples per property" would promise a count it never
    stops at (and a short budget may not reach)."""
    r = vmfuzz("run", "--profile", "nightly", "--time-budget", "2", "--property", "capacity-liveness",
               "--db", str(tmp_path / "db"), "--report-dir", str(tmp_path / "r"))
    assert r.returncode in (0, 3), r.stderr
    assert "rounds of 500 examples per property until the budget is spent, budget 2s" in r.stdout, r.stdout


def test_a_run_whose_budget_ran_out_never_says_all_held(tmp_path):
    """The pr profile's budget is a safety cap: a property it stops short of its fixed count
    could not be checked (exit 3), and the last line names it instead of counting it held."""
    proc = vmfuzz("run", "--profile", "pr", "--time-budget", "1", "--report-dir", str(tmp_path / "r"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert "all " not in last and last.startswith("could not check: the time cap of 1 s was reached"), last
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    cut = [p["name"] for p in summary["properties"] if p["status"] == "could not check"]
    assert cut and all(name in last for name in cut), (cut, last)


def test_a_budgeted_bar_counts_down_the_budget_not_a_guessed_total_of_examples():
    from vmfuzz.harness.report import progress as pg
    assert pg.budget_left(60, started=100.0, now=115.0) == 45.0 and pg.budget_left(60, 100.0, 200.0) == 0.0
    bar = pg.BarProgress(3, "x", per_slot=400, budget=60)
    try:
        bar.started -= 15  # a quarter of the budget spent
        bar.example()
        task = bar.bar.tasks[0]
        assert task.total == 60 and 14.5 <= task.completed <= 16 and task.fields["examples"] == 1
        eta = str(pg._BudgetLeft(bar).render(task))
        assert eta.startswith("ETA 0:00:4") and eta.endswith("(budget)"), eta
        bar.advance()  # a property ending early does not jump the bar to a slot's end
        assert bar.bar.tasks[0].completed < 17
    finally:
        bar.close()
    plain = pg.BarProgress(3, "x", per_slot=400)  # no budget: counted in examples, as before
    try:
        plain.example()
        assert plain.bar.tasks[0].total == 1200 and plain.bar.tasks[0].completed == 1
    finally:
        plain.close()


def test_a_staged_search_says_each_property_the_moment_it_is_final(monkeypatch, tmp_path):
    """A nightly widens the bounds in steps; a property that fails in the first step
    (or is not driven) is not searched again, so its line must not wait for the last."""
    from types import SimpleNamespace

    from vmfuzz.harness.engine.campaign import session
    from vmfuzz.harness.engine.search.results import Finding, PropertyResult
    from vmfuzz.harness.model.origin import Origin

    said, steps_run = [], []

    def campaign(target, *, bounds, properties, on_result, **_):
        steps_run.append((bounds, list(properties)))
        for name in properties:
            res = PropertyResult(name, examples=5, rounds=1)
            if name == "no-oob-write":
                res.finding = Finding(name, "out-of-bounds write", tmp_path / "r.json", None, [], origin=Origin(name, "overrun"))
            on_result(res)

    monkeypatch.setattr(session, "run_campaign", campaign)
    names = ["no-oob-write", "capacity-liveness", "routing"]
    plan = SimpleNamespace(bounds_steps=("narrow", "middle", "wide"), bounds=None, seed=1, max_examples=5,
                           findings_dir=tmp_path, device="cpu", profile=SimpleNamespace(database=None, rounds=True),
                           db_dir=None, db_url=None, share=True, properties=names)
    outcome = SimpleNamespace(bounds_used=[], results=[])
    monkeypatch.setattr("dataclasses.asdict", lambda b: {"step": b})  # the steps here are names, not Bounds
    monkeypatch.setattr(session, "database_for", lambda *a: None)

    def done(res):
        said.append((res.prop, len(steps_run), res.examples))
        outcome.results.append(res)

    session._staged(plan, None, outcome, None, None, None, done, names)
    # the failing property is said during the first step; the others after the last, summed over the steps
    assert said[0] == ("no-oob-write", 1, 5)
    assert sorted(said[1:]) == [("capacity-liveness", 3, 15), ("routing", 3, 15)]
    assert [b for b, _ in steps_run] == ["narrow", "middle", "wide"] and "no-oob-write" not in steps_run[1][1]
    assert [r.prop for r in outcome.results] == names  # the summary keeps the plan's order


def test_bisect_says_each_revision_while_the_search_runs(tmp_path):
    """git bisect run prints only at its end: each verdict is said as the step logs it."""
    import json
    import time

    from vmfuzz.harness.engine.regression import bisect

    log = tmp_path / "steps.jsonl"
    script = "; ".join(f"echo '{json.dumps({'commit': c * 40, 'verdict': v, 'detail': 'held'})}' >> {log}; sleep 1.5"
                       for c, v in (("a", "good"), ("b", "bad")))
    said = []
    monkey = bisect._subject
    bisect._subject = lambda repo, sha: "subject"
    try:
        tail = bisect._Tail(log, tmp_path, lambda line: said.append((time.monotonic(), line)))
        t0 = time.monotonic()
        bisect._run_group(["bash", "-c", script], tmp_path, {"PATH": "/usr/bin:/bin"}, poll=tail)
        ended = time.monotonic()
    finally:
        bisect._subject = monkey
    assert [ln for _, ln in said] == [f"  {'a' * 12} good subject: held", f"  {'b' * 12} bad  subject: held"]
    assert said[0][0] - t0 < 1.4 and ended - said[0][0] > 1.0  # the first was said long before the end


def test_ci_output_has_a_heartbeat_at_least_every_15_seconds_of_silence():
    """Driven by an injected clock: a line when 15 s passed with nothing said, naming the bound
    step, the property, the examples done and the time elapsed; a line said resets it."""
    from vmfuzz.harness.report.progress import HEARTBEAT_S, Heartbeat
    now = [100.0]
    said = []
    beat = Heartbeat(said.append, budget=3600, clock=lambda: now[0])
    beat.step, beat.searching, beat.examples = "bound step 3/3", "routing", 41
    for t in (105.0, 114.9):
        now[0] = t
        assert beat.tick() is None
    now[0] = 100.0 + HEARTBEAT_S
    assert beat.tick() == said[-1]
    assert said == ["  heartbeat: bound step 3/3, routing, 41 examples, budget left 59m45s, 15s elapsed"]
    now[0] = 125.0
    beat.heard()  # a property's line was printed at 125 s
    for t in (130.0, 139.0):
        assert beat.tick(t) is None
    assert beat.tick(140.0) and len(said) == 2 and said[-1].endswith("40s elapsed")
    # a fixed count (the pr profile): the share of it done, and the ETA that gives
    from vmfuzz.harness.report.progress import FixedCount
    count = FixedCount(12, 30, clock=lambda: 0.0)
    fixed = Heartbeat(said.append, fixed=count, clock=lambda: 0.0)
    count.searching(["a", "b", "c"])
    for _ in range(30):  # a shared run of three: 90 of the 360 property-examples
        count.example()
        fixed.examples += 1
    # the rest at this search's measured rate (1 s per three property-examples)
    assert fixed.line(30.0).endswith("30 examples, 25% of the fixed count, ETA 1m30s, 30s elapsed")
    for _ in range(20):  # its boundary cases on top of its count: counted, the total stretched
        count.example()
    assert count.done == 150 and count.total == 420


def test_a_stepped_nightly_under_ci_tells_the_heartbeat_its_step_and_property(monkeypatch, tmp_path):
    """The session says each bound step and each search to the progress, and the examples counted."""
    from types import SimpleNamespace

    from vmfuzz.harness.engine.campaign import session
    from vmfuzz.harness.engine.search.results import PropertyResult
    from vmfuzz.harness.report.progress import LineProgress

    monkeypatch.setenv("CI", "true")
    ui = LineProgress(2, "x", per_slot=5, budget=60, heartbeat=True)
    ui.heart.stop()  # ticked here by hand, never by the thread
    lines = []
    ui.heart.say = lines.append

    def campaign(target, *, bounds, properties, on_result, on_example, on_slot, **_):
        for name in properties:
            on_slot([name])
            on_example()
            lines.append(ui.heart.line(ui.heart.started + 20))
            on_result(PropertyResult(name, examples=1, rounds=1))

    monkeypatch.setattr(session, "run_campaign", campaign)
    names = ["capacity-liveness", "routing"]
    plan = SimpleNamespace(bounds_steps=("narrow", "wide"), bounds=None, seed=1, max_examples=5,
                           findings_dir=tmp_path, device="cpu", profile=SimpleNamespace(database=None, rounds=True),
                           db_dir=None, db_url=None, share=True, properties=names)
    outcome = SimpleNamespace(bounds_used=[], results=[])
    monkeypatch.setattr("dataclasses.asdict", lambda b: {"step": b})
    monkeypatch.setattr(session, "database_for", lambda *a: None)
    session._staged(plan, None, outcome, None, None, None, lambda r: None, names, ui)
    assert lines[0].startswith("  heartbeat: bound step 1/2, capacity-liveness, 1 examples, budget left")
    assert lines[-1].startswith("  heartbeat: bound step 2/2, routing, 4 examples, budget left")
    assert all(ln.endswith("20s elapsed") for ln in lines)


def test_the_fixed_count_bar_counts_a_shared_runs_example_once_per_property_it_judges():
    """pr/gate: the bar (and its ETA) is examples done of the fixed count; a shared run's example
    is one example of each of its properties, so six shared properties do not read as one."""
    from vmfuzz.harness.report import progress as pg
    bar = pg.BarProgress(7, "x", per_slot=10)
    try:
        bar.searching(["a", "b", "c", "d", "e", "f"])
        for _ in range(5):
            bar.example()
        assert bar.bar.tasks[0].total == 70 and bar.bar.tasks[0].completed == 30  # half of six slots
        for _ in range(6):  # they ended early (a finding): the plan takes what they ran
            bar.advance()
        assert bar.bar.tasks[0].completed == 30 and bar.bar.tasks[0].total == 40
        bar.searching(["routing"])
        bar.example()
        assert bar.bar.tasks[0].completed == 31
    finally:
        bar.close()


@pytest.mark.slow
def test_at_a_terminal_the_wait_for_sglang_s_import_is_said_first(sglang_target, tmp_path):
    """The first ~15-25 s of an SGLang command is its import: a person at a terminal is told so at once."""
    import os
    import pty
    import subprocess
    import sys

    from tests.helpers import ROOT
    main, tty = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "vmfuzz.harness.cli", "run", "--target", "sglang", "--property",
                             "capacity-liveness", "--max-examples", "1", "--isolate", "off",
                             "--report-dir", str(tmp_path / "r")], stdout=tty, stderr=subprocess.PIPE, env=env)
    os.close(tty)
    out = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    lines = out.decode(errors="replace").splitlines()
    assert lines[0].startswith("vmfuzz: importing SGLang"), lines[:3]
    assert lines[1].startswith("vmfuzz run: target sglang"), lines[:3]


def test_the_fixed_count_ends_on_the_summary_s_total_and_its_eta_is_measured_per_property():
    """The bar counts what the summary counts: boundary cases on top of a property's count, a
    property cut short by a finding, one never driven. The ETA is the running property's own rate
    for its rest and the finished ones' mean for those not begun; none before any rate exists."""
    from vmfuzz.harness.report.progress import FixedCount
    now = [0.0]
    count = FixedCount(4, 10, clock=lambda: now[0])
    assert count.eta() is None  # nothing measured: no guess from the cap
    count.searching(["slow"])
    for _ in range(12):  # ten searched, two boundary cases: 1 s each
        now[0] += 1.0
        count.example()
    assert (count.done, count.total) == (12, 42)
    count.advance()
    count.searching(["fast"])
    for _ in range(5):  # 0.1 s each: its own rate for its five left, the mean for the two not begun
        now[0] += 0.1
        count.example()
    assert count.eta() == pytest.approx(5 * 0.1 + 20 * 1.0)
    count.advance()  # a finding ended it at five
    count.searching(["found"])
    count.advance()  # not driven: ran nothing
    count.searching(["last"])
    for _ in range(10):
        now[0] += 0.5
        count.example()
    count.advance()
    summary_examples = 12 + 5 + 0 + 10
    assert count.done == count.total == summary_examples


def test_a_pool_s_results_fill_the_fixed_count_with_what_they_ran():
    """Workers report results, never single examples: each result's count is what the bar takes."""
    from vmfuzz.harness.report.progress import FixedCount
    count = FixedCount(3, 10, clock=lambda: 0.0)
    for ran in (12, 4, 0):
        count.advance(examples=ran)
    assert count.done == count.total == 16
