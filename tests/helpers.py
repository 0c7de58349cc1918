"""Running the CLI the way a user does: a subprocess, in the test's own folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: CI sets it: a test that needs SGLang then fails instead of skipping when SGLang cannot load.
REQUIRE_SGLANG = os.environ.get("VMFUZZ_REQUIRE_SGLANG") == "1"


def sglang_or_skip():
    """The ``sglang`` target, or skip with the reason (fail under VMFUZZ_REQUIRE_SGLANG=1)."""
    import pytest

    from vmfuzz.harness.targets import TargetUnavailable, resolve
    try:
        return resolve("sglang")
    except TargetUnavailable as exc:
        if REQUIRE_SGLANG:
            pytest.fail(f"VMFUZZ_REQUIRE_SGLANG=1 but the sglang target is unavailable: {exc}")
        pytest.skip(f"sglang target unavailable: {exc}")


def vmfuzz(*args: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None):
    """In the test's own folder unless told (conftest puts each test in one): a run without
    --report-dir writes its reports there, not into the checkout's reports/."""
    from tests import zygote
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true", **(env or {})}
    return zygote.run([sys.executable, "-m", "vmfuzz.harness.cli", *args], cwd=cwd or Path.cwd(), env=full_env,
                      timeout=timeout)


def held_or_only_known(proc, out: str, report_dir) -> None:
    """A pristine run holds: exit 0, its only finding groups (if any) known ones (``known/``),
    which every command lists and passes on."""
    import json
    assert proc.returncode == 0, out
    s = json.loads((Path(report_dir) / "summary.json").read_text())
    if "new_groups" in s.get("counts", {}):
        assert s["counts"]["new_groups"] == 0, out
