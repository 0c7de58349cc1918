"""report.html's buffer pictures: a finding's tree mask as a strip of cells, each request's
block, and the offending cells marked -- drawn from the record's own repro file and typed
origin (a group, or a finding), never from its words.

Two origin shapes locate cells in the mask, so two are drawn:

- an overrun of the mask by the verify step (``side`` above or below): the buffer
  preallocated for max_bs, and the cells the batch needs past its end, or a mark
  before its start (the origin says that the write landed there, not how far);
- a wrong (or unsound) mask cell of a named class (``cell``: prefix column, a tree
  cell that should be visible or hidden, padding past the batch's region): the
  origin names the first differing cell's class, not its index, so every cell
  of that class in the batch is marked -- the first difference is one of them.

Anything else (another buffer, a class such as "value" or "length" that names no
cell of the mask, a repro that does not say which batch) is not drawn.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Callable

from vmfuzz.harness.model.origin import BEYOND_CAPACITY, WITHIN_CAPACITY

#: the overruns a picture of the preallocated mask can show: the verify step's write of it
#: (its capacity is the layout's worst case for max_bs, which the repro's config gives)
DRAWN = {"effect": "overrun", "writer": "verify step", "buffer": "tree_mask"}
#: the overrun cell classes that say the buffer is the one sized for max_bs
OVERRUN_CELLS = ("", BEYOND_CAPACITY, WITHIN_CAPACITY)
#: a wrong mask's cells are classified one by one; past this many the picture is left out
MAX_CLASSIFIED_CELLS = 1 << 16
WIDTH, LEFT, RIGHT = 900, 160, 20


def svg_open(chart_id: str, title: str, width: int, height: int, cls: str = "chart") -> list[str]:
    """An inline SVG's opening tag and its title (what a screen reader and a tooltip say)."""
    return [f'<svg class="{cls}" id="{chart_id}" data-chart="{escape(title)}" xmlns="http://www.w3.org/2000/svg" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">',
            f'<title>{escape(title)}</title>']


