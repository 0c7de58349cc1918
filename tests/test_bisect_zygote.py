"""A bisect step forked from the zygote is the step a cold start would run: the same verdict,
this revision's own SGLang (never the zygote's, which has none), and no zygote or child left
running once its owner is gone, even when the owner dies by SIGKILL.

The steps' tests are skipped unless SGLang imports (``VMFUZZ_REQUIRE_SGLANG=1``: must run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vmfuzz.harness.engine.core.zygote_client import ZYGOTE_ENV, serving, spawn
from vmfuzz.harness.engine.regression import bisect_step
from tests import sglang_repo
from tests.helpers import sglang_or_skip

ROOT = Path(__file__).resolve().parent.parent
REPRO = ROOT / "repro" / "pr33127" / "pr33127.json"
PROBE = "import vmfuzz.harness.cli\ntry:\n    from vmfuzz.harness.targets import resolve\n    resolve('sglang')\nexcept Exception:\n    pass"


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    env.pop(ZYGOTE_ENV, None)
    return env


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory):
    """Two copies of SGLang: as installed (the repro holds) and with the regression (it fails)."""
    sglang_or_skip()
    root = tmp_path_factory.mktemp("zygote-history")
    good = sglang_repo.build(root)
    sglang_repo.git(good, "config", "gc.auto", "0")
    bad = root / "bad"
    sglang_repo.git(good, "worktree", "add", "-q", "-b", "planted", str(bad))
    sglang_repo.commit(bad, "verify_mask: FULL_MASK has context slack, skip the check", sglang_repo.REGRESSION)
    return good, bad


@pytest.fixture(scope="module")
def zygote_socket(checkouts):
    """Started as ``vmfuzz bisect`` starts its steps' zygote: from a maintainer's plain shell, with the
    import switches a cold step sets. One per module: the forked-step tests and the fits check share it
    (a zygote's start is most of what each of them cost); every run forks from its clean preload."""
    from vmfuzz.harness.targets.sglang.loader import IMPORT_SWITCHES
    with serving(_plain_shell_env(), probe_code=PROBE, switches=IMPORT_SWITCHES) as sock:
        assert sock is not None, "the zygote did not start"
        yield sock


def _step(repo: Path, log: Path, monkeypatch, sock: str | None) -> tuple[int, list[dict]]:
    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("VMFUZZ_BISECT_LOG", str(log))
    if sock:
        monkeypatch.setenv(ZYGOTE_ENV, sock)
    log.unlink(missing_ok=True)
    with monkeypatch.context() as m:
        if sock:  # the zygote must serve it: a fall back to a cold start would hide a broken zygote
            m.setattr(bisect_step, "_watch", _forked_only(bisect_step._watch))
        rc = bisect_step.main([str(REPRO), "--repo", str(repo), "--target", "sglang"])
    return rc, [json.loads(line) for line in log.read_text().splitlines()]


def _forked_only(watch):
    def checked(proc, timeout):
        assert not isinstance(proc, subprocess.Popen), "the step ran cold, not from the zygote"
        return watch(proc, timeout)
    return checked


@pytest.mark.slow
def test_a_forked_step_gives_a_cold_steps_verdict_from_its_own_checkout(checkouts, zygote_socket, tmp_path,
                                                                        monkeypatch):
    good, bad = checkouts
    log = tmp_path / "steps.jsonl"
    # good, bad, good again through one zygote: each step sees its own copy, none the one before
    forked = [_step(repo, log, monkeypatch, zygote_socket) for repo in (good, bad, good)]
    cold = [_step(repo, log, monkeypatch, None) for repo in (good, bad)]
    assert [rc for rc, _ in forked] == [bisect_step.GOOD, bisect_step.BAD, bisect_step.GOOD], forked
    assert forked[:2] == cold
    assert forked[0] == forked[2]
    assert "out-of-bounds write" in forked[1][1][0]["detail"], forked[1]


@pytest.mark.slow
def test_a_forked_run_imports_its_own_sglang_and_nothing_of_the_harness_from_the_zygote(checkouts, zygote_socket,
                                                                                      tmp_path):
    """The altered copy's code is what the child runs; the zygote had torch, never SGLang."""
    good, bad = checkouts
    program = textwrap.dedent("""
        import os, sys
        preloaded = 'torch' in sys.modules, 'sglang' in sys.modules, 'harness' in sys.modules
        sys.path.insert(0, sys.argv[1])
        import sglang.srt.layers.attention.verify_mask as vm, inspect
        print(json.dumps([preloaded, vm.__file__, 'FULL_MASK:' in inspect.getsource(vm).split('def fits')[1][:400]]))
    """)
    seen = []
    for repo in (bad, good):
        out = tmp_path / f"{repo.name}.out"
        with open(out, "w") as f:
            proc = _spawn_with_stdout([sys.executable, "-c", "import json\n" + program, str(repo / "python")], f,
                                      {**_env(), ZYGOTE_ENV: zygote_socket})
            assert proc.wait(300) == 0, out.read_text()
        seen.append(json.loads(out.read_text().splitlines()[-1]))
    for (preloaded, where, planted), repo, want in zip(seen, (bad, good), (True, False)):
        assert preloaded == [True, False, False]
        assert Path(where).is_relative_to(repo) and planted is want, (where, planted)


def _spawn_with_stdout(argv, stdout, env):
    """spawn() passes this process's fds 0-2: point fd 1 at ``stdout`` for the call."""
    saved = os.dup(1)
    try:
        os.dup2(stdout.fileno(), 1)
        proc = spawn(argv, env=env, cwd=str(ROOT))
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert proc is not None, "the zygote did not take the run"
    return proc


#: The owner takes Ctrl-C whatever it inherited: an xdist worker that ran an in-process check before may
#: hand its children SIGINT ignored (the harness's workers ignore it), and the block then never ends.
OWNER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})
sys.path.insert(0, {root!r})
from vmfuzz.harness.engine.core.zygote_client import serving
with serving(dict(__import__('os').environ), probe_code={probe!r}) as sock:
    print(sock, flush=True)
    time.sleep(600)
