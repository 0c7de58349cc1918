"""report.html's sections beyond the charts of one run: the finding groups, what the
search covered (bounds, kernel share, call sites, allocation sites, routers), each
property's own time, and a nightly's history drawn over the last nights."""

from __future__ import annotations

from html import escape

from vmfuzz.harness.model.summary_file import shared_runs



def groups_html(s: dict, picture) -> str:
    """One box per cause, first on the page: its signature, who saw it, its one repro."""
    groups = s.get("groups") or []
    if not groups:
        return ""
    out = [f'<h2 id="groups">{len(groups)} finding group{"" if len(groups) == 1 else "s"} '
           f'(one per cause; {s["counts"]["findings"]} findings in all)</h2>']
    for k, g in enumerate(groups):
        # drawn from the group's own minimal repro and origin; ids apart from the findings list's
        pic = picture(g, 1000 + k)
        server = "" if g.get("server_valid", True) else " (note: no server runs this config)"
        out.append(f'<div class="finding group" data-signature="{escape(g["signature"])}">'
                   f'<h3>{escape(g["signature"])}</h3>'
                   f'<p><b>{g["count"]}</b> finding(s), seen by {escape(", ".join(g["properties"]))}</p>'
                   f'<p>{escape(g["detail"])}</p>{pic}'
                   f'<p>minimal repro ({escape(g["repro_property"])}): <code>{escape(g["repro"])}</code>{server} '
                   f'&middot; <code>vmfuzz replay {escape(g["repro"])}</code></p></div>')
    return "".join(out)


def gate_html(s: dict) -> str:
    """A gate's files: what the change touched, which of those triggered it, which a property that
    ran went through (exercised) and which it did not (not driven, and why): a green gate has not
    tested its not-driven files."""
    g = s.get("gate")
    if not g:
        return ""
    why = g.get("why_not_driven") or {}

    def files(paths, reason=False):
        if not paths:
            return "none"
        return "<ul>" + "".join(f"<li><code>{escape(p)}</code>"
                                + (f": {escape(why[p])}" if reason and why.get(p) else "") + "</li>"
                                for p in paths) + "</ul>"
    rows = [("changed", files(g.get("changed") or [])),
            ("triggered the gate (name verify-mask code)", files(g.get("triggered") or [])),
            ("exercised (its changed lines ran under a property)", files(g.get("exercised") or [])),
            ('<span class="failed">not driven</span> (triggered, not tested)', files(g.get("not_driven") or [], True))]
    rows += [("out of step", "<ul>" + "".join(f"<li>{escape(w)}</li>" for w in g["out_of_step"]) + "</ul>")
             ] if g.get("out_of_step") else []
    from vmfuzz.harness.report.terminal import changed_line_rows
    measured = changed_line_rows(g)
    if measured:
        rows.append(("changed lines (measured: which property ran each, which none did)", "<ul>" + "".join(
            f'<li><code>{escape(path)}</code>: <span class="{"held" if verdict == "exercised" else "failed"}">'
            f'{escape(verdict)}</span>: {escape(detail)}</li>' for path, verdict, detail in measured) + "</ul>"))
    if g.get("could_not_check"):
        rows.append(('<span class="failed">could not check</span>',
                     "<ul>" + "".join(f"<li>{escape(w)}</li>" for w in g["could_not_check"]) + "</ul>"))
    if g.get("checkout"):
        rows.append(("SGLang checkout tested", f"<code>{escape(g['checkout'])}</code>"))
    body = "".join(f'<tr><th>{a}</th><td>{b}</td></tr>' for a, b in rows)
    untested = len(g.get("not_driven") or [])
    note = (f'<p class="note">{untested} triggering file(s) not driven: a passing gate has not tested '
            f'{"it" if untested == 1 else "them"}.</p>' if untested else "")
    return f'<h2 id="gate">Gate: the changed files</h2><table class="gate">{body}</table>{note}'


