"""Benchmark: real SGLang release diffs gated as pull requests, and what of them never ran.

Not a test: it prints one row per diff.

    python3 bench/release_diffs.py 0.5.22:0.5.23 0.5.23:0.5.22@0.5.23 \\
        --venv 0.5.23=/work/main/.venv [--dir DIR] [--json FILE]

A diff ``BASE:HEAD`` is built from the two release wheels (``pip download --no-deps``,
cached in ``DIR/wheels``): a git checkout laid out as SGLang's repository
(``python/sglang/...``, ``python/pyproject.toml``) whose first commit is BASE's
package, tagged ``vBASE``, and whose next commit is HEAD's. ``BASE`` after ``HEAD``
is a reverse PR (a newer tree set back to an older one). From that checkout it runs

    vmfuzz gate --target sglang --base vBASE --report-dir R --db D

with the python of an environment whose installed SGLang is ENV (``@ENV``; HEAD when
not given: each PR runs in its own release's environment). ``--venv V=DIR`` names
that environment; else ``DIR/venv-V`` is used, and ``--build`` makes a missing one
(scripts/bootstrap.sh + scripts/install_sglang.sh --version V, niced).
vmfuzz itself is this checkout's (``PYTHONPATH``), whatever the venv has installed.

From the report's gate section it counts the changed statements on the mask's path (the
surface's functions of each triggered file, and what the gate names as not driven; each
counted once, by its first line, as the gate counts them): ran under a property;
never ran because they **need a GPU** (the reviewed device table); **not driven here**
(a function no property drives, or a branch vmfuzz never takes); **other** (inside a
function a property drives, but this line's configuration was not reached). The bar
it measures: (not driven + other) <= 5 % of the changed mask-path statements. The
triggered files' other changed lines (modules the properties' runs touched, outside the
mask's functions) are counted apart, as ran / never ran "off the path": the gate still
asks for each of them, so a diff with any never-ran one exits 3 whatever the bar says.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BAR = 0.05
PYPROJECT = ('[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n\n'
             '[project]\nname = "sglang"\nversion = "{v}"\nrequires-python = ">=3.10"\n\n'
             '[tool.setuptools.packages.find]\ninclude = ["sglang*"]\n')
IGNORE = "__pycache__/\n*.egg-info/\nreports/\n.vmfuzz-db/\n"
CATEGORIES = ("judged", "needs_gpu", "not_driven", "other")


class Stop(Exception):
    """A bad argument or a failed step: one line, exit 2."""


def wheel(version: str, cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if not found:
        out = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}",
                              "-d", str(cache)], capture_output=True, text=True)
        found = sorted(cache.glob(f"sglang-{version}-*.whl"))
        if not found:
            raise Stop(f"pip download sglang=={version} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return found[0]


def lay_out(whl: Path, version: str, repo: Path) -> None:
    """The wheel's ``sglang`` package as SGLang's repository keeps it (replacing what was there)."""
    shutil.rmtree(repo / "python", ignore_errors=True)
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if name.startswith("sglang/") and not name.endswith("/"):
                z.extract(name, repo / "python")
    (repo / "python" / "pyproject.toml").write_text(PYPROJECT.format(v=version))


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "release", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "release", "GIT_COMMITTER_EMAIL": "bench@example.invalid"}
    out = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    if out.returncode:
        raise Stop(f"git {' '.join(args[:2])} in {repo} failed: {out.stderr.strip()[:200]}")
    return out.stdout.strip()


def checkout(base: str, head: str, work: Path) -> Path:
    """``work/repos/BASE-HEAD``: BASE's tree tagged vBASE, then HEAD's tree; reused when built."""
    repo = work / "repos" / f"{base}-{head}"
    if (repo / ".git").is_dir() and git(repo, "log", "-1", "--format=%s") == f"SGLang {head}":
        git(repo, "reset", "-q", "--hard")
        git(repo, "clean", "-qfdx", "-e", "reports", "-e", ".vmfuzz-db")
        return repo
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "gc.auto", "0")
    (repo / ".gitignore").write_text(IGNORE)
    for n, v in enumerate((base, head)):
        lay_out(wheel(v, work / "wheels"), v, repo)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"SGLang {v}")
        if n == 0:
            git(repo, "tag", f"v{base}")
    return repo


def venv_for(env: str, given: dict[str, str], work: Path, build: bool) -> Path:
    venv = Path(given.get(env) or work / f"venv-{env}")
    if not (venv / "bin" / "python").exists():
        if not build:
            raise Stop(f"no environment with sglang {env}: pass --venv {env}=DIR, or --build to make {venv}")
        environ = {**os.environ, "VMFUZZ_VENV": str(venv)}
        for cmd in (["bash", "scripts/bootstrap.sh"], ["bash", "scripts/install_sglang.sh", "--version", env]):
            if subprocess.run(["nice", "-n", "10", *cmd], cwd=ROOT, env=environ).returncode:
                raise Stop(f"building {venv} failed at {' '.join(cmd)}")
    got = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('sglang'))"],
                         capture_output=True, text=True).stdout.strip()
    if got != env:
        raise Stop(f"{venv} has sglang {got or 'not installed'}, not {env}")
    return venv


def functions_of(path: str) -> list[tuple[int, int, str, bool]]:
    """(first, last, qualified name, is a class) of every function and class in a file, outer first."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError):
        return []
    out = []

    def walk(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{scope}.{child.name}" if scope else child.name
                out.append((child.lineno, child.end_lineno, qual, isinstance(child, ast.ClassDef)))
                walk(child, qual)
            else:
                walk(child, scope)
    walk(tree, "")
    return out


def home(functions: list[tuple[int, int, str, bool]], line: int) -> str:
    inner = [f for f in functions if f[0] <= line <= f[1] and not f[3]]
    return max(inner, key=lambda f: f[0])[2] if inner else "<module>"


def on_path(functions: list[tuple[int, int, str, bool]], line: int, mask_path: dict) -> bool:
    """Whether a line lies in a function or class the gate counts as the mask's path."""
    return any(f[0] <= line <= f[1] and f[2] in mask_path for f in functions)


def reason(why: str) -> str:
    """A never-ran line's category from the gate's ``why_never_ran``: "not_driven" or "other"."""
    if why.startswith("not driven"):  # a branch vmfuzz never takes (the CPU-engine table)
        return "not_driven"
    said = why.split(": ", 1)[1] if ": " in why else why  # "Class.fn: what drives it"
    return "not_driven" if said.startswith("not driven") else "other"


def classify(gate: dict, read_functions=functions_of) -> dict:
    """Counts per category, per file and per function, from a summary's gate section."""
    totals: Counter = Counter()
    by_function: dict[str, Counter] = {}
    untraced = []
    graph: dict[str, str] = {}
    graph_judges: set[str] = set()  # the properties that ran a changed line of the target's graph runner
    for f in gate.get("lines") or []:
        if f.get("traced") is None:
            # the gate's file-level reason first: it is the one its verdict and "needs a GPU" list use
            why = (gate.get("why_not_driven") or {}).get(f["path"]) or f.get("why_untraced") or "?"
            untraced.append(f"{f['path']}: {why}")
            continue
        funcs = read_functions(f["traced"])
        rows = [(int(n), "judged") for n in f.get("judged") or {}]
        rows += [(n, "needs_gpu") for n in f.get("needs_device") or []]
        rows += [(n, reason((f.get("why_never_ran") or {}).get(str(n), ""))) for n in f.get("never_ran") or []]
        for n, cat in rows:
            # The bar is over the mask's path as the issue measured it: the surface's functions, and
            # whatever the gate itself names as a harness gap. A triggered file's other lines (a
            # module the properties' runs touched, e.g. environ.py) are counted apart, both ways.
            if cat != "not_driven" and not on_path(funcs, n, f.get("functions") or {}):
                totals["judged_off_path" if cat == "judged" else "unrun_off_path"] += 1
                continue
            totals[cat] += 1
            name = f"{f['path'].rsplit('/', 1)[-1]}:{home(funcs, n)}"
            if cat == "judged" and "DecodeCudaGraphRunner" in name:
                graph_judges.update(f["judged"][str(n)])
            by_function.setdefault(name, Counter())[cat] += 1
        for qual, info in (f.get("functions") or {}).items():
            if "CudaGraphRunner" in qual:
                graph[qual] = f"{info.get('ran', 0)}/{info.get('statements', 0)} ran"
    changed = sum(totals[c] for c in CATEGORIES)
    unrun = totals["not_driven"] + totals["other"]
    top = sorted(((n, c) for n, c in by_function.items() if c["not_driven"] + c["other"] + c["needs_gpu"]),
                 key=lambda nc: -(nc[1]["not_driven"] + nc[1]["other"] + nc[1]["needs_gpu"]))
    files: Counter = Counter()
    for name, k in by_function.items():
        files[name.split(":", 1)[0]] += k["not_driven"] + k["other"]
    return {"changed": changed, **{c: totals[c] for c in CATEGORIES}, "judged_off_path": totals["judged_off_path"],
            "unrun_off_path": totals["unrun_off_path"],
            "unrun_share": round(unrun / changed, 4) if changed else None,
            "meets_bar": bool(changed) and unrun <= BAR * changed,
            "top": [{"function": n, **{c: k[c] for c in CATEGORIES}} for n, k in top],
            "untraced": untraced, "graph_runner": graph,
            "graph_judged_by": sorted(graph_judges),
            "top_files": [[n, k] for n, k in files.most_common() if k]}


def gate_pr(spec: str, args, venvs: dict[str, str]) -> dict:
    pair, _, env = spec.partition("@")
    base, sep, head = pair.partition(":")
    if not sep or not base or not head or base == head:
        raise Stop(f"{spec!r} is not BASE:HEAD[@ENV] (two different releases)")
    env = env or head
    work = Path(args.dir).resolve()
    venv = venv_for(env, venvs, work, args.build)
    repo = checkout(base, head, work)
    report, db = work / "reports" / f"{base}-{head}@{env}", work / "db" / f"{base}-{head}@{env}"
    for d in (report, db):
        shutil.rmtree(d, ignore_errors=True)
    log = work / "logs" / f"{base}-{head}@{env}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [str(venv / "bin" / "python"), "-m", "vmfuzz", "gate", "--target", "sglang", "--base", f"v{base}",
           "--report-dir", str(report), "--db", str(db)]
    if args.time_cap is not None:  # a loaded machine: the gate's own cap would cut the count short
        cmd += ["--time-cap", f"{args.time_cap:g}"]
    t0 = time.monotonic()
    with open(log, "w") as out:
        try:
            rc = subprocess.run(cmd, cwd=repo, env=environ, stdout=out, stderr=subprocess.STDOUT,
                                timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    row = {"diff": f"{base}→{head}", "env": env, "exit": rc, "seconds": round(time.monotonic() - t0, 1),
           "log": str(log), "report": str(report)}
    summary = report / "summary.json"
    if not summary.is_file():
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:]
        return {**row, "error": f"no summary.json ({tail[0] if tail else 'no output'})"}
    gate = json.loads(summary.read_text()).get("gate") or {}
    return {**row, "changed_files": len(gate.get("changed") or []), "triggered": len(gate.get("triggered") or []),
            **classify(gate)}


