"""The bisect's zygote: started for its steps, checked against what a step needs, or left unused.

Each step imports its revision's SGLang in a child forked from the zygote
(``vmfuzz.harness.engine.core.zygote``), the third-party packages already
there; this module says what the zygote preloads, starts it with the
import-time switches a cold step sets, and checks once that a forked child
holds the triton a step would import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vmfuzz.harness.engine.core.zygote_client import ZYGOTE_ENV


def steps_zygote(env: dict, target: str):
    """The steps' zygote (``vmfuzz.harness.engine.core.zygote``): each step imports this revision's SGLang
    in a child forked from it, the third-party packages already there. ``VMFUZZ_BISECT_ZYGOTE=0``,
    or a zygote that cannot start, leaves every step cold, with the same verdicts."""
    import contextlib

    from vmfuzz.harness.engine.core.zygote_client import serving

    if os.environ.get("VMFUZZ_BISECT_ZYGOTE", "1") == "0":
        return contextlib.nullcontext(None)
    from vmfuzz.harness.targets.sglang.loader import IMPORT_SWITCHES
    return serving(env, probe_code=zygote_probe(target), switches=IMPORT_SWITCHES)


#: run in a child forked from the zygote: writes why its preload is not what a step needs (or nothing)
_FITS_CHECK = ("import sys\nfrom vmfuzz.harness.targets.sglang.loader import preload_mismatch\n"
               "why = preload_mismatch()\nwith open(sys.argv[1], 'w') as f:\n    f.write(why or '')\nsys.exit(1 if why else 0)")


def zygote_fits(sock: str, env: dict, echo) -> bool:
    """Does a child forked from the zygote hold what a step needs (the triton this host runs)?
    One that does not is left unused, with a warning: every step then runs cold, as it would
    without a zygote, and none is ever "cannot be tested" for what the zygote preloaded."""
    import tempfile

    from vmfuzz.harness.engine.core.zygote_client import Lost, spawn
    with tempfile.TemporaryDirectory(prefix="vmfuzz-zygote-check-") as where:
        answer = Path(where) / "why"
        forked = spawn([sys.executable, "-c", _FITS_CHECK, str(answer)], env={**env, ZYGOTE_ENV: sock}, cwd=where)
        rc = None
        if forked is not None:
            try:
                rc = forked.wait(timeout=120)
            except (Lost, subprocess.TimeoutExpired):
                forked.kill()
        why = answer.read_text().strip() if answer.exists() else ""
    if rc == 0:
        return True
    echo(f"vmfuzz bisect: warning: the steps' zygote is not used ({why or f'its check ended with {rc}'}); "
         "every step starts cold")
    return False


def zygote_probe(target: str) -> str:
    """What a cold step imports besides the checkout's SGLang: the zygote preloads what this loads."""
    return ("import vmfuzz.harness.cli\nfrom vmfuzz.harness.engine.regression import bisect_step, replay\n"
            f"try:\n    from vmfuzz.harness.targets import resolve\n    resolve({target!r})\nexcept Exception:\n    pass")