def _overflow_case(f: dict, folder: Path | None = None):
    """(config, mode, step, seq_lens, capacity, need) of a mask overrun, from the record's own repro
    file and typed origin: never from its words. None when not drawable.
    A relative repro path is the report folder's (``folder``)."""
    from vmfuzz.harness.model.layouts import PREALLOCATED_LAYOUTS, TreeMaskMode, logical_size, worst_case_size
    origin = f.get("origin") or {}
    if (any(origin.get(k) != v for k, v in DRAWN.items()) or origin.get("side") not in ("above", "below")
            or origin.get("cell", "") not in OVERRUN_CELLS or not f.get("repro")):
        return None
    try:
        repro = json.loads((Path(folder or ".") / f["repro"]).read_text())
        cfg, batches = repro["config"], repro["batches"]
        mode = TreeMaskMode[cfg["mode"]]
        d = int(cfg["num_draft_tokens"])
        lens = [[int(x) for x in b["seq_lens"]] for b in batches]
        capacity = worst_case_size(mode, int(cfg["max_bs"]), d, int(cfg["max_context_len"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if mode not in PREALLOCATED_LAYOUTS or not lens:
        return None
    needs = [logical_size(mode, s, d) for s in lens]
    step = origin.get("step")
    if not (isinstance(step, int) and 0 <= step < len(lens)):
        # the step the origin names, else the first batch that needs more than the buffer holds
        step = next((i for i, n in enumerate(needs) if n > capacity), max(range(len(lens)), key=needs.__getitem__))
    return cfg, mode, step, lens[step], capacity, needs[step]


def _strip(index: int, title: str, span: int, buffer: tuple[str, int], extents, seq_lens, marked_row: str, *,
           label_x: int = LEFT - 8, wrong: bool = False) -> tuple[list[str], Callable[[int], float], float]:
    """The picture's frame: the title, its row names, ``buffer`` (its row's name and its cells
    [0, n)) and each request's block, on a strip ``span`` cells wide. Returns the parts, the
    cell -> x map and the scale, for the marks to add."""
    scale = (WIDTH - LEFT - RIGHT) / max(1, span)
    name, cells = buffer
    x = lambda cell: LEFT + cell * scale  # noqa: E731
    parts = svg_open(f"buffer-{index}", title, WIDTH, 196, cls="buffer wrong" if wrong else "buffer")
    parts.append(f'<text x="8" y="18" class="ctitle">{escape(title)}</text>')
    for row, y in ((name, 46), ("requests", 86), (marked_row, 126)):
        parts.append(f'<text x="{label_x if y == 126 else LEFT - 8}" y="{y + 17}" text-anchor="end" '
                     f'class="lbl">{escape(row)}</text>')
    parts.append(f'<rect class="buf" x="{x(0):.1f}" y="46" width="{cells * scale:.1f}" height="26"/>'
                 f'<text x="{x(0) + 4:.1f}" y="63" class="lbl">cells [0, {cells})</text>')
    shades = ("#3f6fb5", "#7fa3d6")
    for e in extents:
        w = max(1.0, (e.stop - e.start) * scale)
        parts.append(f'<rect class="req{" past" if not wrong and e.stop > cells else ""}" x="{x(e.start):.1f}" '
                     f'y="86" width="{w:.1f}" height="26" fill="{shades[e.request % 2]}">'
                     f'<title>request {e.request}: seq_len {seq_lens[e.request]}, cells [{e.start}, {e.stop})'
                     f'</title></rect>')
        if w > 34:
            parts.append(f'<text x="{x(e.start) + 4:.1f}" y="103" class="lbl inv">req {e.request}</text>')
    return parts, x, scale


def _end_line(x, cap: int, label: str) -> str:
    end = x(cap)
    # near the right edge the label ends at the line rather than running off the picture
    text = (f'<text x="{end + 4:.1f}" y="174" class="lbl endlbl">' if end < WIDTH - 220 else
            f'<text x="{end - 4:.1f}" y="174" text-anchor="end" class="lbl endlbl">')
    return f'<line class="end" x1="{end:.1f}" y1="34" x2="{end:.1f}" y2="160"/>{text}{escape(label)}</text>'


def overrun_picture(f: dict, index: int, folder: Path | None = None) -> str:
    """The buffer as a strip of cells: its end, each request's block, and the cells the batch
    needs past the end (or the mark before its start) -- from the repro's config and batch."""
    from vmfuzz.harness.model.layouts import request_extents
    case = _overflow_case(f, folder)
    if case is None:
        return ""
    cfg, mode, step, seq_lens, cap, need = case
    extents = request_extents(mode, seq_lens, cfg["num_draft_tokens"])
    below = (f.get("origin") or {}).get("side") == "below"
    title = f"{mode.name} buffer, max_bs {cfg['max_bs']}: {len(seq_lens)} requests need {need} cells of its {cap}"
    row = "before the start" if below else "past the end"
    parts, x, scale = _strip(index, title, max(cap, need), ("buffer", cap), extents, seq_lens, row,
                             label_x=LEFT - 34 if below else LEFT - 8)
    if below:  # how far before cell 0 is the write's offset, which the origin does not carry
        parts.append(f'<rect class="oob" x="{x(0) - 26:.1f}" y="126" width="24" height="26">'
                     f'<title>written before cell 0</title></rect>')
        parts.append(_end_line(x, 0, "buffer start: cell 0"))
        past = "Red: a write before the buffer's first cell (how far before, the origin does not say)."
    else:
        if need > cap:
            parts.append(f'<rect class="oob" x="{x(cap):.1f}" y="126" width="{max(2.0, (need - cap) * scale):.1f}" '
                         f'height="26"/><text x="{x(cap) + 4:.1f}" y="143" class="lbl inv">'
                         f'{need - cap} cell(s) in [{cap}, {need})</text>')
        parts.append(_end_line(x, cap, f"buffer end: cell {cap}"))
        past = (f"Red: the {need - cap} cell(s) in [{cap}, {need}) the batch needs past the {cap}-cell buffer's end."
                if need > cap else "The batch fits the buffer: the stray write is the writer's, not the batch's size.")
    parts.append("</svg>")
    who = ", ".join(f"request {e.request} [{e.start}, {e.stop})" for e in extents)
    return ("".join(parts) + f'<p class="note">From <code>{escape(str(f["repro"]))}</code>, batch {step}: '
            f'{escape(who)}. {past}</p>')


def _cell_class(named: str) -> str:
    """The mask cell class an origin names, without a property's own wording around it
    ("read prefix column" of a reader, "... (vs the tree kernel)" of the chain writer)."""
    return named.removeprefix("read ").split(" (vs ")[0]


def _wrong_case(f: dict, folder: Path | None):
    """(config, step, batch, cells, marked ranges) of a wrong mask cell class, or None."""
    from vmfuzz.harness.model.layouts import logical_size, worst_case_size
    from vmfuzz.harness.model.oracle import expected
    from vmfuzz.harness.model.repro_file import ReproError, load, to_case
    from vmfuzz.harness.properties.kit import mask_cell_class
    origin = f.get("origin") or {}
    named = _cell_class(origin.get("cell") or "")
    if (origin.get("effect") not in ("wrong", "unsound") or origin.get("buffer") != "tree_mask"
            or not (named in ("prefix column", "padding past the batch's region") or named.startswith("tree cell"))
            or not f.get("repro")):
        return None
    try:
        config, batches = to_case(load(Path(folder or ".") / f["repro"]))
    except ReproError:
        return None
    step = origin.get("step")
    if not isinstance(step, int):
        step = 0 if len(batches) == 1 else None  # which batch, the origin does not say: no picture
    if step is None or not 0 <= step < len(batches):
        return None
    batch = batches[step]
    need = logical_size(config.mode, batch.seq_lens, config.d)
    padding = named.startswith("padding")
    cells = max(need, worst_case_size(config.mode, config.max_bs, config.d, config.max_context_len)) if padding else need
    if cells > MAX_CLASSIFIED_CELLS or (padding and cells == need):
        return None
    want = expected(config, batch)
    ranges, start = [], None
    for cell in range(cells + 1):
        hit = cell < cells and (cell >= need or bool(want.compared[cell])) and mask_cell_class(
            config, batch, cell, int(want.tree_mask[cell]) if cell < need else 0).startswith(named)
        if hit and start is None:
            start = cell
        elif not hit and start is not None:
            ranges.append((start, cell))
            start = None
    return (config, step, batch, cells, need, ranges) if ranges else None


def wrong_picture(f: dict, index: int, folder: Path | None = None) -> str:
    """The batch's region of the mask, each request's block, and the cells of the class the
    origin names marked: the first wrong cell is one of them."""
    from vmfuzz.harness.model.layouts import request_extents
    case = _wrong_case(f, folder)
    if case is None:
        return ""
    config, step, batch, cells, need, ranges = case
    origin = f["origin"]
    named = origin["cell"]
    extents = request_extents(config.mode, batch.seq_lens, config.d)
    count = sum(b - a for a, b in ranges)
    title = (f"wrong {config.mode.name} tree_mask, batch {step} ({len(batch.seq_lens)} requests): "
             f"{count} of its {cells} cells are '{named}'")
    parts, x, scale = _strip(index, title, cells, ("buffer" if cells > need else "batch's region", cells), extents,
                             batch.seq_lens, "cell class", wrong=True)
    for a, b in ranges:
        parts.append(f'<rect class="oob wrong-cell" x="{x(a):.1f}" y="126" width="{max(2.0, (b - a) * scale):.1f}" '
                     f'height="26" data-cells="{a}-{b}"><title>{escape(named)}: cells [{a}, {b})</title></rect>')
    parts.append(_end_line(x, need, f"batch's region ends: cell {need}"))
    parts.append("</svg>")
    where = ", ".join(f"[{a}, {b})" for a, b in ranges[:8]) + (", ..." if len(ranges) > 8 else "")
    return ("".join(parts) + f'<p class="note">From <code>{escape(str(f["repro"]))}</code>, batch {step}: '
            f'red, every cell of the class the origin names ({escape(named)}): {escape(where)}. The origin '
            f'names the first wrong cell\'s class, not its index: it is one of these.</p>')


def buffer_picture(f: dict, index: int, folder: Path | None = None) -> str:
    """The picture of ``f`` (a group or a finding) its origin allows, or "" when it allows none."""
    return overrun_picture(f, index, folder) or wrong_picture(f, index, folder)
