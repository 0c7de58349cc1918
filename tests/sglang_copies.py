"""Altered copies of the installed SGLang, the way a maintainer's bad PR would leave it.

The package tree is mirrored by symlinks, and only the directories down to an
edited file are real, so a copy costs milliseconds and no disk; a subprocess
with the copy first on PYTHONPATH imports it instead of the installed package.
"""

from __future__ import annotations

import re
from importlib.util import find_spec
from pathlib import Path

import pytest


#: Alterations whose catch is proved through the whole PR gate, by the property meant to catch them
#: (tests/test_gate_catches_parts.py, which checks this set against its own list): their module's
#: ``run --property`` test leaves them out, since a whole run on a copy costs 10-25 s of CI and the
#: gate's run asks the same of them.
THROUGH_THE_GATE = frozenset({
    "pp-fits-admits-one-more", "chain-positions-off-by-one", "frozen-mtp-short-length-sum",
    "eager-indptr-precedence", "replay-indptr-slot-early", "pack-bit-order", "hybrid-mask-from-decode",
    "tbo-mask-from-overlap-child", "linear-mask-from-linear-child", "triton-allocates-max-bs-minus-one",
})


def run_cases(alterations) -> list[str | None]:
    """The unaltered copy (None) and each alteration the gate test does not already run."""
    return [None, *(name for name in alterations if name not in THROUGH_THE_GATE)]


def _mirror(src: Path, dst: Path, package: Path, edited: dict[Path, str]) -> None:
    """``dst`` looks like ``src``: symlinks, except real directories down to each edited file.

    A real directory gets no ``__pycache__``: the installed bytecode of an edited
    module must not stand in for its edited source.
    """
    dst.mkdir(parents=True)
    on_path = {p for rel in edited for p in rel.parents}
    for entry in src.iterdir():
        rel = entry.relative_to(package)
        if rel in edited:
            (dst / entry.name).write_text(edited[rel])
        elif entry.is_dir() and rel in on_path:
            _mirror(entry, dst / entry.name, package, edited)
        elif entry.name != "__pycache__":
            (dst / entry.name).symlink_to(entry)


def altered_copy(tmp_path: Path, edits, name: str | None = None, package: Path | None = None) -> Path:
    """A site directory whose ``sglang`` is the installed one with ``edits`` applied.

    ``edits``: (file candidates under the package, regex, replacement); the
    first candidate the regex matches is edited. An edit that no longer applies
    fails the test: the alteration would silently test nothing. ``package``: another
    environment's ``sglang`` (an older release's) instead of this one's.
    """
    package = package or Path(find_spec("sglang").origin).parent
    edited: dict[Path, str] = {}
    for files, pattern, repl in edits:
        for rel in map(Path, files):
            text = edited.get(rel) or ((package / rel).read_text() if (package / rel).exists() else "")
            if re.search(pattern, text):
                edited[rel] = re.sub(pattern, repl, text)
                break
        else:
            pytest.fail(f"alteration {name!r} no longer applies to the installed SGLang ({package}): "
                        f"{pattern!r} not found in {files}")
    site = tmp_path / "site"
    _mirror(package, site / "sglang", package, edited)
    return site


#: Prints which sglang was imported, so a test can prove the copy (not the
#: installed package) ran, then runs the CLI with the remaining arguments.
_CLI_ON_COPY = ("import sys, sglang; print('sglang from', sglang.__file__); "
                "from vmfuzz.harness.cli import main; sys.exit(main(sys.argv[1:]))")


def run_on_copy(site: Path, tmp_path: Path, *cli_args: str, timeout: float = 600, python: str | None = None):
    """``vmfuzz CLI_ARGS`` in a subprocess importing the copy at ``site``; returns (process, its output).
    ``python``: the interpreter of the environment the copy was made from, when not this one.

    Fails the test if the installed package, not the copy, was imported.
    """
    import os
    import sys

    from tests import zygote
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(root)]), PYTHONDONTWRITEBYTECODE="1",
               TRITON_INTERPRET="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    proc = zygote.run([python or sys.executable, "-W", "ignore", "-c", _CLI_ON_COPY, *cli_args], env=env,
                      cwd=tmp_path, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert f"sglang from {site}" in out, out
    return proc, out


def assert_caught_by(report_dir: Path, *props: str, out: str = "") -> None:
    """The run whose reports are in ``report_dir`` found the edit through one of ``props``.

    Read from summary.json's findings: at least one filed under one of
    ``props`` as the property's own failure, and none that is a raise. A
    harness or target that raised ("target raised", a crash, a hang) checked
    nothing, so it is never a catch. Other properties may see the same bug
    too (an overflow on the pp call site also breaks the trivial path there).
    """
    import json

    summary = json.loads((Path(report_dir) / "summary.json").read_text())
    findings = summary.get("findings") or []
    assert findings, f"no finding recorded (want one of {', '.join(props)})\n{out}"
    raised = [f for f in findings if f["kind"] != "property" or _raised(f["detail"], f.get("origin"))]
    assert not raised, f"caught only by raising, not by a property: {raised}\n{out}"
    assert "target raised" not in out, f"the run reports a raise: not a catch\n{out}"
    by = sorted({f["property"] for f in findings})
    assert set(by) & set(props), f"caught by {by}, want one of {', '.join(props)}\n{out}"


def _raised(detail: str, origin) -> bool:
    """A finding that is the target (or the harness) raising, in any of the forms one is written in:
    "target raised ..." anywhere in its detail (a replay says "fails again: target raised ..."), or
    an origin (summary.json's dict or an ``Origin``) whose effect is a raise, a crash or a hang."""
    effect = origin.get("effect") if isinstance(origin, dict) else getattr(origin, "effect", None)
    return "target raised" in detail or effect in ("raise", "crash", "hang")


