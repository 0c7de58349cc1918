"""Stillborn mutants: a mutated Triton kernel that Triton's own compiler refuses.

On a CPU host the gate runs Triton kernels in Triton's interpreter, where a
mutant such as ``tl.load(ptr ** row)`` raises at launch. On a GPU the kernel
would never have been built: Triton's frontend refuses it while lowering to
TTIR. Mutation testing calls such a mutant non-viable (stillborn) and leaves it
out of the score. This module decides it by compiling, never by reading an
exception: each kernel launch the gate makes is recorded with its arguments'
Triton types (``record``), and the mutated kernel is then compiled by Triton's
frontend to TTIR for a CUDA target (sm_90) with those types (``refusal``),
stopping there: no PTX, no GPU. The same kernel of the installed SGLang is
compiled first with the same types; if that fails too, nothing is decided.

    python bench/stillborn.py LAUNCHES.jsonl VMFUZZ_ARGS...   # vmfuzz VMFUZZ_ARGS, launches recorded
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

#: the CUDA target the frontend compiles for: (backend, compute capability, warp size)
CUDA_TARGET = ("cuda", 90, 32)


def record(path: Path) -> None:
    """From now on, every interpreted kernel launch in this process (and its forks) appends a line to
    ``path``: the kernel's file and name, each argument's Triton type, the constexpr arguments' values."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import mangle_type

    run = InterpretedFunction.run

    def recorded(self, *args, grid, warmup, **kwargs):
        try:
            named = dict(zip(self.arg_names, args), **kwargs)
            consts = _constexpr_params(self.fn)
            launch = {"file": os.path.realpath(self.fn.__code__.co_filename), "kernel": self.fn.__name__,
                      "signature": {n: "constexpr" if n in consts else mangle_type(v) for n, v in named.items()},
                      "constexprs": {n: v for n, v in named.items()
                                     if n in consts or isinstance(v, (bool, type(None)))}}
            with open(path, "a") as out:
                out.write(json.dumps(launch, default=str) + "\n")
        except Exception as exc:  # a launch whose types cannot be written is left undecided, never faked
            with open(path, "a") as out:
                out.write(json.dumps({"unrecorded": f"{type(exc).__name__}: {exc}"}) + "\n")
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recorded


def _constexpr_params(fn) -> set[str]:
    import inspect
    return {p.name for p in inspect.signature(fn).parameters.values() if "constexpr" in str(p.annotation)}


def launches(path: Path, file: Path) -> list[dict]:
    """The distinct recorded launches of kernels defined in ``file``."""
    seen, out = set(), []
    if not path.exists():
        return out
    want = os.path.realpath(file)
    for text in path.read_text().splitlines():
        launch = json.loads(text)
        key = json.dumps(launch, sort_keys=True)
        if launch.get("file") == want and key not in seen:
            seen.add(key)
            out.append(launch)
    return out


def jit_kernel_lines(source: str) -> dict[str, tuple[int, int]]:
    """name -> (first, last) line of each ``@triton.jit`` function in ``source``."""
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            out[node.name] = (node.lineno, node.end_lineno)
    return out


def _kernel(source: str, path: Path, name: str):
    """The ``@triton.jit`` function ``name`` of ``source``, built by Triton's JIT (not its interpreter).

    The interpreter switch is read when a kernel is decorated, so it is off for this
    decoration only: every other kernel of the process stays as it was launched."""
    import importlib.util
    from triton import knobs
    with knobs.runtime.scope():  # puts the switch and its environment variable back as they were
        os.environ.pop("TRITON_INTERPRET", None)
        knobs.runtime.interpret = False
        spec = importlib.util.spec_from_loader(f"_stillborn_{path.stem}", loader=None, origin=str(path))
        module = importlib.util.module_from_spec(spec)
        module.__file__ = str(path)
        exec(compile(source, str(path), "exec"), module.__dict__)
        return getattr(module, name)


