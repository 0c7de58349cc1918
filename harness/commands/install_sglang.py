"""``vmfuzz install-sglang``: SGLang for the ``sglang`` target, into the Python vmfuzz runs in.

The one installer is a shell script shipped with its pins (``scripts/sglang/`` in a checkout,
``harness/shipped/sglang_install`` in a wheel): SGLang's own requirements pull a CUDA torch and
GBs of wheels, so it installs ``--no-deps`` and lays the release's pinned CPU import chain over
it. This command only finds that script and runs it for ``sys.executable``, so a wheel's user
gets what a checkout's user gets without a repository script they do not have.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from vmfuzz.harness.commands.request import InstallRequest
from vmfuzz.harness.model.errors import EXIT_COULD_NOT_CHECK, EXIT_OK, EXIT_USAGE, UsageError

#: the script's own codes: 2 is bad usage (an unknown release, no checkout at --from);
#: anything else non-zero is an install or a check that failed, which vmfuzz cannot proceed past
SCRIPT_USAGE = 2


def run(request: InstallRequest) -> int:
    from vmfuzz.harness.targets.sglang.loader import installer
    script = installer()
    if script is None:
        raise UsageError("vmfuzz install-sglang: this installation of vmfuzz has no SGLang installer "
                         "(harness/shipped/sglang_install); reinstall vmfuzz")
    bash = shutil.which("bash")
    if bash is None:
        raise UsageError("vmfuzz install-sglang: needs bash on PATH to run its installer")
    cmd = [bash, str(script), "--python", sys.executable]
    if request.version:
        cmd += ["--version", request.version]
    if request.source is not None:
        cmd += ["--from", str(request.source)]
    if request.check:
        cmd.append("--check")
    code = subprocess.run(cmd).returncode
    if code == 0:
        return EXIT_OK
    if code == SCRIPT_USAGE:
        return EXIT_USAGE  # the script said which input it refused, in one line
    print(f"vmfuzz install-sglang: {'the check' if request.check else 'the install'} failed "
          f"(installer exit {code}; the lines above say why)", file=sys.stderr)
    return EXIT_COULD_NOT_CHECK
