"""Nothing lost: the nightly database, repro files and report files as an operator meets them:
thirty nights on one --db, a full disk, a shared or
symlinked --report-dir, a repro naming a plug-in, repeated keys."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from vmfuzz.harness.engine.campaign import nightly
from tests.test_hostile import ROOT, deployment, no_traceback, refused, repro, vmfuzz, write

FAILING = ["--target", "reference+pr33127", "--property", "no-oob-write", "--max-examples", "5"]

THIRTY_NIGHTS = """
import json, sys
from pathlib import Path
from vmfuzz.harness.cli import main
db, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = []
for night in range(30):
    rd = out / f"r{night}"
    rc = main(["run", "--profile", "nightly", "--time-budget", "3", *sys.argv[3:], "--db", str(db),
               "--report-dir", str(rd)])
    names = [p.name for p in (db / "last-failures").iterdir()]
    found = json.loads((rd / "summary.json").read_text())["findings"]
    rows.append([rc, max(map(len, names)), len(names), len(found)])
print("ROWS " + json.dumps(rows))
"""


@pytest.mark.slow
def test_thirty_nights_on_a_still_failing_target_keep_names_bounded_and_report_every_night(tmp_path):
    r = subprocess.run([sys.executable, "-c", THIRTY_NIGHTS, tmp_path / "db", tmp_path, *FAILING], cwd=ROOT,
                       capture_output=True, text=True, timeout=900,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "CI": "true",
                            "XDG_CACHE_HOME": str(tmp_path / "cache")})
    no_traceback(r)
    rows = json.loads(r.stdout.split("ROWS ", 1)[1])
    assert [row[0] for row in rows] == [1] * 30, rows
    assert all(row[1] == rows[0][1] for row in rows), rows  # the longest name never grows
    assert all(row[2] == rows[0][2] for row in rows), rows  # one file per failing case
    assert all(row[3] >= 1 for row in rows), rows
    nights = json.loads((tmp_path / "db" / "nights.json").read_text())
    assert 30 in nights.values(), nights


@pytest.mark.slow
def test_a_database_from_an_older_harness_is_healed_not_crashed_on(tmp_path):
    last = tmp_path / "db" / "last-failures"
    last.mkdir(parents=True)
    long_name = "replay-last-failures-" * 11 + "no-oob-write.json"  # night 12 of the old naming
    write(last, long_name, repro(max_bs=1, batches=[{"seq_lens": [4, 4]}]))
    write(tmp_path / "db", "nights.json", "[not a map")
    r = vmfuzz(tmp_path, "run", "--profile", "nightly", "--time-budget", "3", *FAILING,
               "--db", tmp_path / "db", "--report-dir", tmp_path / "r")
    no_traceback(r)
    assert r.returncode == 1, r.stderr
    names = [p.name for p in last.iterdir()]
    assert names and max(map(len, names)) < 64, names
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["findings"]


def _finding(tmp_path: Path, n: int) -> SimpleNamespace:
    path = write(tmp_path, f"f{n}.json", repro(max_context_len=4 + n))
    return SimpleNamespace(prop="no-oob-write", path=path)


def _outcome(found, replayed=(), interrupted=False):
    # each replayed case failed again (the tests list it among the findings too)
    replays = [SimpleNamespace(path=p, source="last run", finding=None, set_aside=None, status="failed", detail="")
               for p in replayed]
    return SimpleNamespace(results=[SimpleNamespace(findings=list(found))], replays=replays,
                           interrupted=interrupted)


def test_last_failures_has_a_cap_and_what_it_drops_goes_to_quarantine(tmp_path, monkeypatch):
    monkeypatch.setattr(nightly, "MAX_LAST_FAILURES", 3)
    db = tmp_path / "db"
    nightly.keep_failures(db, _outcome([_finding(tmp_path, n) for n in range(5)]))
    assert len(list((db / "last-failures").glob("*.json"))) == 3
    assert len(list((db / "quarantine").glob("*.json"))) == 2


def test_two_nightlies_sharing_one_db_lose_no_failure(tmp_path):
    db = tmp_path / "db"
    nightly.keep_failures(db, _outcome([_finding(tmp_path, 0)]))
    before = sorted((db / "last-failures").glob("*.json"))
    # Both replayed last night's case; A found a new one, B (ending later) found another.
    nightly.keep_failures(db, _outcome([_finding(tmp_path, 0), _finding(tmp_path, 1)], before))
    nightly.keep_failures(db, _outcome([_finding(tmp_path, 0), _finding(tmp_path, 2)], before))
    kept = list((db / "last-failures").glob("*.json"))
    assert len(kept) == 3
    assert not list((db / "last-failures").glob(".*"))  # no temporary left
    assert sorted(json.loads((db / "nights.json").read_text()).values()) == [1, 1, 3]


@pytest.mark.slow
def test_a_full_disk_leaves_reports_whole_or_absent_and_the_fallback_holds_them(tmp_path):
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(tiny)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        r = vmfuzz(tmp_path, "run", *FAILING, "--report-dir", tiny / "r")
        no_traceback(r)
        assert r.returncode == 1, r.stderr
        assert "wrote them to" in r.stderr
        for name in ("summary.json", "summary.md", "junit.xml", "report.html"):
            left = tiny / "r" / name
            if name == "summary.json" and left.exists():
                json.loads(left.read_text())  # whole, never truncated
        assert not [p for p in (tiny / "r").iterdir() if p.name.endswith(".tmp")]
        spare = Path(r.stderr.rsplit("wrote them to ", 1)[1].strip())
        assert json.loads((spare / "summary.json").read_text())["findings"]
        assert (spare / "report.html").is_file()
    finally:
        subprocess.run(["umount", str(tiny)], capture_output=True)


@pytest.mark.slow
def test_a_repro_naming_a_plugin_imports_nothing(tmp_path):
    zen = write(tmp_path, "zen.json", repro(target="this:s"))
    for command in ("replay", "minimize"):
        r = vmfuzz(tmp_path, command, zen, "--report-dir", tmp_path / command)
        refused(r, "this:s", "--target")
        assert "Zen of Python" not in r.stdout + r.stderr


@pytest.mark.slow
def test_a_report_dir_holding_another_runs_reports_is_refused_unless_overwrite(tmp_path):
    good = write(tmp_path, "good.json", repro())
    assert vmfuzz(tmp_path, "replay", good, "--report-dir", tmp_path / "r").returncode == 0
    first = (tmp_path / "r" / "summary.json").read_text()
    refused(vmfuzz(tmp_path, "replay", good, "--report-dir", tmp_path / "r"), "already holds", "--overwrite")
    assert (tmp_path / "r" / "summary.json").read_text() == first
    assert vmfuzz(tmp_path, "replay", good, "--report-dir", tmp_path / "r", "--overwrite").returncode == 0


def test_a_report_dir_symlinked_to_the_users_folder_is_resolved_and_refused(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.md").write_text("my own notes\n")
    (tmp_path / "link").symlink_to(mine)
    r = vmfuzz(tmp_path, "run", "--max-examples", "2", "--report-dir", tmp_path / "link")
    refused(r, "already holds", str(mine))
    assert (mine / "summary.md").read_text() == "my own notes\n"


@pytest.mark.slow
def test_repeated_keys_are_refused(tmp_path):
    body = json.dumps(repro()).replace('"max_bs": 1', '"max_bs": 1, "max_bs": 2')
    refused(vmfuzz(tmp_path, "replay", write(tmp_path, "dup.json", body)), "'max_bs'", "more than once")
    dep = json.dumps(deployment()).replace('"topk": 2', '"topk": 2, "topk": 4')
    refused(vmfuzz(tmp_path, "run", "--deployment", write(tmp_path, "dep.json", dep), "--report-dir",
                   tmp_path / "r"), "'topk'", "more than once")
    refused(vmfuzz(tmp_path, "run", "--bounds", "d=4,d=16", "--report-dir", tmp_path / "r2"), "d", "more than once")


@pytest.mark.slow
def test_a_file_size_limit_leaves_every_report_whole_or_absent(tmp_path):
    """RLIMIT_FSIZE (``ulimit -f``) below report.html's size: what is there parses, no temporary is left."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (3072, 3072))

    r = subprocess.run([sys.executable, "-m", "vmfuzz.harness.cli", "run", *FAILING, "--report-dir", str(tmp_path / "r")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=limit,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "CI": "true",
                            "XDG_CACHE_HOME": str(tmp_path / "cache")})
    no_traceback(r)
    assert r.returncode == 1, r.stderr  # the finding is on disk: its verdict, not an error
    assert len(r.stderr.strip().splitlines()) == 1 and "cannot write reports" in r.stderr, r.stderr
    assert list((tmp_path / "r" / "findings").glob("*.json")), r.stderr  # the finding itself is small
    assert not (tmp_path / "r" / "report.html").exists()  # too large: absent, never cut short
    if (tmp_path / "r" / "summary.json").exists():
        json.loads((tmp_path / "r" / "summary.json").read_text())
    if (tmp_path / "r" / "junit.xml").exists():
        __import__("xml.etree.ElementTree").etree.ElementTree.parse(tmp_path / "r" / "junit.xml")
    assert not [p.name for p in (tmp_path / "r").iterdir() if p.name.endswith(".tmp")]


