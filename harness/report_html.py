"""report.html: one self-contained page (inline SVG, inline CSS, no scripts or CDN).

A CI artifact is often opened offline or behind a proxy; anything fetched from
elsewhere would leave an empty page.
"""

from __future__ import annotations

from collections import Counter
from html import escape

BS_BUCKETS = ("< 0.5", "0.5-1", "= 1", "1-1.5", "1.5-2", "> 2")


def bar_chart(chart_id: str, title: str, data: list[tuple[str, float]], *, width: int = 520) -> str:
    """Horizontal bars, one per label, scaled to the largest value."""
    row, label_w, pad = 24, 150, 8
    height = pad * 2 + row * max(1, len(data)) + 20
    top = max([v for _, v in data] + [1])
    parts = [f'<svg class="chart" id="{chart_id}" data-chart="{escape(title)}" xmlns="http://www.w3.org/2000/svg" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">',
             f'<title>{escape(title)}</title>',
             f'<text x="{pad}" y="16" class="ctitle">{escape(title)}</text>']
    span = width - label_w - 60
    for i, (label, v) in enumerate(data):
        y = 20 + pad + i * row
        w = 0 if v <= 0 else max(2.0, span * v / top)
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" class="lbl">{escape(label)}</text>')
        parts.append(f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row - 8}" '
                     f'data-label="{escape(label)}" data-value="{v:g}"/>')
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 15}" class="val">{v:g}</text>')
    if not data:
        parts.append(f'<text x="{label_w}" y="{20 + pad + 15}" class="lbl">no data</text>')
    parts.append("</svg>")
    return "".join(parts)


def _charts(s: dict) -> list[str]:
    bs = Counter()
    for p in s["properties"]:
        bs.update(p["bs_over_max_bs"])
    classes = s["boundary_classes"]
    paths = [("reuse", classes.get("path reuse", 0)), ("fallback", classes.get("path fallback", 0))]
    layouts = sorted((k.removeprefix("layout "), v) for k, v in classes.items() if k.startswith("layout "))
    return [
        bar_chart("bs-ratio", "batches by bs / max_bs", [(b, bs.get(b, 0)) for b in BS_BUCKETS]),
        bar_chart("reuse-fallback", "verify steps: reuse vs fallback", paths),
        bar_chart("layouts", "examples per layout", layouts),
        bar_chart("overflow-margin", "overflow margin (cells past the buffer end; > 0 overflows)",
                  list(s["overflow_margin"].items())),
        bar_chart("examples", "examples per property", [(p["name"], p["examples"]) for p in s["properties"]]),
    ]


CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
.failed{color:#b00020;font-weight:bold}.held{color:#1b5e20}.skipped{color:#777}
.charts{display:flex;flex-wrap:wrap;gap:16px}.chart{border:1px solid #ddd;background:#fafafa}
.bar{fill:#3f6fb5}.ctitle{font-weight:bold;font-size:13px}.lbl,.val{font-size:12px}
code{background:#f2f2f2;padding:1px 3px}"""


def report_html(s: dict) -> str:
    c = s["counts"]
    verdict = "FAILED" if c["findings"] else "passed"
    rows = "".join(f'<tr><td>{escape(p["name"])}</td><td class="{p["status"]}">{p["status"]}</td>'
                   f'<td>{p["examples"]}</td><td>{p["seconds"]:.1f}</td></tr>' for p in s["properties"])
    frows = "".join(f'<tr><td>{escape(f["property"])}</td><td>{escape(f["kind"])}</td>'
                    f'<td>{escape(f["detail"])}</td><td><code>{escape(f["repro"])}</code></td></tr>'
                    for f in s["findings"]) or '<tr><td colspan="4">none</td></tr>'
    versions = ", ".join(f"{escape(k)} {escape(str(v))}" for k, v in s["versions"].items())
    dep = ""
    if s.get("deployment"):
        d = s["deployment"]
        dep = (f'<p>Deployment {escape(d["label"])}: <b>{"can" if d["can_write_out_of_range"] else "cannot"} '
               f'write out of range</b> ({escape(d["why"])})</p>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>vmfuzz {escape(s['target'])}: {verdict}</title>
<style>{CSS}</style></head><body>
<h1>vmfuzz {escape(s['command'])} on <code>{escape(s['target'])}</code>: <span class="{'failed' if c['findings'] else 'held'}">{verdict}</span></h1>
<p>profile <b>{escape(s['profile'])}</b>, seed <b>{s['seed']}</b>, {c['examples']} examples,
{c['held']} held / {c['failed']} failed / {c['skipped']} skipped, {s['timings']['total_seconds']:.0f}s. {versions}</p>
{dep}
<div class="charts">{''.join(_charts(s))}</div>
<h2>Properties</h2><table><tr><th>property</th><th>status</th><th>examples</th><th>seconds</th></tr>{rows}</table>
<h2>Findings</h2><table id="findings"><tr><th>property</th><th>kind</th><th>detail</th><th>repro</th></tr>{frows}</table>
</body></html>
"""
