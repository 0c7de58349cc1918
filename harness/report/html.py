"""report.html: one self-contained page (inline SVG, inline CSS, no scripts or CDN).

A CI artifact is often opened offline or behind a proxy; anything fetched from
elsewhere would leave an empty page. A failing run opens with its findings --
for an out-of-bounds write, a picture of the buffer, each request's cells and
the cells written past its end -- and every chart says what it counts.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import partial
from html import escape
from pathlib import Path

BS_BUCKETS = ("< 0.5", "0.5-1", "= 1", "1-1.5", "1.5-2", "> 2")
LEGEND = {"reuse": "reuse steps", "fallback": "fallback steps", "arithmetic": "no write (capacity)"}
PATH_COLOURS = {"reuse": "#3f6fb5", "fallback": "#9e9e9e", "arithmetic": "#c7a252"}


def _svg_open(chart_id: str, title: str, width: int, height: int, cls: str = "chart") -> list[str]:
    return [f'<svg class="{cls}" id="{chart_id}" data-chart="{escape(title)}" xmlns="http://www.w3.org/2000/svg" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">',
            f'<title>{escape(title)}</title>']


def _title_lines(title: str, note: str, pad: int) -> tuple[list[str], int]:
    out = [f'<text x="{pad}" y="16" class="ctitle">{escape(title)}</text>']
    if note:
        out.append(f'<text x="{pad}" y="32" class="note">{escape(note)}</text>')
    return out, 40 if note else 22


def bar_chart(chart_id: str, title: str, data: list[tuple[str, float]], *, note: str = "",
              width: int = 560) -> str:
    """Horizontal bars, one per label, scaled to the largest value; ``note`` says what is counted."""
    row, label_w, pad = 24, 170, 8
    head, top_y = _title_lines(title, note, pad)
    empty = not any(v for _, v in data)
    height = top_y + pad + row * (max(1, len(data)) + empty) + 8
    top = max([v for _, v in data] + [1])
    parts = _svg_open(chart_id, title, width, height) + head
    span = width - label_w - 60
    for i, (label, v) in enumerate(data):
        y = top_y + i * row
        w = 0 if v <= 0 else max(2.0, span * v / top)
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" class="lbl">{escape(label)}</text>')
        parts.append(f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row - 8}" '
                     f'data-label="{escape(label)}" data-value="{v:g}"/>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 15}" class="val">{v:,g}</text>')
    if empty:
        parts.append(f'<text x="{label_w}" y="{top_y + len(data) * row + 15}" class="note">'
                     f'no examples counted here</text>')
    parts.append("</svg>")
    return "".join(parts)


def grouped_chart(chart_id: str, title: str, groups: list[str], series: dict[str, dict[str, int]], *,
                  note: str = "", width: int = 560) -> str:
    """One row per group, one thin bar per series (coloured by path), with a legend."""
    label_w, pad, bar_h = 170, 8, 9
    names = [n for n in series if any(series[n].values())] or list(series)[:1]
    row = bar_h * len(names) + 8
    head, top_y = _title_lines(title, note, pad)
    legend_y = top_y + 4
    top_y += 20
    height = top_y + row * max(1, len(groups)) + 8
    top = max([v for n in names for v in series[n].values()] + [1])
    span = width - label_w - 60
    parts = _svg_open(chart_id, title, width, height) + head
    for k, n in enumerate(names):
        x = label_w + k * 130
        parts.append(f'<rect x="{x}" y="{legend_y}" width="10" height="10" fill="{PATH_COLOURS.get(n, "#555")}"/>'
                     f'<text x="{x + 14}" y="{legend_y + 9}" class="lbl">{escape(LEGEND.get(n, n))}</text>')
    for i, g in enumerate(groups):
        y = top_y + i * row
        parts.append(f'<text x="{label_w - 6}" y="{y + row / 2 + 3:.0f}" text-anchor="end" class="lbl">'
                     f'{escape(g)}</text>')
        for k, n in enumerate(names):
            v = series[n].get(g, 0)
            w = 0 if v <= 0 else max(2.0, span * v / top)
            by = y + k * bar_h
            parts.append(f'<rect class="bar {escape(n)}" x="{label_w}" y="{by}" width="{w:.1f}" height="{bar_h - 1}" '
                         f'style="fill:{PATH_COLOURS.get(n, "#555")}" data-label="{escape(g)} {escape(n)}" data-value="{v}"/>')
            if v:
                parts.append(f'<text x="{label_w + w + 4:.1f}" y="{by + bar_h - 1}" class="val small">{v:,}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _charts(s: dict) -> list[str]:
    bs = Counter()
    for p in s["properties"]:
        bs.update(p["bs_over_max_bs"])
    classes = s["boundary_classes"]
    paths = [("reuse (preallocated)", classes.get("path reuse", 0)),
             ("fallback (per batch)", classes.get("path fallback", 0))]
    layouts = sorted((k.removeprefix("layout "), v) for k, v in classes.items() if k.startswith("layout "))
    by_path = s.get("overflow_margin_by_path") or {"all": s["overflow_margin"]}
    return [
        bar_chart("bs-ratio", "verify steps by bs / max_bs",
                  [(b, bs.get(b, 0)) for b in BS_BUCKETS],
                  note="every batch of every example; past 1 a batch cannot reuse the buffer"),
        bar_chart("reuse-fallback", "examples by path: reuse vs fallback", paths,
                  note="reuse: the batch wrote the buffer captured for max_bs; fallback: its own"),
        bar_chart("layouts", "examples per layout", layouts, note="tree-mask layout (unread: QLEN_ONLY, not read)"),
        grouped_chart("overflow-margin", "cells a batch needs past the preallocated buffer's end",
                      list(s["overflow_margin"]), by_path,
                      note="> 0 on reuse is an overflow; on fallback the batch gets its own buffer"),
    ]


# -- the buffer picture of an out-of-bounds write ------------------------------------

#: the overruns a picture of the preallocated mask can show: the verify step's write of it
DRAWN = {"effect": "overrun", "writer": "verify step", "buffer": "tree_mask", "side": "above"}


def _overflow_case(f: dict, folder: Path | None = None):
    """(config, mode, step, seq_lens, capacity, need) of a mask overrun, from the record's own repro
    file and typed origin (a group, or a finding): never from its words. None when not drawable.
    A relative repro path is the report folder's (``folder``)."""
    from harness.model.layouts import PREALLOCATED_LAYOUTS, TreeMaskMode, logical_size, worst_case_size
    origin = f.get("origin") or {}
    if any(origin.get(k) != v for k, v in DRAWN.items()) or not f.get("repro"):
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


