#!/usr/bin/env bash
# Runs vmfuzz against every SGLang release it knows (or those named), each in its
# own venv, and writes a markdown table of the verdicts.
#
#   release_matrix.sh [--dir DIR] [--out FILE] [--reuse] [RELEASE ...]
#
#   RELEASE       releases to run (default: every scripts/sglang/pins/V.txt, oldest first)
#   --dir DIR     where venvs, logs and report dirs go (default $VMFUZZ_RELEASES_DIR,
#                 else /tmp/vmfuzz-releases): DIR/venv-V, DIR/logs/, DIR/reports/V/
#   --out FILE    also write the table to FILE (default DIR/matrix.md)
#   --reuse       keep an existing DIR/venv-V (install_sglang.sh leaves it alone when it
#                 already imports V); without it each venv is made fresh
#
# Per release: VMFUZZ_VENV=DIR/venv-V scripts/bootstrap.sh (vmfuzz editable, torch CPU),
# scripts/install_sglang.sh --version V, then, from the repository root:
#   vmfuzz run --target sglang --profile pr
#   vmfuzz gate --target sglang --changed-files F   (F lists verify_mask.py, so it triggers)
#   vmfuzz run --target sglang+fits-off-by-one --profile pr   (a known-bad variant: exit 1 expected)
# Each cell is the exit code and the properties that failed (summary.json's properties
# and replays with a failed status); the findings' first lines follow the table.
#
# Exit status: 0 when every release meets the release bar -- it installs, `run` and
# `gate` exit 0 (known findings listed, nothing else failing), the off-by-one run
# exits 1 -- and 1 naming each release and command that does not (the nightly
# workflow's release-matrix job is red on it); 2 for bad usage.
set -euo pipefail
die() { echo "release_matrix: $*" >&2; exit 2; }
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
PINS=$ROOT/scripts/sglang/pins
KNOWN=$(cd "$PINS" && ls [0-9]*.txt | sed 's/\.txt$//' | sort -V | paste -sd' ')
DIR=${VMFUZZ_RELEASES_DIR:-/tmp/vmfuzz-releases}
OUT=""
REUSE=0
RELEASES=()
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) [ $# -ge 2 ] || die "--dir needs a directory"; DIR=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || die "--out needs a file"; OUT=$2; shift 2 ;;
        --reuse) REUSE=1; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ -f "$PINS/$1.txt" ] || die "unknown sglang release '$1' (known: $KNOWN)"; RELEASES+=("$1"); shift ;;
    esac
