"""New means not on the base: in a gate, a known entry excuses only what the base shows too.

The PR under review must not pick what is excused through its own version: a PR
that reverts an upstream fix and lowers its version to one the entry's range
holds is a new finding; a checkout whose version no shipped range holds still
has the base's own known defect excused. Each gate runs on a git history of the
installed SGLang (``tests/sglang_repo.py``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests import sglang_repo, zygote
from tests.helpers import ROOT, sglang_or_skip

#: 0.5.23's look-through of the Hybrid and TBO routers in the DFlash policy, taken out again: the
#: defect the shipped entry dflash-policy-behind-router names for releases up to 0.5.22
REVERT_LOOK_THROUGH = ("python/sglang/srt/speculative/dflash_utils.py",
                       r"(?s)        if isinstance\(backend, HybridAttnBackend\):\n.*?            continue\n"
                       r"        if isinstance\(backend, TboAttnBackend\):\n.*?            continue\n", "")


def _version(to: str):
    return ("python/pyproject.toml", r'version = "[^"]+"', f'version = "{to}"')


def _gate(repo: Path, base: str, report: Path) -> tuple[int, str, dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI="true", TRITON_INTERPRET="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    # forked from the tests' zygote (tests/zygote.py): its own process all the same, torch not imported again
    r = zygote.run([sys.executable, "-m", "vmfuzz", "gate", "--target", "sglang", "--base", base,
                    "--repo", str(repo), "--report-dir", str(report), "--property", "routing"],
                   env=env, cwd=repo, timeout=900)
    summary = json.loads((report / "summary.json").read_text()) if (report / "summary.json").exists() else {}
    return r.returncode, r.stdout + r.stderr, summary


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    sglang_or_skip()
    repo = sglang_repo.build(tmp_path_factory.mktemp("known-on-base"))
    sglang_repo.git(repo, "config", "gc.auto", "0")
    with open(repo / ".gitignore", "a") as f:
        f.write("reports/\n.vmfuzz-db/\n")
    base = sglang_repo.commit(repo, "ignore vmfuzz's reports")
    return repo, base


@pytest.mark.slow
def test_a_pr_that_reverts_a_fix_and_lowers_its_version_is_a_new_finding(history, tmp_path):
    """Before: the lowered version put the entry's range over the PR, and the revert exited 0 as known."""
    repo, base = history
    sglang_repo.git(repo, "checkout", "-q", "-B", "revert-dflash", base)
    sglang_repo.commit(repo, "dflash: simpler policy, release 0.5.22", REVERT_LOOK_THROUGH, _version("0.5.22"))
    rc, said, summary = _gate(repo, base, tmp_path / "rep")
    assert rc == 1, said
    groups = summary["groups"]
    assert any(not g.get("known") and "HybridAttnBackend" in g["signature"] + json.dumps(g) for g in groups), groups
    assert any("judged on the base" in w and "dflash-policy-behind-router" in w.split("do not:")[1]
               for w in summary.get("warnings", [])), summary.get("warnings")


@pytest.mark.slow
def test_an_unrelated_pr_on_a_version_no_range_holds_still_has_the_bases_defect_excused(history, tmp_path):
    """A checkout past a release describes itself as a later version: the base's own known defect
    is still upstream's, whatever the version says."""
    repo, base = history
    sglang_repo.git(repo, "checkout", "-q", "-B", "post-release", base)
    sglang_repo.commit(repo, "verify_mask: a comment; the next dev version", sglang_repo.CLEAN, _version("0.5.24.dev0"))
    rc, said, summary = _gate(repo, base, tmp_path / "rep")
    assert rc == 0, said
    assert [g for g in summary["groups"] if not g.get("known")] == []
    assert any("judged on the base" in w and "dflash-policy-behind-dots-wrapper" in w.split("do not:")[0]
               for w in summary.get("warnings", [])), summary.get("warnings")


