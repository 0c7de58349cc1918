"""Exit codes and the errors that map to them.

They sit at the bottom of the layers so that every layer can raise them and
the command line, at the top, can map each to its exit code.
"""

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input or an unavailable target: one line on stderr, exit 2."""


class HarnessError(RuntimeError):
    """The harness failed, not the target: reported as such (exit 2), never as a finding."""
