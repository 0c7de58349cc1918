"""``vmfuzz bisect`` on a stand-in SGLang history where the regression enters at a known commit.

The history is 18 commits on top of the installed SGLang (tests/sglang_repo.py):
small unrelated edits, the pre-#33127 ``fits`` planted at one commit, and two
commits on which ``import sglang`` fails (a refactor half done, then undone).
The replay at each revision runs that revision's real code. Bisect must name
the planted commit, skip the unimportable ones without blaming them, report the
finding, and leave the checkout on the branch it was on.

Skipped unless SGLang imports (``VMFUZZ_REQUIRE_SGLANG=1``: must run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import sglang_repo
from tests.helpers import sglang_or_skip

ROOT = Path(__file__).resolve().parent.parent
REPRO = ROOT / "repro" / "pr33127" / "pr33127.json"

N_COMMITS = 18
PLANTED = 13  # the commit (1-based, after the base) that brings the regression back
UNIMPORTABLE = (9, 10)  # import sglang fails on these two, repaired by the next

#: Files the unrelated commits touch in turn: comments only, the code unchanged.
TOUCHED = ("python/sglang/srt/speculative/eagle_utils.py", "python/sglang/srt/layers/attention/verify_mask.py",
           "docs/speculative_decoding.md", "python/sglang/srt/speculative/eagle_worker_common.py")


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    sglang_or_skip()
    repo = sglang_repo.build(tmp_path_factory.mktemp("sglang-history"))
    shas = {0: sglang_repo.git(repo, "rev-parse", "HEAD")}
    init = repo / "python" / "sglang" / "__init__.py"
    for i in range(1, N_COMMITS + 1):
        if i == PLANTED:
            shas[i] = sglang_repo.commit(repo, "verify_mask: FULL_MASK has context slack, skip the check",
                                         sglang_repo.REGRESSION)
        elif i == UNIMPORTABLE[0]:
            shas[i] = sglang_repo.commit(repo, "refactor: move the runtime package (part 1)",
                                         sglang_repo.BREAKS_IMPORT)
        elif i == UNIMPORTABLE[-1] + 1:
            init.write_text(init.read_text().replace(sglang_repo.BREAKS_IMPORT[2], "", 1))
            shas[i] = sglang_repo.commit(repo, "refactor: revert the move")
        else:
            shas[i] = sglang_repo.commit(repo, f"chore: tidy {i}", touch=TOUCHED[i % len(TOUCHED)])
    return repo, shas


def bisect(repo: Path, report: Path, *args: str):
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI="true", TRITON_INTERPRET="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "bisect", str(REPRO), "--repo", str(repo),
                           "--report-dir", str(report), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    return proc, proc.stdout + proc.stderr


@pytest.mark.slow
def test_bisect_names_the_planted_commit_and_skips_the_unimportable(history, tmp_path):
    repo, shas = history
    proc, out = bisect(repo, tmp_path / "r", "--good", shas[0], "--bad", "main")
    assert proc.returncode == 1, out
    assert f"first bad commit: {shas[PLANTED]} verify_mask: FULL_MASK has context slack" in out, out
    assert "finding (no-oob-write): out-of-bounds write on the reused buffer" in out, out
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["first_bad"] == shas[PLANTED] and s["command"] == "bisect"
    verdicts = {c["name"].split()[0]: c["status"] for c in s["checks"]}
    # Every tested commit got the verdict its code deserves; the unimportable ones were skipped.
    for i, sha in shas.items():
        if sha[:12] in verdicts:
            want = "skipped" if i in UNIMPORTABLE else ("failed" if i >= PLANTED else "held")
            assert verdicts[sha[:12]] == want, (i, verdicts)
    assert any(shas[i][:12] in verdicts for i in UNIMPORTABLE), "no unimportable commit was tested"
    # The checkout is back on its branch, with no bisect left behind.
    assert sglang_repo.git(repo, "symbolic-ref", "--short", "HEAD") == "main"
    assert subprocess.run(["git", "bisect", "log"], cwd=repo, capture_output=True).returncode != 0
    import xml.etree.ElementTree as ET
    suite = ET.parse(tmp_path / "r" / "junit.xml").getroot().find("testsuite")
    assert int(suite.get("failures")) == sum(v == "failed" for v in verdicts.values())


@pytest.mark.slow
@pytest.mark.parametrize("good,bad,message", [
    ("--output=/tmp/x", "main", "not a revision"),
    ("no-such-branch", "main", "no such commit"),
    ("main", "main", "same commit"),
])
def test_bisect_refuses_bad_revisions(history, tmp_path, good, bad, message):
    repo, _ = history
    proc, out = bisect(repo, tmp_path / "r", f"--good={good}", f"--bad={bad}")
    assert proc.returncode == 2 and message in proc.stderr, out
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow
def test_bisect_refuses_ends_that_do_not_hold_and_fail(history, tmp_path):
    repo, shas = history
    # Both ends already carry the regression: nothing to bisect, and the checkout is left as found.
    proc, out = bisect(repo, tmp_path / "r", "--good", shas[PLANTED], "--bad", "main")
    assert proc.returncode == 2 and "the repro fails at --good" in proc.stderr, out
    assert sglang_repo.git(repo, "symbolic-ref", "--short", "HEAD") == "main"


@pytest.mark.slow
def test_ctrl_c_mid_bisect_leaves_the_checkout_as_found(history, tmp_path):
    import signal
    import time

    repo, shas = history
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI="true", TRITON_INTERPRET="1")
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "bisect", str(REPRO), "--repo", str(repo),
                             "--good", shas[0], "--bad", "main", "--report-dir", str(tmp_path / "r")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while subprocess.run(["git", "bisect", "log"], cwd=repo, capture_output=True).returncode != 0:
        assert proc.poll() is None and time.monotonic() < deadline, "the bisect never started"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    assert subprocess.run(["git", "bisect", "log"], cwd=repo, capture_output=True).returncode != 0
    assert sglang_repo.git(repo, "symbolic-ref", "--short", "HEAD") == "main"
    assert sglang_repo.git(repo, "status", "--porcelain", "--untracked-files=no") == ""
