"""One module per command, each ``run(args) -> int`` returning its exit code."""

from harness.commands import (bisect, exhaustive, gate, merge, minimize, replay, run, selftest, surface,
                              targets, verify_policy)

COMMANDS = {"run": run.run, "gate": gate.run, "replay": replay.run, "minimize": minimize.run,
            "selftest": selftest.run, "targets": targets.run, "surface": surface.run, "bisect": bisect.run,
            "verify-policy": verify_policy.run, "exhaustive": exhaustive.run, "merge": merge.run}
