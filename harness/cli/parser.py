"""The argument parser: every command, every option, and the help text they show."""

from __future__ import annotations

import argparse

from vmfuzz.harness.engine.campaign.profiles import DEFAULT_DB_DIR, PROFILES
from vmfuzz.harness.model.errors import UsageError


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(f"{self.prog}: {message}")


TARGET_HELP = ("reference (default), sglang, or module:attr; layer a known-bad variant with +NAME "
               "(vmfuzz targets)")
OVERWRITE_HELP = ("write into a --report-dir that already holds reports (refused otherwise: "
                  "another run's summary would be replaced)")
REPORT_DIR_HELP = "default: reports/<UTC timestamp>-<pid>/"

EPILOG = """exit codes:
  0    every property held (or nothing to do: a skipped gate)
  1    a finding: the repro file is on disk before it is printed
  2    bad input or an unavailable target (one line on stderr)
  3    could not check: vmfuzz is out of step with the code under test
       (one line naming the seam and its file; never a finding), or the time
       ran out first (the pr cap; a budget spent before a property's search):
       the last line names each property and its examples of its fixed count
  130  interrupted by Ctrl-C (findings so far are kept, reports cover what ran)
  143  stopped by SIGTERM, SIGHUP, SIGQUIT or SIGUSR1 (the same)

Each command writes summary.json, summary.md and junit.xml to --report-dir
(default reports/<UTC timestamp>-<pid>/). `vmfuzz COMMAND --help` for its options."""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="vmfuzz", description="Property-based harness for SGLang's target-verify tree mask.",
               epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND",
                           title="commands")
    _run(sub)
    _replay(sub)
    _gate(sub)
    _minimize(sub)
    _selftest(sub)
    sub.add_parser("targets", help="list targets and known-bad variants")
    _surface(sub)
    _bisect(sub)
    _arithmetic(sub)
    _merge(sub)
    _compare(sub)
    _install_sglang(sub)
    return p


def _merge(sub) -> None:
    m = sub.add_parser("merge", help="join the report folders of a sharded run into one report")
    m.add_argument("dirs", nargs="+", metavar="DIR", help="a shard's report folder (its summary.json)")
    _report_dir(m)


def _common_run_args(p) -> None:
    p.add_argument("--workers", type=int, default=1, help="processes to spread the properties over")
    p.add_argument("--report-dir", default=None, metavar="DIR", help=REPORT_DIR_HELP)
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where tensors live")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="every boundary class each property reached, not the one-line summary")
    p.add_argument("--db", default=DEFAULT_DB_DIR, metavar="DIR|URL",
                   help=f"example database and last run's failures (pr reads it, nightly writes it; "
                        f"default {DEFAULT_DB_DIR}); redis://HOST:PORT/N shares the example database "
                        f"between machines (last failures then stay in {DEFAULT_DB_DIR})")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="run only shard K of N (the properties split round robin; shard 1 also replays "
                        "saved repros); vmfuzz merge joins the shards' report folders")
    p.add_argument("--isolate", choices=["auto", "on", "off"], default="auto",
                   help="run each example in a watched worker (auto: on for sglang and plug-in targets)")
    p.add_argument("--example-timeout", type=float, default=None, metavar="S",
                   help="seconds one example may take under isolation before it is a target-hang "
                        "(default 30, or the target's own for the profile)")
    _fail_on_known(p)
    p.add_argument("--repro-root", default=None, metavar="DIR",
                   help="canonical repros replayed first by the pr profile, instead of the ones that came with "
                        "vmfuzz (default: its checkout's repro/ or its installed package's; never ./repro)")
    p.add_argument("--repros", action="append", default=None, metavar="DIR",
                   help="more saved repros (DIR/NAME/*.json) replayed first, beside the canonical ones "
                        "(repeatable); the working directory's repro/ is never read: it may be the code under review")
    p.add_argument("--known", action="append", default=None, metavar="DIR",
                   help="more known findings (DIR/*.json), beside the ones that came with vmfuzz (repeatable); "
                        "the working directory's known/ is never read: it may be the code under review")


