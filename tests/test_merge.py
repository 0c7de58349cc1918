"""``vmfuzz merge``: it joins every shard of one finished run, or refuses (one line, exit 2);
groups are joined by cause, findings copied; ``compare`` never calls a group fixed on a
run whose groups are not all it found. (Shards sharing a Redis database: tests/test_shard.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vmfuzz.harness.cli import main
from tests.helpers import vmfuzz

# shard 1 holds (capacity-liveness: the variant admits more, never less); shards 2 and 3 each find
# their own causes: a merge that kept only the first shard's groups would see none
PROPS = ("--property", "capacity-liveness", "--property", "capacity-soundness", "--property", "trivial-path")
RUN = ("run", "--seed", "5", "--max-examples", "10", *PROPS)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("shards")
    codes = []
    for k in (1, 2, 3):
        machine = base / f"machine{k}"  # each in its own folder, under the same relative name
        machine.mkdir()
        r = vmfuzz(*RUN, "--target", "reference+fits-off-by-one", "--shard", f"{k}/3", "--report-dir", "report",
                   cwd=machine)
        codes.append(r.returncode)
        assert r.returncode in (0, 1), r.stdout + r.stderr
    assert codes == [0, 1, 1]
    r = vmfuzz(*RUN, "--target", "reference", "--report-dir", str(base / "before"))  # last night: all held
    assert r.returncode == 0, r.stdout + r.stderr
    return base


def _shards(base: Path) -> list[Path]:
    return [base / f"machine{k}" / "report" for k in (1, 2, 3)]


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def _id(g: dict) -> str:
    return g.get("key") or g["signature"]


def _vmfuzz(capsys, *args) -> tuple[int, str, str]:
    """merge and compare read and write files only: run in this process (no interpreter to start)."""
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_groups_are_joined_across_shards_and_compare_sees_every_new_cause(runs, tmp_path, capsys):
    code, out, err = _vmfuzz(capsys, "merge", *_shards(runs), "--report-dir", tmp_path / "m")
    assert code == 1, out + err
    want: dict[str, dict] = {}
    for folder in _shards(runs):
        for g in _summary(folder)["groups"]:
            have = want.setdefault(_id(g), {"count": 0, "properties": set(), "members": 0})
            have["count"] += g["count"]
            have["properties"] |= set(g["properties"])
            have["members"] += len(g["members"])
    # shards 2 and 3 both found the cause (one origin, seen by their properties); shard 1 none
    assert want and sum(w["members"] for w in want.values()) >= 2
    s = _summary(tmp_path / "m")
    got = {_id(g): g for g in s["groups"]}
    assert set(got) == set(want) and s["counts"]["groups"] == len(want)
    for key, g in got.items():
        assert g["count"] == want[key]["count"] and set(g["properties"]) == want[key]["properties"]
        assert len(g["members"]) == want[key]["members"]

    code, out, err = _vmfuzz(capsys, "compare", runs / "before", tmp_path / "m", "--report-dir", tmp_path / "c")
    assert code == 1, out + err
    changes = _summary(tmp_path / "c")["changes"]
    assert {_id(g) for g in changes["new"]} == set(want) and changes["fixed"] == []


def test_findings_are_copied_and_the_merged_folder_stands_alone(runs, tmp_path, capsys):
    for k, folder in enumerate(_shards(runs), 1):
        shutil.copytree(folder, tmp_path / f"s{k}")
    shards = [tmp_path / f"s{k}" for k in (1, 2, 3)]
    assert _vmfuzz(capsys, "merge", *shards, "--report-dir", tmp_path / "m")[0] == 1
    for folder in shards:
        shutil.rmtree(folder)  # the shards' artifacts are gone once merged
    s = _summary(tmp_path / "m")
    paths = [f["repro"] for f in s["findings"]] + [f["repro"] for p in s["properties"] for f in p["findings"]]
    paths += [g["repro"] for g in s["groups"]] + [m for g in s["groups"] for m in g["members"]]
    assert paths and len({f["repro"] for f in s["findings"]}) == len(s["findings"])
    for p in paths:
        assert p.startswith("findings/") and (tmp_path / "m" / p).is_file(), p
    md = (tmp_path / "m" / "summary.md").read_text()
    assert "findings/" in md


def _copy(src: Path, dest: Path, change=None) -> Path:
    shutil.copytree(src, dest)
    if change is not None:
        s = _summary(dest)
        change(s)
        (dest / "summary.json").write_text(json.dumps(s))
    return dest


def _set(**fields):
    return lambda s: s.update(fields)


def _status(s):
    s["properties"][0]["status"] = "flaky"


@pytest.mark.parametrize("which, change, says", [
    ((1, 3), None, "shard 2/3 is missing"),
    ((1, 2, 3, 3), None, "shard 3/3 is given more than once"),
    ((1, 2, 3), _set(shard="3/4"), "split the run differently"),
    ((1, 2, 3), _set(interrupted=True), "was interrupted"),
    ((1, 2, 3), _status, "status 'flaky'"),
    ((1, 2, 3), _set(seed=6), "differ in seed"),
    ((1, 2, 3), lambda s: s["versions"].update(vmfuzz="0.0.1"), "differ in vmfuzz version"),
    ((1, 2, 3), lambda s: s["versions"].update(sglang="0.5.22"), "differ in SGLang version"),
    ((1, 2, 3), _set(target="reference"), "differ in target"),
    ((1, 2, 3), _set(shard=None), "not a shard"),
    ((1, 2, 3), _set(max_examples=11), "differ in examples per property"),
    ((1, 2, 3), lambda s: s["bounds"][0].update(max_bs=99), "differ in bounds"),
    # a shard of another --property selection (its one property is one already run by shard 1)
    ((1, 2, 3), lambda s: s.update(properties=[{**s["properties"][0], "name": "capacity-liveness"}]),
     "different property selections"),
    ((1, 2, 3), lambda s: s.update(properties=s["properties"] * 3), "different property selections"),
    ((1, 2, 3), lambda s: s.update(selection=s["selection"][:2]), "different property selections"),
])
def test_a_set_that_is_not_every_shard_of_one_finished_run_is_refused(runs, tmp_path, capsys, which, change, says):
    folders = [_copy(_shards(runs)[k - 1], tmp_path / f"s{i}", change if i == len(which) - 1 else None)
               for i, k in enumerate(which)]
    code, out, err = _vmfuzz(capsys, "merge", *folders, "--report-dir", tmp_path / "m")
    assert code == 2, out + err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m" / "summary.json").exists()


@pytest.mark.parametrize("change, says", [
    (_set(interrupted=True), "interrupted run"),
    (lambda s: s.pop("groups"), "before finding groups existed"),
])
@pytest.mark.parametrize("side", ["a", "b"])
def test_compare_refuses_a_run_whose_groups_are_not_all_it_found(runs, tmp_path, capsys, change, says, side):
    failing = _copy(_shards(runs)[1], tmp_path / "failing", change)
    held = _copy(runs / "before", tmp_path / "held")
    a, b = (failing, held) if side == "a" else (held, failing)
    code, out, err = _vmfuzz(capsys, "compare", a, b, "--report-dir", tmp_path / "c")
    assert code == 2 and "fixed" not in out, out + err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_one_cause_found_by_several_shards_is_one_group():
    from vmfuzz.harness.report.merge import join_groups

    def group(sig, props, members, key=None, valid=True):
        g = {"signature": sig, "count": len(members), "properties": props, "repro": members[0],
             "repro_property": props[0], "detail": sig, "server_valid": valid, "members": members}
        return {**g, "key": key} if key else g

    joined = join_groups([
        {"groups": [group("overrun tree_mask above", ["no-oob-write"], ["findings/a.json"], "overrun|tree_mask|above",
                          valid=False)]},
        {"groups": [group("overrun tree_mask above (a reused buffer)", ["capacity-soundness", "no-oob-write"],
                          ["findings/b.json", "findings/c.json"], "overrun|tree_mask|above"),
                    group("wrong positions", ["reference-agreement"], ["findings/d.json"])]},
        {"groups": [group("wrong positions", ["trivial-path"], ["findings/e.json"])]},
    ])
    assert [(g["count"], g["properties"], g["members"]) for g in joined] == [
        (3, ["capacity-soundness", "no-oob-write"], ["findings/a.json", "findings/b.json", "findings/c.json"]),
        (2, ["reference-agreement", "trivial-path"], ["findings/d.json", "findings/e.json"])]
    # the repro a server could run wins over the first shard's one it could not
    assert joined[0]["repro"] == "findings/b.json" and joined[0]["server_valid"] is True


def test_shards_whose_only_findings_are_known_merge_to_exit_0(runs, tmp_path, capsys):
    """Each shard exits 0 when its groups are all known (known/): so does their merge, as the CI
    nightly-merge job runs it (the same shards with their groups new: exit 1, the first test)."""
    def all_known(s):
        for g in s["groups"]:
            g["known"] = "upstream-entry"
        s["counts"]["new_groups"] = 0
    folders = [_copy(f, tmp_path / f"s{i}", all_known) for i, f in enumerate(_shards(runs))]
    assert sum(_summary(f)["counts"]["findings"] for f in folders) > 0
    code, out, err = _vmfuzz(capsys, "merge", *folders, "--report-dir", tmp_path / "m")
    assert code == 0, out + err


def test_every_summary_field_has_a_merge_rule():
    """A field added to summary.json must say how shards join it: never copied from shard 1 unseen."""
    from vmfuzz.harness.model.summary_file import RunSummary
    from vmfuzz.harness.report.merge import FIELDS
    assert set(FIELDS) == set(RunSummary.__struct_fields__), set(FIELDS) ^ set(RunSummary.__struct_fields__)


def test_the_shards_numbers_are_added_not_copied_from_the_first(runs, tmp_path, capsys):
    def numbers(k):
        def change(s):
            s["deep_boundary_corpus"] = {"cases": [f"case {k}"], "runs": k, "seconds": 1.0, "sized_from": "x"}
            s["overflow_margin_by_path"] = {"reuse": {"0": k}, "fallback": {"1..100": 10 * k}}
            s["kernel"] = {"launches": k, "kernel_seconds": 1.0, "search_seconds": 2.0, "kernel_share": 0.5}
        return change
    folders = [_copy(f, tmp_path / f"s{k}", numbers(k)) for k, f in enumerate(_shards(runs), 1)]
    code, out, err = _vmfuzz(capsys, "merge", *folders, "--report-dir", tmp_path / "m")
    assert code == 1, out + err
    merged = _summary(tmp_path / "m")
    assert merged["deep_boundary_corpus"]["runs"] == 6 and len(merged["deep_boundary_corpus"]["cases"]) == 3
    assert merged["overflow_margin_by_path"] == {"reuse": {"0": 6}, "fallback": {"1..100": 60}}
    assert merged["kernel"]["launches"] == 6 and merged["kernel"]["kernel_share"] == 0.5
    assert merged["started"] == min(_summary(f)["started"] for f in folders)


def test_what_one_shards_cap_stopped_is_unfinished_for_the_merged_run(runs, tmp_path, capsys):
    """A shard whose cap cut it short left work undone: the merge says so and, its findings all
    known, is could not check (exit 3), never the passing exit 0 of the same shards uncut."""
    def all_known(s):
        for g in s["groups"]:
            g["known"] = "upstream-entry"
        s["counts"]["new_groups"] = 0

    def cut(s):
        all_known(s)
        s["unfinished"] = ["the cap stopped the search of trivial-path"]
    folders = [_copy(f, tmp_path / f"s{i}", cut if i == 1 else all_known) for i, f in enumerate(_shards(runs))]
    code, out, err = _vmfuzz(capsys, "merge", *folders, "--report-dir", tmp_path / "m")
    merged = _summary(tmp_path / "m")
    assert merged["unfinished"] == ["the cap stopped the search of trivial-path"], out + err
    assert code == 3 and merged["verdict"]["exit_code"] == 3, out + err


def test_compare_refuses_runs_of_another_profile_or_target(runs, tmp_path, capsys):
    held = _copy(runs / "before", tmp_path / "held")
    for change, says in ((_set(profile="nightly"), "ran profile"), (_set(target="sglang+fits-off-by-one"), "ran target")):
        other = _copy(_shards(runs)[1], tmp_path / f"other-{says[4:]}", change)
        code, out, err = _vmfuzz(capsys, "compare", held, other, "--report-dir", tmp_path / f"c-{says[4:]}")
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, out + err


def test_compare_calls_a_group_fixed_only_where_the_later_run_searched_its_property_as_long(runs, tmp_path, capsys):
    failing = _copy(_shards(runs)[1], tmp_path / "failing")  # shard 2: one property, failed
    [group] = _summary(failing)["groups"]
    [prop] = group["properties"]

    searched = next(p["examples"] for p in _summary(failing)["properties"] if p["name"] == prop)

    def fewer(s):
        for p in s["properties"]:
            if p["name"] == prop:
                p["examples"] = searched - 1

    def without(s):
        s["properties"] = [p for p in s["properties"] if p["name"] != prop]
    for i, (change, word) in enumerate(((None, "fixed"), (fewer, "not rechecked"), (without, "not rechecked"))):
        later = _copy(runs / "before", tmp_path / f"later{i}", change)
        code, out, err = _vmfuzz(capsys, "compare", failing, later, "--report-dir", tmp_path / f"c{i}")
        assert code == 0, out + err
        line = next(ln for ln in out.splitlines() if group["signature"] in ln)
        assert line.split()[:len(word.split())] == word.split(), (word, out)
    # and a group of a property the earlier run never searched is not compared, nor new
    code, out, err = _vmfuzz(capsys, "compare", _copy(runs / "before", tmp_path / "a", without), failing,
                             "--report-dir", tmp_path / "c-new")
    assert code == 0 and "not compared" in out and "NEW" not in out, out + err


def test_shards_of_two_selections_whose_counts_fit_one_split_are_refused(tmp_path, capsys):
    """Shard 1/2 of four properties runs two, shard 2/2 of three runs one: together three properties in
    counts one split of three gives, and the fourth (chain-writer) silently missing."""
    three = ("--property", "no-oob-write", "--property", "capacity-liveness", "--property", "routing")
    base = ("run", "--target", "reference", "--seed", "7", "--max-examples", "8", *three)
    for k, extra in ((1, ("--property", "chain-writer")), (2, ())):
        r = vmfuzz(*base, *extra, "--shard", f"{k}/2", "--report-dir", str(tmp_path / f"s{k}"), timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    assert _summary(tmp_path / "s1")["selection"] == ["no-oob-write", "capacity-liveness", "routing", "chain-writer"]
    code, out, err = _vmfuzz(capsys, "merge", tmp_path / "s1", tmp_path / "s2", "--report-dir", tmp_path / "m")
    # before: exit 0, "3 properties"
    assert code == 2, out + err
    assert err.strip() == (f"vmfuzz merge: the shards ran different property selections: only {tmp_path / 's1'} "
                           "asked for chain-writer (give every shard the same --property)"), err
    assert not (tmp_path / "m" / "summary.json").exists()
    # summaries from a vmfuzz that did not record the selection: merged on their counts, said so
    for k in (1, 2):
        _copy(tmp_path / f"s{k}", tmp_path / f"old{k}", lambda s: s.pop("selection"))
    code, out, err = _vmfuzz(capsys, "merge", tmp_path / "old1", tmp_path / "old2", "--report-dir", tmp_path / "m2")
    assert code == 0, out + err
    assert "cannot confirm the shards ran one property selection" in err and "3 properties" in out, err
    merged = _summary(tmp_path / "m2")
    assert merged["selection"] is None and any("cannot confirm" in w for w in merged["warnings"])
