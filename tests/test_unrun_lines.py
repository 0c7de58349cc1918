"""scripts/unrun_lines.py tabulates the surface's unrun statements, not every traced file's.

Since the gate traces every changed file, a gate on a checkout where every file is
new measures the whole package; the table (docs/unrun-lines.md) is of the
functions ``vmfuzz surface`` lists, with other forward modes' branches left out
and counted apart, as it was before the gate traced everything.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SOURCE = '''\
def listed(x):
    if x:
        a = 1
    if x is None:
        b = 2
    return 3


def not_listed(y):
    c = 4
    return c
'''


def _script():
    spec = importlib.util.spec_from_file_location("unrun_lines", ROOT / "scripts" / "unrun_lines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_surface_functions_on_the_mask_path_are_tabulated(tmp_path, monkeypatch):
    unrun = _script()
    traced = tmp_path / "mod.py"
    traced.write_text(SOURCE)
    monkeypatch.setattr(unrun, "surface_functions", lambda: {"srt/mod.py": {"listed"}})
    summary = {"gate": {"lines": [{
        "path": "python/sglang/srt/mod.py", "traced": str(traced),
        "judged": {"6": ["no-oob-write"]},
        "never_ran": [3, 5, 10, 11],
        "needs_device": [],
        "why_never_ran": {"5": "off the mask's path: runs only when x is None"},
    }]}}
    lines = unrun.table(summary)
    rows = [line for line in lines if line.startswith("| `srt/mod.py`")]
    # line 3 (listed, under `x`) is the one row: 5 is another mode's branch, 10-11 are not_listed's
    assert rows == ["| `srt/mod.py` | `listed` | `x` | not driven here | 1 | 3 |"], lines
    assert lines[0].startswith("Mask-path statements the gate's properties ran: 1 of 2; never ran: 1 not driven"), lines[0]
    assert lines[-1].startswith("1 statements of mask-path functions named off the mask's path"), lines[-1]


def test_a_nested_function_belongs_to_the_listed_one():
    unrun = _script()
    assert unrun._within("Runner.capture_one_shape.run_once", {"Runner.capture_one_shape"})
    assert unrun._within("Runner.capture_one_shape", {"Runner.capture_one_shape"})
    assert not unrun._within("Runner.capture_one_shape_other", {"Runner.capture_one_shape"})