def buffer_picture(f: dict, index: int, folder: Path | None = None) -> str:
    """The buffer as a strip of cells: its end, each request's block, and the cells the batch
    needs past the end -- drawn from the repro's config and batch by the layout arithmetic."""
    from harness.model.layouts import request_extents
    case = _overflow_case(f, folder)
    if case is None:
        return ""
    cfg, mode, step, seq_lens, cap, need = case
    extents = request_extents(mode, seq_lens, cfg["num_draft_tokens"])
    last = max(cap, need)
    width, left, right = 900, 130, 20
    scale = (width - left - right) / max(1, last)
    x = lambda cell: left + cell * scale  # noqa: E731
    rows = {"buffer": 46, "requests": 86, "past the end": 126}
    height = 196
    title = f"{mode.name} buffer, max_bs {cfg['max_bs']}: {len(seq_lens)} requests need {need} cells of its {cap}"
    parts = _svg_open(f"buffer-{index}", title, width, height, cls="buffer")
    parts.append(f'<text x="8" y="18" class="ctitle">{escape(title)}</text>')
    for name, y in rows.items():
        parts.append(f'<text x="{left - 8}" y="{y + 17}" text-anchor="end" class="lbl">{name}</text>')
    parts.append(f'<rect class="buf" x="{x(0):.1f}" y="{rows["buffer"]}" width="{cap * scale:.1f}" height="26"/>'
                 f'<text x="{x(0) + 4:.1f}" y="{rows["buffer"] + 17}" class="lbl">cells [0, {cap})</text>')
    shades = ("#3f6fb5", "#7fa3d6")
    for e in extents:
        w = max(1.0, (e.stop - e.start) * scale)
        parts.append(f'<rect class="req{" past" if e.stop > cap else ""}" x="{x(e.start):.1f}" '
                     f'y="{rows["requests"]}" width="{w:.1f}" height="26" fill="{shades[e.request % 2]}">'
                     f'<title>request {e.request}: seq_len {seq_lens[e.request]}, cells [{e.start}, {e.stop})</title></rect>')
        if w > 34:
            parts.append(f'<text x="{x(e.start) + 4:.1f}" y="{rows["requests"] + 17}" class="lbl inv">'
                         f'req {e.request}</text>')
    if need > cap:
        parts.append(f'<rect class="oob" x="{x(cap):.1f}" y="{rows["past the end"]}" '
                     f'width="{max(2.0, (need - cap) * scale):.1f}" height="26"/>'
                     f'<text x="{x(cap) + 4:.1f}" y="{rows["past the end"] + 17}" class="lbl inv">'
                     f'{need - cap} cell(s) in [{cap}, {need})</text>')
    end = x(cap)
    parts.append(f'<line class="end" x1="{end:.1f}" y1="34" x2="{end:.1f}" y2="{rows["past the end"] + 34}"/>'
                 f'<text x="{end + 4:.1f}" y="{rows["past the end"] + 48}" class="lbl endlbl">'
                 f'buffer end: cell {cap}</text>')
    parts.append("</svg>")
    who = ", ".join(f"request {e.request} [{e.start}, {e.stop})" for e in extents)
    past = (f"Red: the {need - cap} cell(s) in [{cap}, {need}) the batch needs past the {cap}-cell buffer's end."
            if need > cap else "The batch fits the buffer: the stray write is the writer's, not the batch's size.")
    return ("".join(parts) + f'<p class="note">From <code>{escape(str(f["repro"]))}</code>, batch {step}: '
            f'{escape(who)}. {past}</p>')


CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1180px}
table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
.failed{color:#b00020;font-weight:bold}.held{color:#1b5e20}.skipped{color:#777}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px}
.chart{border:1px solid #ddd;background:#fafafa;width:100%;height:auto}
.bar{fill:#3f6fb5}.ctitle{font-weight:bold;font-size:13px}.lbl,.val{font-size:12px}.small{font-size:10px}
.note{font-size:11px;fill:#555;color:#555}
.finding{border:2px solid #b00020;border-radius:6px;padding:12px 16px;margin:12px 0;background:#fff5f5}
.finding h3{margin:0 0 6px 0;color:#b00020}
.buffer{border:1px solid #ddd;background:#fff;max-width:100%;height:auto}
.buf{fill:#eee;stroke:#444;stroke-width:1.5}.oob{fill:#d32f2f}.req.past{stroke:#d32f2f;stroke-width:2}
.end{stroke:#d32f2f;stroke-width:2;stroke-dasharray:5 3}.endlbl{fill:#b00020;font-weight:bold}.inv{fill:#fff}
code{background:#f2f2f2;padding:1px 3px}"""


def _findings_html(s: dict, picture) -> str:
    if s.get("groups"):  # the groups above carry the picture: each member is one row here
        rows = "".join(f'<tr><td>{escape(f["property"])}</td><td>{escape(f["kind"])}</td>'
                       f'<td>{escape(f["detail"])}</td><td><code>{escape(f["repro"])}</code></td></tr>'
                       for f in s["findings"])
        return f'<table class="members"><tr><th>property</th><th>kind</th><th>detail</th><th>repro</th></tr>{rows}</table>'
    out = []
    for i, f in enumerate(s["findings"]):
        out.append(f'<div class="finding"><h3>{escape(f["property"])} ({escape(f["kind"])})</h3>'
                   f'<p>{escape(f["detail"])}</p>{picture(f, i)}'
                   f'<p>repro: <code>{escape(f["repro"])}</code> &middot; re-run it with '
                   f'<code>vmfuzz replay {escape(f["repro"])}</code></p></div>')
    return "".join(out)


def report_html(s: dict, folder: Path | None = None) -> str:
    """The page of ``s``, written into ``folder``: the repro paths relative to it are read from there."""
    c = s["counts"]
    verdict = "FAILED" if c["findings"] else ("could not check" if c.get("could_not_check") else "passed")
    from harness.report.html_sections import (coverage_html, gate_html, groups_html, history_html, known_html,
                                              property_rows)
    rows = property_rows(s["properties"])
    versions = ", ".join(f"{escape(k)} {escape(str(v))}" for k, v in s["versions"].items())
    dep = ""
    if s.get("deployment"):
        d = s["deployment"]
        dep = (f'<p>Deployment {escape(d["label"])}: <b>{"can" if d["can_write_out_of_range"] else "cannot"} '
               f'write out of range</b> ({escape(d["why"])})</p>')
    picture = partial(buffer_picture, folder=folder)
    findings = groups_html(s, picture)
    if s["findings"]:
        findings += (f'<h2 id="findings">{c["findings"]} finding{"" if c["findings"] == 1 else "s"} '
                     f'(every member of the groups above)</h2>' + _findings_html(s, picture))
    charts_note = ("The charts count the examples each property ran; a failing property's count ends at its "
                   "first failing example, shown above." if s["findings"] else
                   "The charts count every example the run generated.")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>vmfuzz {escape(s['target'])}: {verdict}</title>
<style>{CSS}</style></head><body>
<h1>vmfuzz {escape(s['command'])} on <code>{escape(s['target'])}</code>: <span class="{'failed' if c['findings'] else ('held' if verdict == 'passed' else 'skipped')}">{verdict}</span></h1>
<p>profile <b>{escape(s['profile'])}</b>, seed <b>{s['seed']}</b>, {c['examples']:,} examples,
{c['held']} held / {c['failed']} failed / {c['skipped']} skipped, {s['timings']['total_seconds']:.0f}s. {versions}</p>
{dep}
{findings}
{gate_html(s)}
{known_html(s)}
<h2>Properties</h2><table><tr><th>property</th><th>status</th><th>examples</th><th>seconds</th></tr>{rows}</table>
<h2>What the search reached</h2><p class="note">{charts_note}</p>
<div class="charts">{''.join(_charts(s))}</div>
{coverage_html(s)}
{history_html(s)}
</body></html>
"""
