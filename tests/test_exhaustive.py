import pytest

from vmfuzz.harness.engine.search import exhaustive
from vmfuzz.harness.cli import main
from vmfuzz.harness.engine.search.exhaustive import batches_of, configs, run_exhaustive, tree_shapes
from vmfuzz.harness.model.repro_file import load
from vmfuzz.harness.targets import CATALOGUE, resolve
from vmfuzz.harness.model.trees import has_detached


def test_enumeration_is_deterministic_and_covers_the_bounds():
    a, b = configs(), configs()
    assert a == b
    assert {c.max_bs for c in a} == {1, 2, 3}
    assert {c.max_context_len for c in a} == {0, 1, 2, 3}
    assert {c.d for c in a} == {1, 2, 3, 4}
    assert max(b.bs for c in a for b in batches_of(c)) == 5
    # ties broken against the parent must appear: the kernel's hardest edge case
    assert any(has_detached(t, 2) for t in tree_shapes(2, 3, 4))


@pytest.fixture
def small_bounds(monkeypatch):
    # The full scope takes about two minutes; the reference must hold on a slice of it here.
    monkeypatch.setitem(exhaustive.BOUNDS, "max_bs", 2)
    monkeypatch.setitem(exhaustive.BOUNDS, "max_context_len", 1)
    monkeypatch.setitem(exhaustive.BOUNDS, "num_draft_tokens", 3)


@pytest.mark.slow
def test_reference_holds(small_bounds):
    report = run_exhaustive(resolve("reference"), workers=2)
    assert report.ok
    assert all(t.configs > 0 for t in report.tallies if not t.not_driven)
    # the parts of the path the reference has no model of are said, never held
    assert {t.prop for t in report.tallies if t.not_driven} == {
        "kv-location-soundness", "graph-replay-equivalence", "padding-inert", "capture-replay-agreement",
        "graph-buffer-soundness"}


@pytest.mark.parametrize("variant", list(CATALOGUE))
@pytest.mark.slow
def test_every_catalogued_variant_is_caught_with_a_replayable_repro(variant, tmp_path, small_bounds):
    spec = f"reference+{variant}"
    report = run_exhaustive(resolve(spec), findings_dir=tmp_path, stop_at_first=True, workers=2)
    assert not report.ok
    failed = next(t for t in report.tallies if t.failure)
    assert load(failed.path).property == failed.prop
    assert main(["replay", str(failed.path)]) == 1
    assert main(["replay", str(failed.path), "--target", "reference"]) == 0


def test_cli_reports_finding_and_bad_workers(tmp_path, capsys, small_bounds):
    assert main(["exhaustive", "--target", "reference+row-offset", "--report-dir", str(tmp_path),
                 "--workers", "1"]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert main(["exhaustive", "--workers", "0"]) == 2