def assert_not_a_raise(detail: str, origin=None) -> None:
    """A finding made by the target raising checked nothing: it is never a catch."""
    assert not _raised(detail, origin), f"caught only by raising, not by a property: {detail}"


def replay_on_copy(site: Path, tmp_path: Path, config: dict, seq_lens, prop: str):
    """``vmfuzz replay`` of one case (``config``, one batch of ``seq_lens``) on the copy at ``site``,
    checked by ``prop`` alone, in-process; returns (process, its output)."""
    return replay_steps_on_copy(site, tmp_path, config, [seq_lens], prop)


def replay_steps_on_copy(site: Path, tmp_path: Path, config: dict, steps, prop: str):
    """As ``replay_on_copy``, with a batch of lengths per step (``steps``: one ``seq_lens`` each)."""
    import json

    repro = tmp_path / "case.json"
    repro.write_text(json.dumps({"config": config, "batches": [{"seq_lens": list(s)} for s in steps]}))
    return run_on_copy(site, tmp_path, "replay", str(repro), "--target", "sglang", "--property", prop,
                       "--isolate", "off", "--report-dir", str(tmp_path / "report"))


def failed_check_origin(report_dir: Path, out: str = "") -> dict:
    """The origin of a replay's one check, which must have failed as a property's own check (not a raise)."""
    import json

    [check] = json.loads((Path(report_dir) / "summary.json").read_text())["checks"]
    assert (check["status"], check["kind"]) == ("failed", "property"), out
    assert_not_a_raise(check["detail"], check["origin"])
    return check["origin"]


def assert_altered_replay_caught(tmp_path: Path, edits, name: str, config: dict, seq_lens, prop: str,
                                 want: dict) -> None:
    """One case replayed on a copy altered by ``edits`` fails ``prop``'s own check (exit 1, never a raise),
    its origin naming each of ``want``'s fields as given."""
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, config, seq_lens, prop)
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert origin["property"] == prop and {f: origin[f] for f in want} == want, origin


def assert_altered_replay_holds(tmp_path: Path, edits, name: str, config: dict, seq_lens, prop: str) -> None:
    """One case replayed on a copy altered by ``edits`` (a rewrite that keeps behaviour) holds ``prop``."""
    proc, out = replay_on_copy(altered_copy(tmp_path, edits, name), tmp_path, config, seq_lens, prop)
    assert proc.returncode == 0 and f"held {prop}" in out, out


#: Runs the script its first argument names as ``python SCRIPT`` would (a ``-c`` the zygote can fork).
_RUN_SCRIPT = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def script_on_copy(tmp_path: Path, edits, name: str, script: str) -> list[str]:
    """``tests/SCRIPT`` run on a copy of the installed SGLang with ``edits`` applied, under Triton's
    interpreter: its stdout's lines (the scope scripts print one record per shape)."""
    import os
    import sys

    from tests import zygote
    root = Path(__file__).resolve().parent.parent
    site = altered_copy(tmp_path / name, edits, name)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(root)]), TRITON_INTERPRET="1",
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    # forked from the tests' zygote as a CLI run on a copy is (run_on_copy): the script as its own
    # process, without importing torch and its neighbours again
    proc = zygote.run([sys.executable, "-W", "ignore", "-c", _RUN_SCRIPT, str(root / "tests" / script)], env=env,
                      cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


#: The changed files of the pristine copy's whole gate: verify_mask.py for the deep corpus's pristine
#: case (tests/test_deep_corpus.py), the FA3 backend for no-silent-downgrade's (a file imported by the FA3
#: reader and the allocation sites only). One gate with both listed asks of each what its own gate asked
#: (every mask-path function of both measured, exit 0), for one whole gate of CI instead of two.
PRISTINE_GATE_CHANGES = ("python/sglang/srt/layers/attention/verify_mask.py",
                         "python/sglang/srt/layers/attention/flashattention_backend.py")


def _pristine_gate(folder: Path) -> dict:
    import json
    site = altered_copy(folder, [], "pristine")
    changed = folder / "changed.txt"
    changed.write_text("".join(f"{p}\n" for p in PRISTINE_GATE_CHANGES))
    report = folder / "report"
    proc, out = run_on_copy(site, folder, "gate", "--target", "sglang", "--changed-files", str(changed),
                            "--report-dir", str(report))
    said = {"returncode": proc.returncode, "stdout": proc.stdout, "out": out, "report": str(report)}
    (folder / "gate.json").write_text(json.dumps(said))
    return said


def pristine_gate(tmp_path_factory) -> dict:
    """The pristine copy's whole gate (``PRISTINE_GATE_CHANGES``), run once for the whole session where
    it can be: its folder is shared by the xdist workers, and a worker finding another one running it
    runs its own rather than wait idle (a worker waiting on a lock holds a core of CI's two unused).
    Returns returncode, stdout, out (stdout and stderr) and report (its folder); read it, never write."""
    import fcntl
    import json
    import os
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "pristine-gate"
    shared.mkdir(exist_ok=True)
    fd = os.open(shared / "lock", os.O_CREAT | os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _pristine_gate(tmp_path_factory.mktemp("pristine-gate"))
        said = shared / "gate.json"
        if said.is_file():
            return json.loads(said.read_text())
        # a first try that ended before its verdict (its test failed saying why) left its copy: run afresh
        return _pristine_gate(tmp_path_factory.mktemp("pristine-gate") if (shared / "site").exists() else shared)
    finally:
        os.close(fd)