done
[ ${#RELEASES[@]} -gt 0 ] || read -r -a RELEASES <<< "$KNOWN"
mkdir -p "$DIR/logs" || die "cannot create $DIR"
DIR=$(cd "$DIR" && pwd -P)
OUT=${OUT:-$DIR/matrix.md}
: > "$OUT" || die "cannot write $OUT"
CHANGED=$DIR/changed-files.txt
echo "python/sglang/srt/layers/attention/verify_mask.py" > "$CHANGED"
ROWS=$DIR/rows.jsonl
: > "$ROWS"

# one command's cell, as JSON: exit code, failing properties, findings' first lines
cell() {  # cell NAME RC REPORT_DIR LOG
    python3 - "$@" <<'PYEOF'
import json, os, sys
name, rc, report, log = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
path = os.path.join(report, "summary.json")
out = {"name": name, "rc": rc, "failing": [], "notes": []}
if os.path.isfile(path):
    s = json.load(open(path))
    failing = [p["name"] for p in s.get("properties", []) if p.get("status") == "failed"]
    failing += [f"replay {r.get('property')}" for r in s.get("replays", []) if r.get("status") not in ("held", None)]
    out["failing"] = sorted(set(failing))
    out["known"] = [k["name"] for k in s.get("known_findings", []) if k.get("status") == "reproduces"]
    out["out_of_step"] = [p["name"] for p in s.get("properties", []) if p.get("status") == "out of step"]
    first = lambda t: (t or "").strip().splitlines()[0] if (t or "").strip() else ""
    out["notes"] = [f"{f.get('property')} ({f.get('kind') or 'finding'}): {first(f.get('detail'))}"
                    for f in s.get("findings", [])]
    if s.get("gate") and not s["gate"].get("triggered", True):
        out["notes"].append("gate skipped: nothing triggered")
else:
    tail = [l for l in open(log, errors="replace").read().splitlines() if l.strip()][-1:] if os.path.isfile(log) else []
    out["notes"] = [f"no summary.json: {tail[0] if tail else 'no output'}"]
print(json.dumps(out))
PYEOF
}

for V in "${RELEASES[@]}"; do
    VENV=$DIR/venv-$V
    LOG=$DIR/logs/$V
    REPORTS=$DIR/reports/$V
    echo "release_matrix: sglang $V in $VENV" >&2
    [ "$REUSE" = 1 ] || rm -rf "$VENV"
    rm -rf "$REPORTS"; mkdir -p "$REPORTS"
    t0=$(date +%s)
    irc=0
    { VMFUZZ_VENV=$VENV bash scripts/bootstrap.sh && VMFUZZ_VENV=$VENV bash scripts/install_sglang.sh --version "$V"; } \
        > "$LOG-install.log" 2>&1 || irc=$?
    # an install that found V already importable skipped the module check: run it now
    if [ "$irc" = 0 ] && ! grep -q "driven modules absent" "$LOG-install.log"; then
        VMFUZZ_VENV=$VENV bash scripts/install_sglang.sh --version "$V" --check >> "$LOG-install.log" 2>&1 || irc=$?
    fi
    secs=$(( $(date +%s) - t0 ))
    absent=$(sed -n 's/^install_sglang: driven modules absent from this release: //p' "$LOG-install.log" | tail -1)
    cells=()
    if [ "$irc" = 0 ]; then
        for spec in "run|run --target sglang --profile pr" \
                    "gate|gate --target sglang --changed-files $CHANGED" \
                    "off-by-one|run --target sglang+fits-off-by-one --profile pr"; do
            name=${spec%%|*}
            rc=0
            echo "release_matrix:   vmfuzz ${spec#*|}" >&2
            # shellcheck disable=SC2086  # the command's words
            "$VENV/bin/vmfuzz" ${spec#*|} --report-dir "$REPORTS/$name" > "$LOG-$name.log" 2>&1 || rc=$?
            cells+=("$(cell "$name" "$rc" "$REPORTS/$name" "$LOG-$name.log")")
        done
    fi
    python3 - "$V" "$irc" "$secs" "${absent:-?}" "$(tail -1 "$LOG-install.log")" "${cells[@]}" >> "$ROWS" <<'PYEOF'
import json, sys
v, irc, secs, absent, last, *cells = sys.argv[1:]
print(json.dumps({"release": v, "install_rc": int(irc), "install_seconds": int(secs), "absent": absent,
                  "install_last": last, "cells": [json.loads(c) for c in cells]}))
PYEOF
done

python3 - "$ROWS" <<'PYEOF' | tee "$OUT"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
heads = {"run": "`run --profile pr`", "gate": "`gate` (verify_mask.py changed)",
         "off-by-one": "`run +fits-off-by-one` (exit 1 expected)"}
def cellfmt(c):
    parts = [", ".join(c["failing"])] if c["failing"] else []
    parts += ["known: " + ", ".join(c["known"])] if c.get("known") else []
    parts += ["out of step: " + ", ".join(c["out_of_step"])] if c.get("out_of_step") else []
    return f"exit {c['rc']}" + (": " + "; ".join(parts) if parts else "")
print("| sglang | install (bootstrap + sglang) | driven modules absent | " + " | ".join(heads.values()) + " |")
print("|---|---|---|" + "---|" * len(heads))
for r in rows:
    inst = f"ok ({r['install_seconds']} s)" if r["install_rc"] == 0 else f"failed (exit {r['install_rc']})"
    cells = {c["name"]: cellfmt(c) for c in r["cells"]}
    print(f"| {r['release']} | {inst} | {r['absent']} | " + " | ".join(cells.get(k, "—") for k in heads) + " |")
notes = [(r["release"], c["name"], n) for r in rows for c in r["cells"] for n in c["notes"]]
notes += [(r["release"], "install", r["install_last"]) for r in rows if r["install_rc"]]
if notes:
    print("\nFindings and notes (first line of each):\n")
    for rel, name, n in notes:
        print(f"- {rel} {name}: {n.replace('|', '/')}")
PYEOF

# the release bar (see the header): which releases and commands missed it
python3 - "$ROWS" <<'PYEOF'
import json, sys
want = {"run": 0, "gate": 0, "off-by-one": 1}
missed = []
for r in (json.loads(l) for l in open(sys.argv[1])):
    if r["install_rc"]:
        missed.append(f"{r['release']} install: exit {r['install_rc']}")
        continue
    got = {c["name"]: c for c in r["cells"]}
    for name, rc in want.items():
        c = got.get(name)
        if c is None or c["rc"] != rc or (rc == 0 and c["failing"]):
            missed.append(f"{r['release']} {name}: exit {c['rc'] if c else '?'}, the bar is exit {rc}"
                          + (f" ({', '.join(c['failing'])} failing)" if c and c["failing"] and rc == 0 else ""))
if missed:
    print("\nrelease_matrix: below the release bar:\n" + "\n".join("- " + m for m in missed), file=sys.stderr)
    sys.exit(1)
print("\nrelease_matrix: every release meets the release bar", file=sys.stderr)
PYEOF