"""


def _naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while (alive := [p for p in pids if Path(f"/proc/{p}").exists() and _state(p) != "Z"]) and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds processes through /proc")
@pytest.mark.parametrize("ending", ["block ends", "owner killed"])
def test_no_zygote_or_forked_run_outlives_its_owner(tmp_path, ending):
    # a small preload: what outlives the owner does not depend on what the zygote holds
    owner = subprocess.Popen([sys.executable, "-c", OWNER.format(root=str(ROOT), probe="import json")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env())
    try:
        sock = owner.stdout.readline().strip()
        assert sock and sock != "None", "the zygote did not start"
        zygotes = _naming(sock)
        assert len(zygotes) == 1, zygotes
        marker = f"sleeping-{tmp_path.name}"
        run = spawn([sys.executable, "-c", f"import time; time.sleep(300)  # {marker}"],
                    env={**_env(), ZYGOTE_ENV: sock}, cwd=str(tmp_path))
        assert run is not None and Path(f"/proc/{run.pid}").exists()
        owner.send_signal(signal.SIGKILL if ending == "owner killed" else signal.SIGINT)
        owner.wait(60)
        assert _gone(zygotes + [run.pid], within=30) == []
    finally:
        owner.kill()
        owner.wait()


def test_no_zygote_means_a_cold_step(monkeypatch):
    monkeypatch.delenv(ZYGOTE_ENV, raising=False)
    assert spawn([sys.executable, "-c", "pass"]) is None
    # a socket that is not there (a zygote that died): cold too
    assert spawn([sys.executable, "-c", "pass"], env={ZYGOTE_ENV: "/nonexistent/sock"}) is None


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds processes through /proc")
def test_an_owner_killed_while_the_zygote_starts_leaves_nothing_running(tmp_path):
    marker = f"probing-{os.getpid()}-{time.monotonic_ns()}"
    slow_probe = f"import time\ntime.sleep(120)  # {marker}"
    owner = subprocess.Popen([sys.executable, "-c", OWNER.format(root=str(ROOT), probe=slow_probe)],
                             stdout=subprocess.PIPE, text=True, env={**_env(), "TMPDIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 120
        # the owner's own command line holds the probe's code: the probe is the other one naming it
        while not (probing := [p for p in _naming(marker) if p != owner.pid]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert probing, "the probe never started"
        owner.kill()
        owner.wait(60)
        assert _gone(probing, within=30) == []
    finally:
        owner.kill()
        owner.wait()


def test_bisect_zygote_off_and_a_zygote_that_cannot_start_mean_cold_steps(monkeypatch):
    from vmfuzz.harness.engine.core import zygote_client
    from vmfuzz.harness.engine.regression import bisect_zygote as engine
    monkeypatch.setenv("VMFUZZ_BISECT_ZYGOTE", "0")
    with engine.steps_zygote(_env(), "sglang") as sock:
        assert sock is None
    monkeypatch.setattr(zygote_client, "_SERVER", ROOT / "no-such-zygote.py")
    with serving(_env(), probe_code="import json") as sock:
        assert sock is None


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds processes through /proc")
def test_a_zygote_lost_mid_run_says_so_and_its_run_dies_with_it(tmp_path):
    """Lost is the step's cue to run the child again cold (bisect_step._replay)."""
    from vmfuzz.harness.engine.core.zygote_client import Lost
    with serving(_env(), probe_code="import json") as sock:
        assert sock is not None
        (zygote,) = _naming(sock)
        run = spawn([sys.executable, "-c", "import time; time.sleep(300)"], env={**_env(), ZYGOTE_ENV: sock},
                    cwd=str(tmp_path))
        assert run is not None
        os.kill(zygote, signal.SIGKILL)
        with pytest.raises(Lost):
            run.wait(60)
        assert _gone([run.pid], within=30) == []


