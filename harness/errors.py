"""Exit codes and the usage error, in a module of their own.

``python -m harness.cli`` runs cli.py as ``__main__``; a command module that
imported these from ``harness.cli`` would get a second copy of the class, which
the first copy's ``except`` does not catch.
"""

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input or an unavailable target: one line on stderr, exit 2."""
