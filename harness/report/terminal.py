"""Words a person reads in the terminal: verdicts coloured, counts with the right plural."""

from __future__ import annotations

import os
import sys

_COLOURS = {"held": "32", "FAILED": "1;31", "failed": "1;31", "skipped": "33", "error": "1;31",
            "not driven": "33", "out of step": "1;33", "could not check": "1;33", "SURVIVED": "1;31", "caught": "32"}


def in_ci() -> bool:
    """Under CI a log is read after the fact, by grep: no colour, no live bar."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def interactive(stream=None) -> bool:
    """A person watches this stream live: a terminal, and not CI."""
    stream = stream or sys.stdout
    return not in_ci() and bool(getattr(stream, "isatty", lambda: False)())


def colour_on(stream=None) -> bool:
    """Colour only on a terminal, never under CI or NO_COLOR."""
    return not os.environ.get("NO_COLOR") and interactive(stream)


def paint(word: str, key: str | None = None, *, width: int = 0) -> str:
    """``word`` padded to ``width`` and coloured by ``key`` (default: the word itself)."""
    padded = f"{word:<{width}}"
    code = _COLOURS.get(key or word)
    if not code or not colour_on():
        return padded
    return f"\033[{code}m{word}\033[0m" + padded[len(word):]


def status_word(status: str) -> str:
    """A check's status as the terminal shows it: FAILED shouts, the rest do not."""
    return paint("FAILED" if status == "failed" else status)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 example``, ``2 examples``, ``1 property``, ``3 properties``."""
    return f"{n:,} {noun if n == 1 else (nouns or noun + 's')}"


def classes_line(classes: dict[str, int], verbose: bool = False) -> str:
    """Which boundary classes a property's examples reached: a short summary, or every one with -v."""
    if verbose:
        return "classes: " + ", ".join(f"{k} ({v})" for k, v in sorted(classes.items()))
    path = ", ".join(f"{k.removeprefix('path ')} {classes[k]}" for k in ("path reuse", "path fallback")
                     if k in classes)
    layouts = sorted(k.removeprefix("layout ") for k in classes if k.startswith("layout "))
    parts = [plural(len(classes), "class", "classes") + " reached"]
    if path:
        parts.append(path)
    if layouts:
        parts.append("/".join(layouts))
    return "classes: " + "; ".join(parts) + " (-v: every class)"


def shown(path: str) -> str:
    """A path fit for one line of output: undecodable bytes and control characters escaped."""
    text = path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def gate_line(gate: dict, quote: str = "") -> str:
    """One line (summary.md passes a backtick ``quote``); paths escaped by ``shown``."""
    def names(paths):
        return ", ".join(f"{quote}{shown(p)}{quote}" for p in paths) or "none"
    return (f"gate: {len(gate['triggered'])} changed file(s) touch verify-mask code; "
            f"exercised: {names(gate['exercised'])}; triggered only (not driven): {names(gate['not_driven'])}")


def spans(lines: list[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``3-5, 9``."""
    out, run = [], []
    for n in sorted(lines):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [n]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def changed_line_rows(gate: dict) -> list[tuple[str, str, str]]:
    """(file, verdict, detail) per measured changed file: which lines each property ran, which
    none did, which need a GPU, which are pure definitions. summary.md, junit.xml and report.html
    all read these rows."""
    rows = []
    for f in gate.get("lines") or []:
        parts = []
        if f.get("traced") is None:
            rows.append((f["path"], "not measured", f.get("why_untraced") or "not traceable"))
            continue
        by_prop: dict[str, list[int]] = {}
        for line, props in (f.get("judged") or {}).items():
            for p in props:
                by_prop.setdefault(p, []).append(int(line))
        if f.get("changed_lines") is None:
            parts.append("no diff known: each mask-path function must be entered")
        else:
            parts.append(f"changed statements {spans(f['changed_lines']) or 'none'}")
        parts += [f"{p} ran {spans(ls)}" for p, ls in sorted(by_prop.items())]
        if f.get("never_ran"):
            whys = sorted(set((f.get("why_never_ran") or {}).values()))
            parts.append(f"NEVER RAN {spans(f['never_ran'])} ({'; '.join(whys)})")
        if f.get("unprovoked"):
            parts.append(f"NOT PROVOKED {spans(f['unprovoked'])} (ran, but no example made it differ from the base)")
        rules = {int(line): rule for line, rule in (f.get("rules") or {}).items()}
        for rule, word in (("provoked", "provoked (differed from the base)"),
                           ("reached", "reached, its outputs compared")):
            if any(r.startswith(rule) for r in rules.values()):
                parts.append(f"{word} {spans(sorted(n for n, r in rules.items() if r.startswith(rule)))}")
        if f.get("needs_device"):
            parts.append(f"NEEDS A GPU {spans(f['needs_device'])}")
        if f.get("definitions"):
            parts.append(f"pure definitions {spans(f['definitions'])}")
        for qual, fn in (f.get("functions") or {}).items():
            state = f"entered, {fn['ran']}/{fn['statements']} statements ran" if fn["entered"] else "NEVER ENTERED"
            parts.append(f"{qual}: {state}")
        rows.append((f["path"], "exercised" if f.get("exercised") else "not exercised", "; ".join(parts)))
    return rows