def compile_ttir(source: str, path: Path, launch: dict) -> str | None:
    """Triton's frontend lowers the kernel of ``source`` to TTIR for CUDA_TARGET with the launch's types:
    None when it does, else the first line of what it refused the kernel with."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler import ASTSource
    from triton.compiler.errors import CompilationError

    fn = _kernel(source, path, launch["kernel"])
    target = GPUTarget(*CUDA_TARGET)
    backend = CUDABackend(target)
    src = ASTSource(fn, signature=launch["signature"], constexprs=launch["constexprs"])
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    options = backend.parse_options({})
    try:
        src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)
    except CompilationError as exc:  # the frontend's own refusal, with the kernel's line in it
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        return f"{launch['kernel']}: {lines[0]} {lines[-1]}" if lines else launch["kernel"]
    return None


def verdict(mutant: Path, pristine: Path, recorded: list[dict], mutated_lines: list[int]) -> str:
    """``refused: WHY`` when Triton's frontend refuses a mutated kernel that compiles unmutated with the
    same launch types; ``compiles`` when it accepts every one; ``not decided: WHY`` otherwise."""
    source, clean = mutant.read_text(), pristine.read_text()
    kernels = {name for name, (lo, hi) in jit_kernel_lines(source).items()
               if any(lo <= n <= hi for n in mutated_lines)}
    if not kernels:
        return "not decided: no mutated line lies in a @triton.jit kernel"
    ran = [launch for launch in recorded if launch.get("kernel") in kernels]
    if not ran:
        return "not decided: the gate recorded no launch of " + ", ".join(sorted(kernels))
    for launch in ran:
        try:
            pristine_refused, refused = _compiled_apart([(clean, pristine), (source, mutant)], launch)
        except Exception as exc:  # the compile itself could not run here: no verdict
            return f"not decided: compiling failed ({type(exc).__name__}: {str(exc)[:200]})"
        if pristine_refused is not None:
            return f"not decided: the unmutated {launch['kernel']} does not compile with the recorded types"
        if refused:
            return "refused: " + " ".join(refused.split())[:300]
    return "compiles"


def _compiled_apart(sources: list[tuple[str, Path]], launch: dict) -> list[str | None]:
    """``compile_ttir`` of each source in a fresh interpreter with Triton's interpreter off: a process
    that has launched interpreted kernels has Triton's language patched for the interpreter, under
    which the frontend cannot lower anything."""
    import subprocess
    job = json.dumps({"sources": [[text, str(path)] for text, path in sources], "launch": launch})
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-W", "ignore", __file__, "--compile"], input=job, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    return json.loads(done.stdout)


def python_refuses(source: str, name: str) -> str | None:
    """``refused: WHY`` when Python's own compiler refuses a mutated file (cosmic-ray turns the ``*`` of a
    keyword-only marker into ``<<``, say): no release could ship it, so it is stillborn, not an error."""
    try:
        compile(source, name, "exec")
    except SyntaxError as exc:
        return f"refused (Python's compiler: {type(exc).__name__} at line {exc.lineno}: {exc.msg})"
    return None


def applied(pristine: str, diff: str) -> tuple[str, list[int]]:
    """``pristine`` with a mutant's unified diff (as cosmic-ray stores it) applied, and the mutated lines."""
    out, lines, hunks = pristine, [], []
    for row in diff.splitlines():
        if row.startswith("@@"):
            hunks.append(([], [], int(row.split("+")[1].split(",")[0])))
        elif hunks and row[:1] in (" ", "-", "+") and not row.startswith(("---", "+++")):
            old, new, start = hunks[-1]
            if row[0] != "+":
                old.append(row[1:])
            if row[0] != "-":
                new.append(row[1:])
                if row[0] == "+":
                    lines.append(start + len(new) - 1)
    for old, new, _ in hunks:
        before, after = "\n".join(old) + "\n", "\n".join(new) + "\n"
        if before not in out:
            raise ValueError("the mutant's diff does not apply to the installed file")
        out = out.replace(before, after, 1)
    return out, lines


def _pristine_launches(work: Path, package: Path, properties: list[str]) -> Path:
    """The launches the gate's properties make on the installed (pristine) SGLang: a kernel mutated in its
    body is launched with the same arguments, so these are its types too."""
    import subprocess
    import tempfile
    path = work / "pristine-launches.jsonl"
    if path.exists():
        return path
    cmd = [sys.executable, "-W", "ignore", str(Path(__file__)), str(path), "run", "--target", "sglang", "--seed", "1",
           "--max-examples", "2", "--isolate", "off", "--report-dir", tempfile.mkdtemp(prefix="vmfuzz-stillborn-")]
    for p in properties:
        cmd += ["--property", p]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent), TRITON_INTERPRET="1")
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    subprocess.run(cmd, env=env, capture_output=True, cwd=tempfile.mkdtemp(prefix="vmfuzz-stillborn-"))
    return path


def rescore(work: Path) -> int:
    """A finished run's kills by the mutant raising inside a Triton kernel, judged stillborn or not after
    the fact: a ``vmfuzz-stillborn:`` line is added to each one's stored output. Returns how many were judged."""
    import tempfile
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkResult
    from mutation_records import classify, killed_by

    driven = json.loads((work / "driven.json").read_text())
    package = Path(driven["package"])
    with use_db(str(work / "session.sqlite"), WorkDB.Mode.open) as db:
        todo, judged = [], 0
        for item, result in db.completed_work_items:
            out = result.output or ""
            if result.worker_outcome != "normal" or "vmfuzz-stillborn:" in out or not (
                    classify(result) == "error" or killed_by(out) == "the mutant raising"):
                continue
            rel = str(item.mutations[0].module_path).removeprefix("python/sglang/")
            try:
                source, lines = applied((package / rel).read_text(), result.diff or "")
            except (OSError, ValueError):  # the diff no longer applies to the installed file: undecided
                continue
            said = python_refuses(source, rel)
            if said:  # whether the gate could not import it (exit 2) or a property raised importing it
                db.set_result(item.job_id, WorkResult(
                    worker_outcome=result.worker_outcome, test_outcome=result.test_outcome, diff=result.diff,
                    output=out + f"\nvmfuzz-stillborn: {said}\n"))
                judged += 1
                continue
            if classify(result) != "killed":
                continue
            if any(lo <= n <= hi for lo, hi in jit_kernel_lines(source).values() for n in lines):
                todo.append((item, result, rel, source, lines))
        if not todo:
            return judged
        recorded = _pristine_launches(work, package, sorted({p for t in todo for p in driven["files"][t[2]]}))
        for item, result, rel, source, lines in todo:
            mutant = Path(tempfile.mkdtemp(prefix="vmfuzz-stillborn-")) / Path(rel).name
            mutant.write_text(source)
            said = verdict(mutant, package / rel, launches(recorded, package / rel), lines)
            db.set_result(item.job_id, WorkResult(worker_outcome=result.worker_outcome, test_outcome=result.test_outcome,
                                                  diff=result.diff, output=(result.output or "")
                                                  + f"\nvmfuzz-stillborn: {said}\n"))
    return judged + len(todo)


def main(argv: list[str]) -> int:
    if argv == ["--compile"]:  # _compiled_apart's worker: a job on stdin, the refusals on stdout
        job = json.loads(sys.stdin.read())
        print(json.dumps([compile_ttir(text, Path(path), job["launch"]) for text, path in job["sources"]]))
        return 0
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    record(Path(argv[0]))
    from vmfuzz.harness.cli import main as vmfuzz
    return vmfuzz(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
