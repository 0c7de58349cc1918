"""report.html: one self-contained page (inline SVG, inline CSS, no scripts or CDN).

A CI artifact is often opened offline or behind a proxy; anything fetched from
elsewhere would leave an empty page. A failing run opens with its findings --
for one whose origin locates it in the mask (an overrun, or a wrong cell's
class), a picture of the buffer with the offending cells marked
(harness/report/buffers.py) -- and every chart says what it counts.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from html import escape
from pathlib import Path

from vmfuzz.harness.model.verdict import Kind
from vmfuzz.harness.report.buffers import buffer_picture, svg_open

BS_BUCKETS = ("< 0.5", "0.5-1", "= 1", "1-1.5", "1.5-2", "> 2")
LEGEND = {"reuse": "reuse steps", "fallback": "fallback steps", "arithmetic": "no write (capacity)"}
PATH_COLOURS = {"reuse": "#3f6fb5", "fallback": "#9e9e9e", "arithmetic": "#c7a252"}


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
    parts = svg_open(chart_id, title, width, height) + head
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
    parts = svg_open(chart_id, title, width, height) + head
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
.buf{fill:#eee;stroke:#444;stroke-width:1.5}.oob{fill:#d32f2f}.wrong-cell{stroke:#7f0000;stroke-width:.5}.req.past{stroke:#d32f2f;stroke-width:2}
.end{stroke:#d32f2f;stroke-width:2;stroke-dasharray:5 3}.endlbl{fill:#b00020;font-weight:bold}.inv{fill:#fff}
code{background:#f2f2f2;padding:1px 3px}
ul.reached{margin:0;padding-left:18px;columns:2;column-gap:24px;font-size:13px}"""


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


#: report.html's title word and its colour (a CSS class) for each verdict: every kind, and exit 3
#: always reads "could not check"
HTML_TITLE = {
    Kind.HELD: ("passed", "held"), Kind.KNOWN: ("passed (known findings only)", "held"),
    Kind.NEW_FINDING: ("FAILED", "failed"), Kind.HELD_IN_PART: ("could not check (held in part)", "skipped"),
    Kind.COULD_NOT_CHECK: ("could not check", "skipped"), Kind.NEEDS_GPU: ("could not check (needs a GPU)", "skipped"),
    Kind.OUT_OF_STEP: ("could not check (vmfuzz out of step)", "skipped"),
    Kind.CANNOT_LOAD: ("could not check (cannot load the code under test)", "skipped"),
    Kind.LANE_LOST: ("could not check (a search lane was lost)", "skipped"),
    Kind.INTERRUPTED: ("interrupted", "failed"),
}


def report_html(s: dict, folder: Path | None = None) -> str:
    """The page of ``s``, written into ``folder``: the repro paths relative to it are read from there."""
    from vmfuzz.harness.report.decide import verdict_of
    from vmfuzz.harness.report.unchecked import cap_line
    c = s["counts"]
    v = verdict_of(s)
    verdict, css = HTML_TITLE[v.kind]
    # the same reason summary.md gives, so a page that does not pass always says why
    said = [f"{v.headline}: {v.why}" if v.exit_code and v.why else "", cap_line(s) if v.exit_code else ""]
    reason = "" if not any(said) else (
        '<p class="note"><b>' + "</b><br>".join(escape(line) for line in said if line) + "</p>")
    from vmfuzz.harness.report.html_sections import (coverage_html, gate_html, groups_html, history_html, known_html,
                                              property_rows)
    rows = property_rows(s["properties"])
    held_in_part = f" / {c['held_in_part']} held in part" if c.get("held_in_part") else ""
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
<h1>vmfuzz {escape(s['command'])} on <code>{escape(s['target'])}</code>: <span class="{css}">{escape(verdict)}</span></h1>
<p>profile <b>{escape(s['profile'])}</b>, seed <b>{s['seed']}</b>, {c['examples']:,} examples,
{c['held']} held / {c['failed']} failed / {c['skipped']} skipped{held_in_part}, {s['timings']['total_seconds']:.0f}s. {versions}</p>
{reason}
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


def command_html(s: dict) -> str:
    """The page of a ``run`` or ``gate`` that ended before its search (a skipped gate, code under test
    that did not load): its verdict, why, and each check."""
    if "verdict_kind" in s:
        verdict, css = HTML_TITLE[Kind(s["verdict_kind"])]
    else:
        verdict, css = {"failed": ("FAILED", "failed"), "passed": ("passed", "held"), "skipped": ("skipped", "skipped"),
                        "could not check": ("could not check", "skipped")}[s["verdict"]]
    rows = "".join(f'<tr><td>{escape(k["name"])}</td><td class="{escape(k["status"])}">{escape(k["status"])}</td>'
                   f'<td>{escape(k["detail"])}</td></tr>' for k in s["checks"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>vmfuzz {escape(s['target'])}: {escape(verdict)}</title>
<style>{CSS}</style></head><body>
<h1>vmfuzz {escape(s['command'])} on <code>{escape(s['target'])}</code>: <span class="{css}">{escape(verdict)}</span></h1>
<p>{escape(s.get('headline') or '')}</p>
<table><tr><th>check</th><th>status</th><th>detail</th></tr>{rows}</table>
</body></html>
"""