def _fail_on_known(p) -> None:
    p.add_argument("--fail-on-known", action="store_true",
                   help="exit 1 on known findings too (known/: upstream's defects, listed; by default only a "
                        "new finding group fails)")


def _device(p) -> None:
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where tensors live")


def _report_dir(p) -> None:
    p.add_argument("--report-dir", default=None, metavar="DIR", help=REPORT_DIR_HELP)
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def _run(sub) -> None:
    run = sub.add_parser("run", help="search every property for a counterexample")
    run.add_argument("--target", default="reference", help=TARGET_HELP)
    run.add_argument("--seed", type=int, default=None, help="makes the run reproducible (default: random, printed)")
    run.add_argument("--max-examples", type=int, default=None, help="examples per property (per round)")
    run.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run")
    run.add_argument("--profile", choices=sorted(PROFILES), default="dev",
                     help="; ".join(f"{p.name}: {p.summary}" for p in PROFILES.values()))
    run.add_argument("--property", action="append", dest="properties", metavar="NAME",
                     help="run only this property (repeatable)")
    run.add_argument("--deployment", default=None, metavar="FILE",
                     help="confine the search to one server configuration (JSON; docs/workflows.md, Deployments)")
    run.add_argument("--bounds", default=None, metavar="K=V,...",
                     help="case size ceiling, e.g. d=16,topk=8,spec_steps=6,max_bs=16,context=256 "
                          "(default: the target's, widened step by step in nightly)")
    run.add_argument("--no-share", dest="share", action="store_false",
                     help="search every property on its own (no shared runs of a case; for comparison)")
    _common_run_args(run)


def _replay(sub) -> None:
    rep = sub.add_parser("replay", help="re-run a repro file's property, or a deployment file's observed batch")
    rep.add_argument("file", metavar="FILE", help="repro file (only config and batches are required) or "
                     "deployment file (its observed batch with its config)")
    rep.add_argument("--target", default=None,
                     help="default: the target recorded in the file, else reference")
    rep.add_argument("--property", default=None, metavar="NAME",
                     help="default: the property recorded in the file, else every property that applies "
                     "(for a deployment file: the ones minimize tries on it)")
    _device(rep)
    rep.add_argument("--isolate", choices=["auto", "on", "off"], default="auto",
                     help="run in a watched worker (auto: on for sglang and plug-in targets)")
    rep.add_argument("--example-timeout", type=float, default=30.0, metavar="S",
                     help="seconds the case may take under isolation before it is a target-hang")
    _fail_on_known(rep)
    _report_dir(rep)


def _gate(sub) -> None:
    gate = sub.add_parser("gate", help="pr profile, only when the change touches verify-mask code")
    gate.add_argument("--target", default="sglang",
                      help="sglang (default: a gate on the reference model tests no SGLang code), reference, "
                           "or module:attr; layer a known-bad variant with +NAME (vmfuzz targets)")
    which = gate.add_mutually_exclusive_group()
    which.add_argument("--changed-files", default=None, metavar="FILE", help="one changed path per line")
    which.add_argument("--base", default=None, metavar="REV", help="changed paths from git diff REV...HEAD")
    gate.add_argument("--repo", default=None, metavar="PATH",
                      help="the checkout under test: where --base is diffed, or the root --changed-files "
                           "paths are relative to (default: the current directory); in an SGLang checkout, "
                           "--target sglang tests its python/sglang, not the installed one; given with "
                           "--target sglang, it must be one (holding python/sglang/__init__.py)")
    gate.add_argument("--property", action="append", dest="properties", metavar="NAME",
                      help="search only this property (repeatable; default every one); saved repros still replay")
    gate.add_argument("--time-cap", type=float, default=None, metavar="S", dest="time_budget",
                      help="seconds the whole gate may take, from its start to its exit (default: the pr "
                           "profile's 300); what it stops is could not check (exit 3), and the gate ends "
                           "within a grace of a tenth of the cap (5 to 30 s)")
    _common_run_args(gate)


