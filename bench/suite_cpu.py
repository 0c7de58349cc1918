"""The CPU seconds a command and every process it started spent, printed as one line.

    python bench/suite_cpu.py -- python -m pytest -p no:cacheprovider -n 0 tests/test_deep_corpus.py

``/usr/bin/time`` undercounts a test run: the tests' zygote (tests/zygote.py) is never waited for by
pytest, so the forked CLI runs it reaped (every gate on a copy, most CLI tests) are lost with it when it
exits as an orphan. Here this process is a child subreaper: orphans are handed to it, it waits for every
one of them, and the kernel's children's usage then holds the whole tree. Wall times on a shared 2-core
machine are noise; this number is what two runs of the same tests can be compared by (within ~10 %).
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: suite_cpu.py -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("suite_cpu: cannot become a child subreaper (Linux only)", file=sys.stderr)
        return 2
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.execvp(argv[0], argv)
    code = None
    while True:  # the command, then every orphan of its tree, until none is left
        try:
            done, status = os.wait()
        except ChildProcessError:
            break
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"cpu {used.ru_utime + used.ru_stime:.1f} s (user {used.ru_utime:.1f}, sys {used.ru_stime:.1f}), "
          f"wall {time.monotonic() - started:.1f} s, exit {code}")
    return code if code is not None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
