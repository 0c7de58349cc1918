"""Running the CLI the way a user does: a subprocess in the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def vmfuzz(*args: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true", **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=cwd or ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