def rescore(files: list[str]) -> list[dict]:
    """The rows of earlier runs, counted again from their reports (exit and wall time as recorded)."""
    rows = []
    for name in files:
        for row in json.loads(Path(name).read_text()):
            summary = Path(row["report"]) / "summary.json"
            if summary.is_file():
                row.update(classify(json.loads(summary.read_text()).get("gate") or {}))
            rows.append(row)
    return rows


def pct(n: int, d: int) -> str:
    return f"{n} ({100 * n / d:.0f} %)" if d else str(n)


def table(rows: list[dict], top: int) -> str:
    lines = ["| diff (env) | exit | wall s | files changed / triggered | changed mask-path stmts | ran under a property"
             " | needs a GPU | not driven here | other | unrun but GPU (bar <= 5 %) | off the path: ran / never ran |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['diff']} ({r['env']}) | {r['exit']} | {r['seconds']} | {r['error']} ||||||||")
            continue
        d = r["changed"]
        share = f"{100 * r['unrun_share']:.1f} %" if r["unrun_share"] is not None else "-"
        lines.append(f"| {r['diff']} ({r['env']}) | {r['exit']} | {r['seconds']} | {r['changed_files']} / "
                     f"{r['triggered']} | {d} | {pct(r['judged'], d)} | {pct(r['needs_gpu'], d)} | "
                     f"{pct(r['not_driven'], d)} | {pct(r['other'], d)} | {share} "
                     f"({'meets' if r['meets_bar'] else 'misses'}) | {r.get('judged_off_path', 0)} / "
                     f"{r.get('unrun_off_path', 0)} |")
    for r in rows:
        if "error" in r:
            continue
        lines.append(f"\n{r['diff']} ({r['env']}): top functions by unrun statements "
                     "(not driven / other / needs a GPU)")
        lines += [f"- {t['function']}: {t['not_driven']} / {t['other']} / {t['needs_gpu']}"
                  for t in r["top"][:top]]
        lines.append("- files by unrun statements, not counting GPU: "
                     + ", ".join(f"{n} {k}" for n, k in r["top_files"][:top]))
        lines += [f"- untraced: {u}" for u in r["untraced"]]
        lines += [f"- graph runner {q}: {s}" for q, s in sorted(r["graph_runner"].items())] or \
            ["- graph runner: no changed CudaGraphRunner function measured"]
        lines.append("- changed DecodeCudaGraphRunner statements judged by: "
                     + (", ".join(r["graph_judged_by"]) or "no property"))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("diffs", nargs="*", metavar="BASE:HEAD[@ENV]")
    p.add_argument("--rescore", metavar="FILE", action="append", default=[],
                   help="gate nothing: count again from the reports a --json FILE names")
    p.add_argument("--venv", action="append", default=[], metavar="V=DIR",
                   help="an environment whose installed sglang is V")
    p.add_argument("--dir", default=os.environ.get("VMFUZZ_RELEASES_DIR", "/tmp/vmfuzz-release-diffs"))
    p.add_argument("--build", action="store_true", help="build a missing DIR/venv-V")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per gate (default 3600)")
    p.add_argument("--time-cap", type=float, default=None, metavar="S",
                   help="the gate's --time-cap (default: the gate's own)")
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = p.parse_args(argv)
    try:
        venvs = dict(v.split("=", 1) for v in args.venv)
    except ValueError:
        print("release_diffs: --venv takes V=DIR", file=sys.stderr)
        return 2
    rows, failed = rescore(args.rescore), 0
    if not rows and not args.diffs:
        print("release_diffs: name a BASE:HEAD diff or a --rescore FILE", file=sys.stderr)
        return 2
    for spec in args.diffs:
        print(f"release_diffs: gating {spec}", file=sys.stderr, flush=True)
        try:
            rows.append(gate_pr(spec, args, venvs))
        except Stop as exc:  # the other diffs still run
            print(f"release_diffs: {spec}: {exc}", file=sys.stderr)
            failed += 1
    if rows:
        print(table(rows, args.top))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