def known_html(s: dict) -> str:
    """The known findings (``known/``: upstream's to fix) and whether each still reproduces."""
    known = s.get("known_findings") or []
    if not known:
        return ""
    rows = "".join(f'<tr><td><code>{escape(k["name"])}</code></td><td>{escape(k["property"])}</td>'
                   f'<td>{escape(k["status"])}</td><td>{escape(str(k.get("sglang", "")))}</td>'
                   f'<td>{escape(k.get("reason", ""))}</td>'
                   f'<td>{"<code>" + escape(k["repro"]) + "</code>" if k.get("repro") else ""}</td></tr>'
                   for k in known)
    return (f'<h2 id="known">Known findings (upstream\'s to fix; <code>known/</code>)</h2><table class="known">'
            f'<tr><th>name</th><th>property</th><th>status</th><th>sglang</th><th>why</th><th>repro</th></tr>'
            f'{rows}</table>')


def _items(classes: dict, prefix: str) -> list[str]:
    return sorted(f"{k.removeprefix(prefix)} ({v:,})" for k, v in classes.items() if k.startswith(prefix))


def _cell(value) -> str:
    """A coverage cell: words as they are, a list one item a line (a dozen routers read as a list, not a
    wall of commas)."""
    if isinstance(value, Html):
        return value
    if isinstance(value, str):
        return escape(value)
    if not value:
        return "none"
    return '<ul class="reached">' + "".join(f"<li>{escape(item)}</li>" for item in value) + "</ul>"


class Html(str):
    """A cell already written as HTML (its parts escaped where it was built)."""


def routers_table(classes: dict) -> Html | list:
    """The routing property's ``ROUTER (MODE) -> ROLE`` classes as a table: a row per router, a column
    per speculative attention mode, each cell the roles it handed the mask from and how often, so a
    router never driven in a mode shows as an empty cell, not as a line missing from a list."""
    cells: dict[str, dict[str, list[str]]] = {}
    modes: list[str] = []
    for name, count in sorted(classes.items()):
        head, sep, role = name.partition(" -> ")
        router, _, mode = head.rpartition(" (")
        if not sep or not router or not mode.endswith(")"):
            continue
        mode = mode[:-1]
        modes += [] if mode in modes else [mode]
        cells.setdefault(router, {}).setdefault(mode, []).append(f"{role} ({count:,})")
    if not cells:
        return []
    modes.sort()
    head = "<tr><th>router</th>" + "".join(f"<th>{escape(m)}</th>" for m in modes) + "</tr>"
    rows = "".join(f"<tr><th>{escape(r)}</th>" + "".join(
        f"<td>{escape(', '.join(by_mode.get(m, []))) or '&ndash;'}</td>" for m in modes) + "</tr>"
        for r, by_mode in sorted(cells.items()))
    return Html(f'<table class="routers">{head}{rows}</table>')


def coverage_html(s: dict) -> str:
    """What summary.md states too: the bounds searched, the kernel's share, what was reached."""
    rows = []
    for i, b in enumerate(s.get("bounds") or []):
        rows.append((f"bounds searched{f' (step {i + 1})' if len(s['bounds']) > 1 else ''}",
                     ", ".join(f"{k} {v}" for k, v in b.items())))
    if s.get("reached"):
        rows.append(("largest case reached", ", ".join(f"{k} {v}" for k, v in s["reached"].items())))
    k = s.get("kernel") or {}
    if k.get("kernel_share") is not None:
        rows.append(("kernel-time share", f"{100 * k['kernel_share']:.0f}% of the search "
                     f"({k['launches']} launches, {k['kernel_seconds']:.1f}s of {k['search_seconds']:.1f}s)"))
    classes = s.get("boundary_classes") or {}
    rows.append(("call sites reached", _items(classes, "call site ")))
    rows.append(("allocation sites reached", _items(classes, "site ")))
    routing = next((p for p in s["properties"] if p["name"] == "routing"), None)
    rows.append(("routers reached", routers_table((routing or {}).get("classes", {}))))
    body = "".join(f'<tr><th>{escape(a)}</th><td>{_cell(b)}</td></tr>' for a, b in rows)
    return f'<h2 id="coverage">What the search covered</h2><table class="coverage">{body}</table>'


