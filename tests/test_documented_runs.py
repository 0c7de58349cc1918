"""The documented commands, run as README.md and docs/workflows.md write them.

Each test takes its lines from the docs through tests/documented.py's ``run_by``, so an edited doc
changes what runs, and makes only the substitutions its LEDGER entry states (a budget a 2-core
machine can spend, a Redis server on this host, stand-ins bound to a real checkout). It asserts the
exit code the doc states, else the one its ledger entry gives for the scenario.

Skipped unless SGLang imports (``VMFUZZ_REQUIRE_SGLANG=1``: must run), but for the reference runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.documented import BUDGET, GATE_PROPERTY, NIGHTLY_BUDGET, ROOT, expected_exit, run_by
from tests.helpers import sglang_or_skip, vmfuzz
from tests.test_shard import redis_server  # noqa: F401 (a fixture: a real redis-server on a free port)

pytestmark = pytest.mark.slow


def run(cmd, argv: list[str], cwd: Path):
    proc = vmfuzz(*argv, cwd=cwd, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == expected_exit(cmd), f"{cmd.where()}\nran: vmfuzz {' '.join(argv)}\n{out}"
    return proc, out


def only_reports(folder: Path) -> Path:
    """The one report folder a command run without --report-dir wrote under ``folder/reports``."""
    [summary] = (folder / "reports").glob("*/summary.json")
    return summary.parent


def test_readme_nightly_runs_every_step_of_a_night(tmp_path):
    sglang_or_skip()
    [nightly] = run_by("test_readme_nightly_runs_every_step_of_a_night")
    _, out = run(nightly, nightly.argv(options={"--time-budget": NIGHTLY_BUDGET, "--workers": "1"}), tmp_path)
    s = json.loads((only_reports(tmp_path) / "summary.json").read_text())
    assert (s["command"], s["target"], s["profile"], s["workers"]) == ("run", "sglang", "nightly", 1), out
    assert (only_reports(tmp_path) / "report.html").is_file()
    assert (tmp_path / ".vmfuzz-db" / "hypothesis").is_dir(), out  # the database a next night starts from
    assert "could not check: the time budget" in out, out


def test_gate_lines_run_in_a_checkout(fits_history, tmp_path):
    repo, _, _ = fits_history
    base, listed = run_by("test_gate_lines_run_in_a_checkout")
    assert "--base" in base.argv() and "--changed-files" in listed.argv()
    changed = tmp_path / "changed.txt"
    changed.write_text("docs/speculative_decoding.md\n")
    _, out = run(listed, listed.argv({"FILE": str(changed)}), repo)
    assert "skipped: none of the 1 changed file(s) touches verify-mask code" in out, out
    _, out = run(base, base.argv(add=("--property", GATE_PROPERTY)), repo)
    assert f"from {repo / 'python' / 'sglang'}" in out, out  # the checkout's code, not the installed one
    assert "touch verify-mask code: python/sglang/srt/layers/attention/verify_mask.py" in out, out


def test_surface_runs_as_written(tmp_path):
    sglang_or_skip()
    [surface] = run_by("test_surface_runs_as_written")
    proc, out = run(surface, surface.argv(optional=True), tmp_path)
    rows = json.loads(proc.stdout)["rows"]
    assert any(r["driven"] for r in rows) and any(not r["driven"] for r in rows), rows


def test_workflows_bisect_names_the_commit_that_broke_fits(fits_history, tmp_path):
    repo, _, bad = fits_history
    (tmp_path / "repro").symlink_to(ROOT / "repro")  # the line names the checkout's repro/ from its root
    [bisect] = run_by("test_workflows_bisect_names_the_commit_that_broke_fits")
    _, out = run(bisect, bisect.argv({"~/sglang": str(repo)}), tmp_path)
    assert f"first bad commit: {bad} verify_mask: let one more request through" in out, out


def test_what_a_run_prints_then_compare(tmp_path):
    """README's first run (all held), the transcript's run (the sample's first line, as printed), then
    compare of the two: B has a group A did not."""
    first, transcript, compare = run_by("test_what_a_run_prints_then_compare")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    run(first, first.argv(), a)
    proc, out = run(transcript, transcript.argv(), b)
    sample = (ROOT / transcript.doc).read_text().splitlines()[transcript.line]  # the line after the command
    assert proc.stdout.splitlines()[0] == sample.strip(), out
    _, out = run(compare, compare.argv({"A": str(only_reports(a)), "B": str(only_reports(b)),
                                        "DIR": str(tmp_path / "compared")}), tmp_path)
    s = json.loads((tmp_path / "compared" / "summary.json").read_text())
    assert s["command"] == "compare" and s["changes"]["new"], out


def test_shards_share_redis_and_merge(redis_server, tmp_path):  # noqa: F811
    """The sharded nightly on one machine: shard 1/3 from the prose line, 2/3 and 3/3 from the CI
    matrix line, each merge line over the three (the CI one in a job folder of its own)."""
    sglang_or_skip()
    import redis
    url, _ = redis_server
    here = url.split("//", 1)[1].split("/", 1)[0]
    shard, merge, ci_shard, ci_merge = run_by("test_shards_share_redis_and_merge")
    client = redis.Redis.from_url(url)
    connections = client.info("stats")["total_connections_received"]
    run(shard, shard.argv({"db-host:6379": here}, add=("--time-budget", BUDGET)), tmp_path)
    for k in ("2", "3"):
        run(ci_shard, ci_shard.argv({"localhost:6379": here, "${{ matrix.shard }}": k},
                                    options={"--time-budget": BUDGET}), tmp_path)
    # each shard opened the shared database (a search too short to save an example still connects)
    assert client.info("stats")["total_connections_received"] - connections >= 3
    _, out = run(merge, merge.argv(), tmp_path)
    assert json.loads((tmp_path / "nightly" / "summary.json").read_text())["shards"] == ["1/3", "2/3", "3/3"], out
    job = tmp_path / "merge-job"
    for k in (1, 2, 3):
        shutil.copytree(tmp_path / f"shard-{k}", job / f"shard-{k}")
    _, out = run(ci_merge, ci_merge.argv(), job)
    assert (job / "nightly" / "report.html").is_file(), out