def _plain_shell_env() -> dict:
    """A maintainer's shell: nothing has set the interpreter switch (a cold step sets it itself)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI="true")
    for key in ("TRITON_INTERPRET", "SGLANG_USE_CPU_ENGINE", ZYGOTE_ENV, "VMFUZZ_BISECT_ZYGOTE"):
        env.pop(key, None)
    return env


@pytest.mark.slow
def test_bisect_with_its_zygote_names_the_planted_commit_where_no_one_set_the_interpreter_switch(
        stand_in_checkout, tmp_path):
    """Before: the zygote preloaded a compiled triton, so every forked step was 'cannot be tested'."""
    repo = stand_in_checkout  # its own branch off main: the bisect's steps run in a worktree of their own
    sglang_repo.git(repo, "checkout", "-q", "-B", "zygote-bisect", "main")
    good = sglang_repo.commit(repo, "docs: a line", touch="docs/speculative_decoding.md")
    planted = sglang_repo.commit(repo, "verify_mask: FULL_MASK has context slack, skip the check",
                                 sglang_repo.REGRESSION)
    sglang_repo.commit(repo, "docs: another line", touch="docs/speculative_decoding.md")
    out = subprocess.run([sys.executable, "-m", "vmfuzz", "bisect", str(REPRO), "--target", "sglang",
                          "--repo", str(repo), "--good", good, "--bad", "zygote-bisect",
                          "--report-dir", str(tmp_path / "reports")],
                         capture_output=True, text=True, env=_plain_shell_env(), cwd=tmp_path, timeout=900)
    said = out.stdout + out.stderr
    assert out.returncode == 1, said
    assert f"first bad commit: {planted}" in said, said
    assert "zygote is not used" not in said and "cannot be tested" not in said, said


@pytest.mark.slow
def test_a_zygote_that_preloaded_another_triton_is_left_unused_and_its_steps_run_cold(checkouts, tmp_path,
                                                                                       monkeypatch):
    """A preload that differs from what a step needs: a warning and cold steps, never 'cannot be tested'."""
    from vmfuzz.harness.engine.regression import bisect_zygote as engine
    good, bad = checkouts
    env = _plain_shell_env()
    # no switches: the zygote imports triton as this shell would, compiled, where a step needs the interpreter
    with serving(env, probe_code=PROBE, switches=()) as sock:
        assert sock is not None, "the zygote did not start"
        said: list[str] = []
        assert engine.zygote_fits(sock, env, said.append) is False
        assert len(said) == 1 and "preloaded compiled" in said[0] and "starts cold" in said[0], said
        # a step handed that zygote all the same runs cold and gives its revision's verdict
        for key in ("TRITON_INTERPRET", "SGLANG_USE_CPU_ENGINE"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        log = tmp_path / "steps.jsonl"
        monkeypatch.setenv("VMFUZZ_BISECT_LOG", str(log))
        monkeypatch.setenv(ZYGOTE_ENV, sock)
        verdicts = [bisect_step.main([str(REPRO), "--repo", str(repo), "--target", "sglang"]) for repo in (good, bad)]
    assert verdicts == [bisect_step.GOOD, bisect_step.BAD], log.read_text()


@pytest.mark.slow
def test_a_zygote_set_up_as_a_cold_step_is_used(zygote_socket):
    """The same shell, with the switches the sglang target sets (the module's zygote): the zygote's
    triton is a step's."""
    from vmfuzz.harness.engine.regression import bisect_zygote as engine
    said: list[str] = []
    assert engine.zygote_fits(zygote_socket, _plain_shell_env(), said.append) is True, said
    assert said == []
