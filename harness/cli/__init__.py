"""``vmfuzz``: parse the arguments, run one command, end with a documented exit code.

Nothing else lives here: each command's body is a module of ``vmfuzz.harness.commands``.
"""

from __future__ import annotations

from vmfuzz.harness.cli.ending import guarded, leave
from vmfuzz.harness.cli.parser import build_parser
from vmfuzz.harness.commands import COMMANDS
from vmfuzz.harness.commands.common import prepare_process
from vmfuzz.harness.commands.request import request_of


def main(argv: list[str] | None = None) -> int:
    from vmfuzz.harness.engine.core import clock
    clock.entered(process_entry=argv is None)  # a gate's time cap counts from here, the process's start
    code = guarded(_dispatch, argv)
    if argv is None:
        # The process's own entry (the ``vmfuzz`` script, ``python -m vmfuzz``): its work is done.
        leave(code)
    return code


def _dispatch(argv: list[str] | None) -> int:
    # read once, checked once: every command gets its typed request, never argparse's namespace
    request = request_of(build_parser().parse_args(argv))
    prepare_process()
    return COMMANDS[request.command](request)
