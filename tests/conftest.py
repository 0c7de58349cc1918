import os

import pytest
import torch

# Triton decorates its own library when first imported, for the interpreter only if this is
# already set; a test module that imports triton at collection (bench/stillborn.py's tests)
# would otherwise leave every later SGLang kernel in that worker unable to run on this CPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
from hypothesis import HealthCheck, settings

from tests import touched
from tests.helpers import ROOT, sglang_or_skip

# Property tests are plain Hypothesis tests; profiles keep them quick by default
# and let a nightly job turn them up without editing code.
settings.register_profile("default", max_examples=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("nightly", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("VMFUZZ_HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _in_own_folder(tmp_path, monkeypatch):
    """Every test runs in its own temporary folder: a command run without --report-dir
    writes reports/<timestamp>/ under it, never into the checkout's reports/."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True, scope="session")
def _checkout_reports_untouched():
    """After the tests, the checkout's reports/ holds what it held before them."""
    reports = ROOT / "reports"
    before = set(reports.iterdir()) if reports.is_dir() else set()
    yield
    after = set(reports.iterdir()) if reports.is_dir() else set()
    assert after <= before, f"tests wrote into {reports}: {sorted(p.name for p in after - before)[:5]}"


def pytest_addoption(parser):
    touched.addoption(parser)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a whole campaign in a subprocess (tens of seconds)")
    config.addinivalue_line("markers", "release: installs an older SGLang release in a venv of its own (minutes); "
                            "CI leaves it to scripts/release_matrix.sh, whose 0.5.21 column runs the same gate")
    # the fast loop (-m "not slow") runs a function of every module: tests/touched.py
    touched.register(config, ["harness", "strategies"])


@pytest.fixture(scope="module")
def sglang_target():
    """SGLang's real code behind the target protocol; skips (or, in CI, fails) where it cannot load.

    With the known findings (``known/``) that apply to it attached, as a run attaches them:
    a property checked directly meets a known defect as a class, not a failure.
    """
    from vmfuzz.harness.engine.regression.known import applicable, attach, default_known_root, entries
    target = sglang_or_skip()
    attach(target, applicable(entries(default_known_root()), dict(target.versions())))
    return target


@pytest.fixture(scope="session")
def fits_history(tmp_path_factory):
    """A stand-in SGLang checkout, ``main`` one commit (``fits`` admitting max_bs + 1) past
    ``origin/main``: (repo, good sha, bad sha). Built once per worker: copying and committing
    SGLang's tree costs tens of seconds, and the tests that use it leave its history as it was."""
    from tests import sglang_repo
    sglang_or_skip()
    return sglang_repo.fits_history(tmp_path_factory.mktemp("fits-history"))


@pytest.fixture(scope="session")
def stand_in_checkout(tmp_path_factory):
    """The stand-in SGLang checkout (``sglang_repo.build``: the installed package, one commit on
    ``main``), built once per worker for the modules whose tests each put their change on a branch
    of their own taken from ``main`` (``git checkout -B NAME main``): copying and committing SGLang's
    tree costs about 10 s of disk each time, and no test moves ``main``. What a command run inside
    it writes (reports/, .vmfuzz-db/) is excluded locally (``.git/info/exclude``, in no commit), so
    a later test's ``git add -A`` never makes another test's leftovers part of its change."""
    from tests import sglang_repo
    sglang_or_skip()
    repo = sglang_repo.build(tmp_path_factory.mktemp("stand-in-checkout"))
    sglang_repo.git(repo, "config", "gc.auto", "0")  # thousands of loose objects: no background gc mid-test
    with open(repo / ".git" / "info" / "exclude", "a") as f:
        f.write("reports/\n.vmfuzz-db/\n")
    return repo


@pytest.fixture(scope="session")
def pristine_gate(tmp_path_factory):
    """The pristine copy's whole gate (tests/sglang_copies.py's ``pristine_gate``): once a session where
    the workers' turns allow, its verdict asserted by each test that asks for it."""
    from tests.sglang_copies import pristine_gate as gate
    sglang_or_skip()
    return gate(tmp_path_factory)