def property_rows(props: list[dict]) -> str:
    """The properties table's rows; a shared run's time once, on its own row, its members "shared".

    The drafting properties are judged on one run of each case: a member's
    seconds are its share of that run (equal shares a round; a member that
    failed leaves the later rounds to the others), so the run's time is the
    sum of its members' and no member's own.
    """
    runs = shared_runs(props)
    out, shown = [], set()
    for p in props:
        run = p.get("shared_run")
        if run and run not in shown:
            shown.add(run)
            members = runs[run]
            total = sum(m["seconds"] for m in members)
            names = ", ".join(m["name"] for m in members)
            out.append(f'<tr class="shared-run" data-seconds="{total:.3f}"><td>shared run of {len(members)} '
                       f'properties</td><td colspan="2">{escape(names)}: each case run once, every one judged '
                       f'on it</td><td>{total:.1f}</td></tr>')
        secs = (f'<td class="shared" title="its share: {p["seconds"]:.1f} s">shared</td>' if run
                else f'<td>{p["seconds"]:.1f}</td>')
        out.append(f'<tr><td>{escape(p["name"])}</td><td class="{p["status"]}">{p["status"]}</td>'
                   f'<td>{p["examples"]}</td>{secs}</tr>')
    return "".join(out)


def line_chart(chart_id: str, title: str, points: list[tuple[str, float]], note: str = "",
               width: int = 560, height: int = 180) -> str:
    """One value per night, oldest left; each point carries its night and value."""
    left, right, top, bottom = 56, 16, 40, 28
    hi = max([v for _, v in points] + [1])
    span_x = width - left - right
    step = span_x / max(1, len(points) - 1)
    xy = [(left + i * step, top + (height - top - bottom) * (1 - v / hi)) for i, (_, v) in enumerate(points)]
    parts = [f'<svg class="chart history" id="{chart_id}" data-chart="{escape(title)}" '
             f'xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'role="img"><title>{escape(title)}</title>',
             f'<text x="8" y="16" class="ctitle">{escape(title)}</text>',
             f'<text x="8" y="32" class="note">{escape(note)}</text>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#999"/>',
             f'<text x="{left - 6}" y="{top + 4}" text-anchor="end" class="val">{hi:,g}</text>',
             f'<text x="{left - 6}" y="{height - bottom}" text-anchor="end" class="val">0</text>']
    if len(xy) > 1:
        parts.append('<polyline fill="none" stroke="#3f6fb5" stroke-width="2" points="'
                     + " ".join(f"{x:.1f},{y:.1f}" for x, y in xy) + '"/>')
    for (label, v), (x, y) in zip(points, xy):
        parts.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#3f6fb5" '
                     f'data-label="{escape(label)}" data-value="{v:g}"/>')
    if points:
        parts.append(f'<text x="{left}" y="{height - 8}" class="val">{escape(points[0][0])}</text>'
                     f'<text x="{width - right}" y="{height - 8}" text-anchor="end" class="val">'
                     f'{escape(points[-1][0])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def history_html(s: dict) -> str:
    """A nightly's last nights (the database's history file), as plots: one per measure."""
    nights = s.get("history") or []
    if not nights:
        return ""
    day = [n.get("started", "?")[:10] for n in nights]

    def series(key):
        return list(zip(day, (float(n.get(key) or 0) for n in nights)))
    charts = [
        line_chart("history-findings", "finding groups per night", series("groups"),
                   note="one per cause; 0 is a night that found nothing"),
        line_chart("history-examples", "examples per night", series("examples")),
        line_chart("history-bounds", "largest context reached per night", series("context_reached"),
                   note="max_context_len of the largest case the search ran"),
        line_chart("history-classes", "boundary classes covered per night", series("classes")),
    ]
    return (f'<h2 id="history">The last {len(nights)} nights</h2><p class="note">from the history file in '
            f'the database directory, this night last</p><div class="charts">{"".join(charts)}</div>')