def test_a_base_that_cannot_replay_excuses_nothing(tmp_path):
    """Not a git checkout (or a base without python/sglang): every known defect is judged new."""
    from types import SimpleNamespace

    from vmfuzz.harness.engine.regression.known_on_base import BaseVerdict, start
    entry = (tmp_path / "k.json", SimpleNamespace(name="some-entry"))
    said = start(tmp_path, "0" * 40, [entry[0]]).result()
    assert said.failed and said.excused([entry]) == []  # the gate then keeps the ranges' choice
    assert "version ranges decide what is known" in said.note([entry])
    both = BaseVerdict("f" * 40, {str(entry[0]): True})
    assert both.excused([entry]) == [entry] and "reproduce there: some-entry" in both.note([entry])


def test_an_entry_whose_repro_the_base_fails_another_way_is_left_to_its_range(tmp_path):
    """The base has a second defect that fails the entry's case first (0.5.22's router finding before
    the dots wrapper's): the base cannot say whether it has the entry's defect, so the range decides."""
    from types import SimpleNamespace

    from vmfuzz.harness.engine.regression.known_on_base import BaseVerdict
    masked = (tmp_path / "masked.json", SimpleNamespace(name="masked-entry"))
    held = (tmp_path / "held.json", SimpleNamespace(name="held-entry"))
    said = BaseVerdict("f" * 40, {str(masked[0]): None, str(held[0]): False})
    assert said.excused([masked, held], in_range=[masked, held]) == [masked]  # held on the base: new
    assert said.excused([masked, held], in_range=[]) == []  # out of its range: new
    note = said.note([masked, held])
    assert "do not: held-entry" in note and "another way, or vmfuzz cannot replay it there), so their version ranges decide: masked-entry" in note


def test_an_entry_the_base_release_cannot_drive_is_left_to_its_range_and_the_others_are_still_asked(
        tmp_path, monkeypatch, capsys):
    """Gating 0.5.22 -> 0.5.23: the base (0.5.22) has no cuda-graph runners vmfuzz drives. The base's child
    raised at the first graph entry and the base said nothing of any entry; now that entry alone is
    'cannot say' (its range decides) and the entries after it are replayed on the base as before."""
    from vmfuzz.harness.engine.regression import base_code, known_on_base
    from vmfuzz.harness.engine.regression.known import default_known_root
    from vmfuzz.harness.targets import resolve
    monkeypatch.setattr(base_code, "load_base", lambda python_dir: resolve("reference"))  # no graph seam
    graph, policy = (default_known_root() / f"{n}.json" for n in ("draft-kv-indices-past-context",
                                                                    "dflash-policy-behind-router"))
    assert known_on_base._child(tmp_path, [graph, policy]) == 0
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [d["status"] for d in lines] == ["not driven", "held"]
    said = {d["path"]: known_on_base._said(d) for d in lines}
    assert said == {str(graph): None, str(policy): False}


@pytest.mark.parametrize("line, said", [
    ({"status": "failed", "matches": True}, True), ({"status": "failed", "matches": False}, None),
    ({"status": "not driven", "matches": None}, None), ({"status": "out of step", "matches": False}, None),
    ({"status": "held", "matches": False}, False)])
def test_what_each_of_the_bases_answers_leaves_to_the_range(line, said):
    from vmfuzz.harness.engine.regression.known_on_base import _said
    assert _said(line) is said


def test_the_base_is_asked_only_of_the_entries_of_the_properties_the_gate_searches(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from vmfuzz.harness.commands import gate
    from vmfuzz.harness.engine.regression import known_on_base
    asked = []
    monkeypatch.setattr(known_on_base, "start", lambda root, base, paths: asked.extend(paths) or "pending")
    request = SimpleNamespace(known=(), properties=("routing",))
    pending, found = gate._known_on_base(request, SimpleNamespace(base="f" * 40, root=tmp_path))
    assert pending == "pending" and found and {k.repro.property for _, k in found} == {"routing"}
    assert sorted(p.name for p in asked) == ["dflash-policy-behind-dots-wrapper.json", "dflash-policy-behind-router.json"]
    request = SimpleNamespace(known=(), properties=("no-oob-write",))
    assert gate._known_on_base(request, SimpleNamespace(base="f" * 40, root=tmp_path)) == (None, [])