def _minimize(sub) -> None:
    mini = sub.add_parser("minimize", help="shrink a failing repro or deployment file")
    mini.add_argument("file", metavar="FILE", help="repro file or deployment file")
    mini.add_argument("--target", default=None, help="default: the target recorded in a repro file, else reference")
    mini.add_argument("-o", "--output", default=None, metavar="OUT",
                      help="repro file to write (default: REPORT_DIR/<FILE's name>.min.json)")
    mini.add_argument("--property", default=None, metavar="NAME",
                      help="the property to keep failing (default: the repro's, else the first that fails)")
    _fail_on_known(mini)
    _device(mini)
    _report_dir(mini)


def _selftest(sub) -> None:
    st = sub.add_parser("selftest", help="prove the properties catch every catalogued variant")
    st.add_argument("--target", default="reference", help="the target the variants are layered over")
    st.add_argument("--seed", type=int, default=0, help="search seed (default 0: the matrix is reproducible)")
    st.add_argument("--max-examples", type=int, default=100, help="examples per property before a variant survives it")
    st.add_argument("--variant", action="append", dest="variants", metavar="NAME",
                    help="only this catalogued variant (repeatable; default every one, see vmfuzz targets)")
    _device(st)
    _report_dir(st)


def _surface(sub) -> None:
    surf = sub.add_parser("surface", help="each part of SGLang's mask path: which property drives it, or why none")
    surf.add_argument("--target", default="sglang", help="whose mask path to list (default sglang: the installed package)")
    surf.add_argument("--json", action="store_true", help="print the rows as JSON")
    surf.add_argument("--report-dir", default=None, metavar="DIR", help=REPORT_DIR_HELP)


def _bisect(sub) -> None:
    bis = sub.add_parser("bisect", help="first commit of an SGLang checkout on which a repro fails (git bisect run)")
    bis.add_argument("repro", metavar="REPRO", help="repro file to replay at each revision")
    bis.add_argument("--repo", required=True, metavar="PATH",
                     help="SGLang checkout (python/sglang/...); left on the branch it was on")
    bis.add_argument("--good", required=True, metavar="REV", help="a revision on which the repro holds")
    bis.add_argument("--bad", required=True, metavar="REV", help="a later revision on which it fails")
    bis.add_argument("--target", default="sglang", help="target loaded from each revision's code (default sglang)")
    bis.add_argument("--property", default=None, metavar="NAME",
                     help="default: the repro's property, else every property that applies")
    bis.add_argument("--timeout", type=float, default=600.0, metavar="S",
                     help="seconds one revision's replay may take before it counts as a hang (bad)")
    _report_dir(bis)


def _arithmetic(sub) -> None:
    """The two commands that enumerate instead of search: the policy grid and the small scope."""
    for name, helptext in (("verify-policy", "capacity soundness/liveness over a production-scale grid"),
                           ("exhaustive", "every configuration within small bounds, every property")):
        cmd = sub.add_parser(name, help=helptext)
        cmd.add_argument("--target", default="reference", help=TARGET_HELP)
        _report_dir(cmd)
        if name == "exhaustive":
            cmd.add_argument("--workers", type=int, default=2, help="processes checking configurations")


def _compare(sub) -> None:
    cmp = sub.add_parser("compare", help="what changed between two runs' report directories",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="exit 0: nothing new is failing in B (groups fixed or still failing are said);\n"
                                "exit 1: B has a finding group A did not have;\n"
                                "exit 2: a directory holds no run or gate reports (one line)")
    cmp.add_argument("a", metavar="A", help="the earlier run's report directory (holds summary.json)")
    cmp.add_argument("b", metavar="B", help="the later run's report directory")
    _report_dir(cmp)


def _install_sglang(sub) -> None:
    ins = sub.add_parser("install-sglang", help="install SGLang for the sglang target, CPU-only, into this Python",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="exit 0: installed (or already there), or --check found it importing;\n"
                                "exit 2: an unknown release, or --from is no SGLang checkout (one line);\n"
                                "exit 3: the install or the check failed (its last lines say why)")
    ins.add_argument("--version", default=None, metavar="V",
                     help="the SGLang release (default: the newest one vmfuzz has pins for)")
    ins.add_argument("--from", default=None, metavar="PATH",
                     help="an SGLang source checkout (PATH/python/sglang/), installed editable")
    ins.add_argument("--check", action="store_true",
                     help="install nothing: say whether the installed SGLang imports with every module vmfuzz drives")
