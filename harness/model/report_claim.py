"""One run per report folder, claimed atomically before any work.

Two runs started together on one new ``--report-dir`` both pass the check for
existing reports (there are none yet); without a claim both would write there,
and one's summary would sit beside the other's findings. The claim is an
exclusive ``flock`` on a file in the folder, held for the process's life: the
kernel drops it when the process ends however it ends, so a killed run leaves no
stale claim to clear by hand, and exactly one of two racing runs gets it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from vmfuzz.harness.model.errors import UsageError

#: the claim's file, hidden beside the reports (it names the pid that holds it)
CLAIM = ".vmfuzz-claim"

#: folder (resolved) -> the open claim, kept open for as long as this process lives
_held: dict[Path, int] = {}


def claim(report_dir: Path) -> Path:
    """``report_dir`` (created already), now this process's alone; exit 2 when another run holds it."""
    import fcntl
    real = Path(report_dir).resolve()
    if real in _held:
        return report_dir
    try:
        fd = os.open(real / CLAIM, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:  # a link or something unopenable planted where the claim goes
        raise UsageError(f"vmfuzz: --report-dir {report_dir}: cannot claim it ({CLAIM}: "
                         f"{exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"vmfuzz: --report-dir {report_dir}: {CLAIM} is not a regular file; remove it")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
        os.close(fd)
        raise UsageError(f"vmfuzz: --report-dir {report_dir} is in use by another vmfuzz run"
                         + (f" (pid {holder})" if holder.isdigit() else "")
                         + "; choose another directory, or wait for that run to end") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # a full disk: the pid only helps a person read a refusal; the lock is the claim
    _held[real] = fd
    return report_dir