def _full_tmpfs(tmp_path, free_kib: int) -> Path:
    """A 160 KiB tmpfs with ``free_kib`` left, or a skip where no tmpfs can be mounted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(disk)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    (disk / "tmp").mkdir()
    (disk / "fill").write_bytes(b"\0" * ((160 - free_kib) * 1024))
    return disk


@pytest.mark.slow
@pytest.mark.parametrize("free_kib", [0, 12])
def test_a_disk_that_fills_keeps_every_finding_and_leaves_no_temporary(tmp_path, free_kib):
    """Report folder, fallback and temp dir all on one disk that fills during the run: the findings
    saved before stay, each one that no longer fits goes to stderr whole, the exit is the finding's 1
    (never 2, bad input), and no half-written temporary is left anywhere."""
    disk = _full_tmpfs(tmp_path, free_kib)
    try:
        env = {"XDG_CACHE_HOME": str(disk / "cache"), "TMPDIR": str(disk / "tmp")}
        r = vmfuzz(tmp_path, "run", "--target", "reference+pr33127", "--max-examples", "30",
                   "--report-dir", disk / "r", "--db", disk / "db", env=env)
        no_traceback(r)
        assert r.returncode == 1, r.stderr[-2000:]
        assert not [p for p in disk.rglob("*") if p.name.endswith(".tmp")]
        saved = {p.stem for p in (disk / "r" / "findings").glob("*.json")} if (disk / "r" / "findings").is_dir() \
            else set()
        on_stderr = set(re.findall(r"cannot write \S+/findings/(\S+)\.json \(No space left on device\) nor a "
                                   r"fallback copy", r.stderr))
        assert on_stderr or free_kib, r.stderr[-2000:]
        for stem in on_stderr:
            assert f'"property": "{stem}"' in r.stderr  # the repro itself, whole
        failed = set(re.findall(r"^\s+(\S+)\s+FAILED", r.stdout, re.M))
        kept = saved | on_stderr
        assert failed and all(any(k == f or k.startswith(f + "-") for k in kept) for f in failed), (failed, kept)
        for stem in saved:
            json.loads((disk / "r" / "findings" / f"{stem}.json").read_text())  # whole, never cut short
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


@pytest.mark.slow
def test_a_passing_run_whose_reports_fit_nowhere_could_not_check(tmp_path):
    disk = _full_tmpfs(tmp_path, 0)
    try:
        env = {"XDG_CACHE_HOME": str(disk / "cache"), "TMPDIR": str(disk / "tmp")}
        r = vmfuzz(tmp_path, "run", "--target", "reference", "--max-examples", "5",
                   "--report-dir", disk / "r", "--db", disk / "db", env=env)
        no_traceback(r)
        assert r.returncode == 3, r.stderr[-2000:]  # held, but nobody can read that it did: not a pass
        assert "the reports could not be written to" in r.stderr
        assert not [p for p in disk.rglob("*") if p.name.endswith(".tmp")]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
