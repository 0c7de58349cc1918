"""Every reader of a run says the same about its causes: summary.json's ``groups`` and
``new_groups``, the exit code, summary.md's verdict, ``merge`` and ``compare``; and a cause's
key is the same from any working directory."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import vmfuzz

#: an entry for the plug-in's SGLang whose repro (11 requests into a buffer for 1) now overruns
#: past the capacity, not the way the entry says: it fails differently
CHANGED_ENTRY = {
    "sglang": ">=0.4.0,<=0.4.0", "reason": "its repro now fails with another origin",
    "origins": [{"property": "no-oob-write", "effect": "overrun", "writer": "verify step", "buffer": "tree_mask",
                 "side": "above", "cell": "sized for fewer requests"}],
    "repro": {"property": "no-oob-write",
              "config": {"mode": "FULL_MASK", "max_bs": 1, "max_context_len": 2, "num_draft_tokens": 2,
                         "topk": 1, "spec_steps": 1},
              "batches": [{"seq_lens": [2]}, {"seq_lens": [2] * 11}]}}


def assert_readers_agree(report_dir: Path, returncode: int) -> dict:
    """summary.json's groups, new_groups, the exit code and summary.md's verdict tell one story,
    and every finding counted as new is a member of a group (what compare and merge read)."""
    s = json.loads((report_dir / "summary.json").read_text())
    groups, counts = s["groups"], s["counts"]
    new = [g for g in groups if g.get("known") is None]
    assert counts["groups"] == len(groups) and counts["new_groups"] == len(new), (counts, groups)
    members = {m for g in groups for m in g["members"]}
    unfiled = [f["repro"] for f in s["findings"] if f.get("known") is None and f["repro"] not in members]
    assert not unfiled, f"findings counted as new but in no group: {unfiled}"
    fails = bool(new) or (s["fail_on_known"] and (counts["known"] or groups))
    assert returncode == (1 if fails else 0), (returncode, counts)
    verdict = (report_dir / "summary.md").read_text().splitlines()[0]
    assert ("**FAILED**" in verdict) == fails, verdict
    return s


def _run(tmp_path: Path, name: str, *extra: str):
    out = tmp_path / name
    r = vmfuzz("run", "--target", "tests.plugins:AdmitsElevenOnOldSGLang", "--property", "no-oob-write",
               "--bounds", "max_bs=2,overshoot=2", "--isolate", "off", "--seed", "1", "--max-examples", "20",
               "--report-dir", str(out), *extra)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    return r, out


def test_a_known_entry_failing_differently_is_a_group_compare_and_merge_see(tmp_path):
    known = tmp_path / "known"
    known.mkdir()
    (known / "changed.json").write_text(json.dumps(CHANGED_ENTRY))
    plain, before = _run(tmp_path, "before")
    assert_readers_agree(before, plain.returncode)
    # one shard of one: merge reads it as its whole run
    changed, after = _run(tmp_path, "after", "--known", str(known), "--shard", "1/1")
    s = assert_readers_agree(after, changed.returncode)
    assert changed.returncode == 1 and s["counts"]["new_groups"] == 1, changed.stdout
    [group] = [g for g in s["groups"] if g.get("known") is None]
    assert group["origin"]["cell"] != "sized for fewer requests" and group["repro"] == "findings/known-changed.json"
    c = vmfuzz("compare", str(before), str(after), "--report-dir", str(tmp_path / "cmp"))
    assert c.returncode == 1 and "NEW" in c.stdout and "1 new" in c.stdout, c.stdout + c.stderr
    m = vmfuzz("merge", str(after), "--report-dir", str(tmp_path / "merged"))
    assert assert_readers_agree(tmp_path / "merged", m.returncode)["counts"]["new_groups"] == 1, m.stdout


def test_a_changed_known_entry_and_a_new_search_finding_are_two_new_groups(tmp_path):
    """Each is its own cause, in groups with its key; and a changed entry whose new origin another
    entry names is still new (the entry no longer shows its own defect)."""
    from types import SimpleNamespace

    from vmfuzz.harness.engine.campaign.session import RunOutcome
    from vmfuzz.harness.engine.regression.known import KnownOutcome
    from vmfuzz.harness.engine.search.results import Finding, PropertyResult
    from vmfuzz.harness.model.config import Batch, Config
    from vmfuzz.harness.model.layouts import TreeMaskMode
    from vmfuzz.harness.model.origin import Origin
    from vmfuzz.harness.report.findings import new_groups
    config = Config(TreeMaskMode.FULL_MASK, 1, 2, 2, 1, 1)
    searched = Origin("no-oob-write", "overrun", writer="verify step", buffer="tree_mask", side="above", cell="a")
    other = Origin("no-oob-write", "overrun", writer="verify step", buffer="tree_mask", side="below", cell="b")
    found = Finding("no-oob-write", "x", tmp_path / "s.json", config, [Batch((2,))], origin=searched)
    moved = Finding("no-oob-write", "y", tmp_path / "known-e.json", config, [Batch((2,))], origin=other)
    entry = SimpleNamespace(name="e", matches=lambda o: False)
    changed = KnownOutcome(entry, tmp_path / "e.json", "fails differently", "y", origin=other, finding=moved)
    outcome = RunOutcome(SimpleNamespace(fail_on_known=False), "t", {}, "",
                         results=[PropertyResult("no-oob-write", finding=found)], known=[changed])
    assert [g["key"] for g in outcome.groups] == ["overrun|verify step|tree_mask|above|a",
                                                  "overrun|verify step|tree_mask|below|b"]
    assert new_groups(outcome) == 2 and outcome.failed
    # another entry naming the changed entry's new origin labels no group: it is still a new cause
    names = SimpleNamespace(name="names-it", matches=lambda o: o == other)
    held = SimpleNamespace(entry=names, status="reproduces", reproduces=True, finding=None)
    alone = RunOutcome(SimpleNamespace(fail_on_known=False), "t", {}, "", results=[], known=[changed, held])
    assert [g["known"] for g in alone.groups] == [None] and new_groups(alone) == 1 and alone.failed


def test_a_raise_through_the_stack_room_names_no_vmfuzz_frame_from_any_directory(tmp_path, monkeypatch):
    """The stack room's generated code has no file: made absolute it named the working directory."""
    from vmfuzz.harness.engine.core.failures import raise_place
    from vmfuzz.harness.engine.core.stack_room import roomy
    places = set()
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        try:
            roomy(int, "not a number")  # raised in C below the room: no Python frame under it
        except ValueError as exc:
            places.add(raise_place(exc))
    assert places == {f"tests/{Path(__file__).name}:{test_a_raise_through_the_stack_room_names_no_vmfuzz_frame_from_any_directory.__name__}"}, places


def test_the_same_raise_from_two_working_directories_is_one_group(tmp_path):
    """The reference target is the code under test: its frame keys the raise, never vmfuzz's."""
    keys = []
    for where in ("one", "two"):
        (tmp_path / where).mkdir()
        r = vmfuzz("run", "--target", "reference+pr33127+row-offset", "--property", "no-oob-write", "--seed", "1",
                   "--max-examples", "5", "--report-dir", str(tmp_path / f"r-{where}"), cwd=tmp_path / where)
        s = assert_readers_agree(tmp_path / f"r-{where}", r.returncode)
        keys.append([g["key"] for g in s["groups"]])
    assert keys[0] == keys[1] and len(keys[0]) == 1, keys
    frame = keys[0][0].split("|")[-1]
    assert frame.startswith("reference/target.py:") and "<" not in frame and "one" not in frame, frame
    c = vmfuzz("compare", str(tmp_path / "r-one"), str(tmp_path / "r-two"), "--report-dir", str(tmp_path / "cmp"))
    assert c.returncode == 0 and "0 new, 0 fixed, 1 still failing" in c.stdout, c.stdout
