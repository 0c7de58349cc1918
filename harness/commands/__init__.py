"""One module per command, each ``run(request) -> int`` (its typed request, ``vmfuzz.harness.commands.request``) returning its exit code."""

from vmfuzz.harness.commands import (bisect, compare, exhaustive, gate, install_sglang, merge, minimize, replay, run,
                              selftest, surface, targets, verify_policy)

COMMANDS = {"run": run.run, "gate": gate.run, "replay": replay.run, "minimize": minimize.run,
            "selftest": selftest.run, "targets": targets.run, "surface": surface.run, "bisect": bisect.run,
            "verify-policy": verify_policy.run, "compare": compare.run, "exhaustive": exhaustive.run,
            "merge": merge.run, "install-sglang": install_sglang.run}
