"""A run forked from the test zygote is what a cold ``python`` run would be: same exit status,
output, argv, working directory, environment and import path, and nothing of SGLang preloaded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import zygote
from tests.helpers import ROOT

PROGRAM = ("import os, sys\n"
           "print(os.getcwd()); print(os.environ.get('VMFUZZ_PROBE')); print(sys.argv[1:])\n"
           "print('sglang' in sys.modules, 'torch' in sys.modules)\n"
           "import probe_site_module; print(probe_site_module.WHERE)\n"
           "sys.stderr.write('to stderr\\n'); sys.exit(int(sys.argv[1]))")


@pytest.fixture()
def site(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "probe_site_module.py").write_text("WHERE = 'from the test site'\n")
    return site


def both(argv, **kw):
    forked = zygote.run(argv, **kw)
    cold = subprocess.run(argv, capture_output=True, text=True, **kw)
    return forked, cold


def test_a_forked_run_matches_a_cold_one(tmp_path, site):
    env = {**os.environ, "VMFUZZ_PROBE": "seen", "PYTHONPATH": str(site)}
    forked, cold = both([sys.executable, "-W", "ignore", "-c", PROGRAM, "3", "two words"], env=env, cwd=tmp_path,
                        timeout=120)
    assert (forked.returncode, forked.stderr) == (cold.returncode, cold.stderr) == (3, "to stderr\n")
    lines = forked.stdout.splitlines()
    assert lines[:3] == [str(tmp_path), "seen", "[\'3\', \'two words\']"]
    assert lines[4] == "from the test site"
    # the only difference allowed: torch is already imported in the forked run, never SGLang
    assert lines[3].split()[0] == cold.stdout.splitlines()[3].split()[0] == "False"


def test_a_module_run_and_a_raise_match(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    forked, cold = both([sys.executable, "-m", "vmfuzz.harness.cli", "--help"], env=env, cwd=tmp_path, timeout=120)
    assert (forked.returncode, forked.stdout) == (cold.returncode, cold.stdout)
    forked, cold = both([sys.executable, "-c", "raise ValueError('boom')"], env=env, cwd=tmp_path, timeout=120)
    assert forked.returncode == cold.returncode == 1
    assert "ValueError: boom" in forked.stderr and "Traceback" in forked.stderr


def test_a_run_past_its_timeout_is_killed(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                   cwd=tmp_path, timeout=3)
    # the zygote serves the next run
    again = zygote.run([sys.executable, "-c", "print('next')"], cwd=tmp_path, timeout=60)
    assert again.stdout == "next\n"



def test_a_capped_run_is_refused_what_a_capped_cold_run_is_refused():
    """tests/test_hostile.py's memory cap holds in a forked run as in a cold one: an allocation
    under the cap succeeds in both, one past it is refused in both."""
    import resource
    cap = 3 << 30
    program = ("import sys\ntry:\n    block = bytearray(int(sys.argv[1]) << 20)\nexcept MemoryError:\n"
               "    sys.exit(7)\nprint(len(block) >> 20)")

    def capped():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    for mib, want in ((256, 0), (4096, 7)):
        argv = [sys.executable, "-c", program, str(mib)]
        forked = zygote.run(argv, cwd=ROOT, timeout=120, address_space=cap)
        cold = subprocess.run(argv, cwd=ROOT, timeout=120, capture_output=True, text=True, preexec_fn=capped)
        assert forked.returncode == cold.returncode == want, (mib, forked.stderr, cold.stderr)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_a_probe_cache_that_is_not_a_regular_file_of_ours_is_never_read(tmp_path, monkeypatch):
    """A FIFO at the cache's predictable name blocked the zygote's start for 600 s, silently."""
    from vmfuzz.harness.engine.core import zygote as core
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    env = dict(os.environ)
    planted = core.probe_path("import json", env)
    os.mkfifo(planted)
    got = core.probe("import json", cwd=tmp_path, env=env, cache_key="import json")
    assert got != planted and got.is_file() and "json" in got.read_text().split()


def test_a_sweep_removes_the_folders_of_dead_zygotes_and_keeps_live_and_unknown_ones(tmp_path):
    """An owner killed by SIGKILL leaves its zygote's folder (the zygote dies with it, by SIGKILL too):
    the next owner's sweep removes it, and never a folder whose zygote may still serve."""
    import os
    import subprocess
    import time
    from vmfuzz.harness.engine.core.zygote_client import FOLDER_PREFIX, sweep_stale
    dead = subprocess.Popen(["true"])
    dead.wait()

    def folder(name, pid=None, age=0.0):
        d = tmp_path / (FOLDER_PREFIX + name)
        d.mkdir()
        (d / "sock").write_text("")
        if pid is not None:
            (d / "pid").write_text(str(pid))
        if age:
            os.utime(d, (time.time() - age, time.time() - age))
        return d
    killed, live = folder("killed", dead.pid), folder("live", os.getpid(), age=7200)
    old, fresh = folder("old", age=7200), folder("fresh")
    check = folder("check-x", age=7200)
    (tmp_path / (FOLDER_PREFIX + "preload-abc.txt")).write_text("a cache file, not a folder")
    assert sorted(sweep_stale(tmp_path)) == sorted([killed, old])
    assert live.exists() and fresh.exists() and check.exists() and not killed.exists() and not old.exists()
