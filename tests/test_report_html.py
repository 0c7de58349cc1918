"""report.html renders its charts in a real browser (headless Chromium) and needs nothing external."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.helpers import vmfuzz

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "chrome")
                 if shutil.which(n)), None)

# Measures what the browser actually laid out; appended to a copy, never to the report itself.
PROBE = """<script>
const out = [...document.querySelectorAll('svg.chart')].map(svg => {
  const bars = [...svg.querySelectorAll('rect.bar')];
  const box = svg.getBoundingClientRect();
  return {id: svg.id, width: box.width, height: box.height, bars: bars.length,
          drawn: bars.filter(r => r.getBBox().width > 0 && r.getBBox().height > 0).length};
});
const buffers = [...document.querySelectorAll('svg.buffer')].map(svg => {
  const box = r => r.getBoundingClientRect();
  const end = box(svg.querySelector('line.end')), oob = box(svg.querySelector('rect.oob'));
  const buf = box(svg.querySelector('rect.buf'));
  return {end: end.left, oob_left: oob.left, oob_right: oob.right, oob_width: oob.width,
          buf_left: buf.left, buf_right: buf.right, requests: svg.querySelectorAll('rect.req').length};
});
const order = {finding: document.querySelector('.finding') ? document.querySelector('.finding').getBoundingClientRect().top : null,
               charts: document.querySelector('.charts').getBoundingClientRect().top};
const pre = document.createElement('pre'); pre.id = 'probe';
pre.textContent = JSON.stringify({charts: out, buffers: buffers, order: order});
document.body.appendChild(pre);
</script></body>"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    rep = tmp_path_factory.mktemp("report")
    r = vmfuzz("run", "--target", "reference+pr33127", "--seed", "2", "--max-examples", "15",
               "--property", "no-oob-write", "--property", "capacity-soundness",
               # the boundary corpus finds pr33127 on the first example; a property that
               # holds on it keeps passing examples in the report for the charts
               "--property", "capacity-liveness", "--report-dir", str(rep))
    assert r.returncode in (0, 1), r.stderr
    return rep


def test_report_is_self_contained(report):
    html = (report / "report.html").read_text()
    assert "<script" not in html and "<link" not in html
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert html.count('<svg class="chart"') == 4
    # the group comes first; what summary.md says of the search is on the page too
    assert html.index('class="finding group"') < html.index('id="findings"')
    for fact in ("bounds searched", "kernel-time share", "call sites reached", "routers reached"):
        assert fact in html, fact
    # what was reached reads as a list, one item a line, never one cell of commas
    reached = re.search(r"<th>call sites reached</th><td>(.*?)</td>", html).group(1)
    assert reached == "none" or (reached.startswith('<ul class="reached"><li>') and ", " not in reached), reached
    assert "examples per property" not in html
    # the finding comes first, with its buffer picture
    assert html.index('class="finding group"') < html.index('class="charts"')
    assert html.count('<svg class="buffer"') == 1


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)")
def test_charts_are_drawn_in_headless_chromium(report, tmp_path):
    page = tmp_path / "probe.html"
    page.write_text((report / "report.html").read_text().replace("</body>", PROBE))
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert m, "the page did not render (no probe output): " + dom[:300]
    probe = json.loads(m.group(1).replace("&quot;", '"'))
    charts = probe["charts"]
    summary = json.loads((report / "summary.json").read_text())
    assert {c["id"] for c in charts} == {"bs-ratio", "reuse-fallback", "layouts", "overflow-margin"}
    for c in charts:
        assert c["width"] > 100 and c["height"] > 30, c
    by_id = {c["id"]: c for c in charts}
    # every chart with data has visible bars; the counts come from the run, not from the page
    assert summary["counts"]["groups"] == 1
    assert by_id["bs-ratio"]["drawn"] >= 2
    assert by_id["overflow-margin"]["drawn"] >= 1
    assert by_id["layouts"]["drawn"] >= 1
    # A failing run leads with its finding; the no-oob-write finding is drawn as the buffer,
    # its end, each request's block and the cells written past the end (right of the end line).
    assert probe["order"]["finding"] is not None and probe["order"]["finding"] < probe["order"]["charts"]
    assert len(probe["buffers"]) == 1, probe["buffers"]
    buf = probe["buffers"][0]
    assert buf["requests"] == 2 and buf["oob_width"] > 0
    assert abs(buf["end"] - buf["buf_right"]) < 2 and buf["oob_left"] >= buf["end"] - 1, buf


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)")
def test_screenshot_of_a_failing_report(report, tmp_path):
    """A PNG of the page, kept beside the report for a person to look at (report.png)."""
    shot = report / "report.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1240,1500", f"--screenshot={shot}", (report / "report.html").as_uri()],
                   capture_output=True, text=True, timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1240, 1500)
    # a blank page compresses to a few KB; charts, text and the buffer picture do not
    assert len(data) > 40_000, len(data)


HISTORY_PROBE = """<script>
const out = [...document.querySelectorAll('svg.history')].map(svg => {
  const pts = [...svg.querySelectorAll('circle.point')];
  const line = svg.querySelector('polyline');
  return {id: svg.id, points: pts.length, width: svg.getBoundingClientRect().width,
          line: line ? line.getBBox().width : 0,
          values: pts.map(p => Number(p.dataset.value)),
          ys: pts.map(p => p.getBoundingClientRect().top)};
});
const pre = document.createElement('pre'); pre.id = 'probe';
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script></body>"""


@pytest.fixture(scope="module")
def nightly(tmp_path_factory):
    """A nightly whose database already holds three earlier nights."""
    base = tmp_path_factory.mktemp("nightly")
    db = base / "db"
    db.mkdir()
    earlier = [{"started": f"2026-11-0{i}T02:00:00+00:00", "groups": g, "findings": f, "examples": e,
                "classes": c, "context_reached": ctx} for i, g, f, e, c, ctx in
               ((1, 0, 0, 900, 30, 64), (2, 2, 9, 1200, 34, 256), (3, 1, 3, 1500, 36, 1024))]
    (db / "history.jsonl").write_text("".join(json.dumps(n) + "\n" for n in earlier))
    r = vmfuzz("run", "--profile", "nightly", "--target", "reference", "--seed", "3", "--time-budget", "8",
               "--max-examples", "10", "--property", "capacity-soundness", "--property", "capacity-liveness",
               "--db", str(db), "--report-dir", str(base / "rep"))
    assert r.returncode == 0, r.stdout + r.stderr
    return base


@pytest.mark.slow
def test_a_nightly_appends_one_record(nightly):
    lines = (nightly / "db" / "history.jsonl").read_text().splitlines()
    assert len(lines) == 4
    last = json.loads(lines[-1])
    assert last["groups"] == 0 and last["examples"] > 0 and last["classes"] > 0


def test_history_is_bounded(tmp_path):
    from vmfuzz.harness.engine.campaign.history import append_night, load
    for i in range(7):
        append_night(tmp_path, {"started": str(i)}, keep=5)
    assert [n["started"] for n in load(tmp_path)] == ["2", "3", "4", "5", "6"]
    # no temporary left behind; .lock is the database's lock, the one last-failures is updated under
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "history.jsonl"]


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)")
@pytest.mark.slow
def test_nightly_history_is_plotted_in_headless_chromium(nightly, tmp_path):
    rep = nightly / "rep"
    page = tmp_path / "probe.html"
    page.write_text((rep / "report.html").read_text().replace("</body>", HISTORY_PROBE))
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert m, "the page did not render: " + dom[:300]
    charts = {c["id"]: c for c in json.loads(m.group(1).replace("&quot;", '"'))}
    assert set(charts) == {"history-findings", "history-examples", "history-bounds", "history-classes"}
    for c in charts.values():
        assert c["points"] == 4 and c["line"] > 100 and c["width"] > 100, c
    assert charts["history-findings"]["values"][:3] == [0, 2, 1]
    # the night with two groups is drawn higher than the nights with none
    ys = charts["history-findings"]["ys"]
    assert ys[1] < ys[2] < ys[0]
    shot = rep / "history.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1240,2400", f"--screenshot={shot}", (rep / "report.html").as_uri()],
                   capture_output=True, text=True, timeout=120)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_shared_run_shows_its_time_once(report):
    """The three properties searched together: one row with the run's time, each member "shared",
    even when a member's finding left the later rounds to the others (unequal shares)."""
    s = json.loads((report / "summary.json").read_text())
    members = [p for p in s["properties"] if p.get("shared_run")]
    assert [p["name"] for p in members] == ["no-oob-write", "capacity-soundness", "capacity-liveness"]
    assert {p["shared_run"] for p in members} == {"shared:no-oob-write,capacity-soundness,capacity-liveness"}
    total = sum(p["seconds"] for p in members)
    # the shares add up to the run, never to a multiple of it
    assert total <= s["timings"]["search_seconds"] + 0.01
    html = (report / "report.html").read_text()
    rows = re.findall(r'<tr class="shared-run" data-seconds="([\d.]+)">(.*?)</tr>', html)
    assert len(rows) == 1 and abs(float(rows[0][0]) - total) < 0.01, rows
    assert f"<td>{total:.1f}</td>" in rows[0][1]
    table = html[html.index("<h2>Properties</h2>"):]
    for p in members:
        row = re.search(rf'<tr><td>{p["name"]}</td>.*?</tr>', table).group(0)
        assert '<td class="shared"' in row and f'<td>{p["seconds"]:.1f}</td>' not in row, row
    md = (report / "summary.md").read_text()
    assert md.count("Shared run of") == 1 and f"{total:.1f} s" in md
    assert all(f"| {p['name']} | {p['status']} | {p['examples']} | shared |" in md for p in members)


def _repro(folder, name, config, batches, prop):
    (folder / "findings").mkdir(exist_ok=True)
    (folder / "findings" / name).write_text(json.dumps({"target": "reference+pr33127", "property": prop,
                                                        "config": config, "batches": batches}))
    return f"findings/{name}"


def test_a_groups_picture_is_its_own_repro_not_a_members_words(tmp_path):
    """The group's minimal repro is a 3-cell buffer; a member's finding (its own, larger case)
    says "8 cells" in its words. The picture is the 3-cell one, from the repro and the origin alone."""
    from functools import partial
    from vmfuzz.harness.report.html import buffer_picture
    from vmfuzz.harness.report.html_sections import groups_html
    base = {"mode": "FULL_MASK", "max_bs": 1, "max_context_len": 2, "topk": 1, "spec_steps": 1, "is_read": True}
    small = _repro(tmp_path, "capacity-soundness.json", {**base, "num_draft_tokens": 1}, [{"seq_lens": [2]},
                                                                                         {"seq_lens": [1, 2]}],
                   "capacity-soundness")
    large = _repro(tmp_path, "no-oob-write.json", {**base, "num_draft_tokens": 2}, [{"seq_lens": [2, 2]}],
                   "no-oob-write")
    origin = {"effect": "overrun", "writer": "verify step", "buffer": "tree_mask", "side": "above",
              "cell": "request past the buffer's capacity"}
    s = {"counts": {"findings": 2},
         "groups": [{"signature": "overrun tree_mask above", "count": 2, "properties": ["capacity-soundness",
                     "no-oob-write"], "repro": small, "repro_property": "capacity-soundness", "detail": "d",
                     "members": [large, small], "origin": {"property": "capacity-soundness", **origin}}],
         "findings": [{"property": "no-oob-write", "kind": "property", "repro": large,
                       "origin": {"property": "no-oob-write", **origin},
                       "detail": "out-of-bounds write on the reused buffer (bs 2, max_bs 1): tree_mask: 4 cell(s) "
                                 "written at offsets [10, 16) outside its 8 cells (back redzone, request 1)"},
                      {"property": "capacity-soundness", "kind": "property", "repro": small, "detail": "short",
                       "origin": {"property": "capacity-soundness", **origin}}]}
    html = groups_html(s, partial(buffer_picture, folder=tmp_path))
    # FULL_MASK, max_bs 1, context 2, d 1: 3 cells; its second batch [1, 2] needs 1*3 + 1*2 = 5
    assert 'class="buffer"' in html and "2 requests need 5 cells of its 3" in html, html
    assert "cell(s) in [3, 5)" in html and "buffer end: cell 3" in html
    assert "8 cells" not in html and "[10, 16)" not in html
    # reworded members change nothing: the picture never reads a finding's words
    s["findings"][0]["detail"] = "something else entirely"
    assert groups_html(s, partial(buffer_picture, folder=tmp_path)) == html
    # an origin that is no overrun of the mask above its end is not drawn, whatever the words
    s["groups"][0]["origin"] = {"property": "capacity-soundness", "effect": "wrong", "buffer": "tree_mask"}
    assert 'class="buffer"' not in groups_html(s, partial(buffer_picture, folder=tmp_path))


def test_known_findings_are_listed_with_their_status(report):
    """The known entries summary.md lists (name, property, status, release range) are on the page too."""
    from vmfuzz.harness.report.html import report_html
    from vmfuzz.harness.report.summary import summary_md
    s = json.loads((report / "summary.json").read_text())
    assert 'id="known"' not in report_html(s, report)  # none known: no section
    s["known_findings"] = [
        {"name": "policy-behind-router", "property": "routing", "sglang": ">=0.5.19,<=0.5.23",
         "reason": "decides for the router's class", "status": "reproduces", "detail": "d",
         "repro": "findings/known-policy-behind-router.json"},
        {"name": "old-one", "property": "routing", "sglang": ">=0.5.17,<=0.5.22", "reason": "fixed upstream",
         "status": "no longer reproduces", "detail": "d", "repro": "known/old-one.json"}]
    html = report_html(s, report)
    section = html[html.index('<h2 id="known">'):]
    rows = re.findall(r"<tr><td><code>(.*?)</code></td><td>(.*?)</td><td>(.*?)</td>", section)
    assert rows == [("policy-behind-router", "routing", "reproduces"), ("old-one", "routing", "no longer reproduces")]
    md = summary_md(s)
    assert all(f"`{k['name']}` ({k['property']}" in md and k["status"] in md for k in s["known_findings"])


def _group(repro: str, origin: dict, detail: str = "d") -> dict:
    return {"signature": "s", "count": 1, "properties": [origin["property"]], "repro": repro,
            "repro_property": origin["property"], "detail": detail, "members": [repro], "origin": origin}


#: FULL_MASK, d 3, seq_lens [2, 1]: request 0's rows are 2 + 3 cells wide at [0, 15), request 1's
#: 1 + 3 at [15, 27); a row's first seq_len cells are its prefix columns
PREFIX_COLUMNS = ["0-2", "5-7", "10-12", "15-16", "19-20", "23-24"]


def test_a_wrong_groups_picture_marks_the_cells_of_the_class_its_origin_names(tmp_path):
    from vmfuzz.harness.report.html import buffer_picture
    from vmfuzz.harness.report.html_sections import groups_html
    config = {"mode": "FULL_MASK", "max_bs": 2, "max_context_len": 4, "num_draft_tokens": 3, "topk": 1,
              "spec_steps": 2}
    one = _repro(tmp_path, "one.json", config, [{"seq_lens": [2, 1]}], "fallback-equivalence")
    origin = {"property": "fallback-equivalence", "effect": "wrong", "writer": "verify step", "buffer": "tree_mask",
              "cell": "prefix column"}
    draw = lambda groups: groups_html({"counts": {"findings": len(groups)}, "groups": groups},  # noqa: E731
                                      lambda g, i: buffer_picture(g, i, folder=tmp_path))
    html = draw([_group(one, origin, detail="first at cell 999 (request 7)")])
    assert html.count('<svg class="buffer wrong"') == 1, html
    assert re.findall(r'class="oob wrong-cell"[^>]*data-cells="([\d-]+)"', html) == PREFIX_COLUMNS
    assert "999" not in html.split("</h3>", 1)[1].split("<svg", 1)[1]  # the words are never drawn from
    # the chain writer's and a reader's wording of the same class mark the same cells
    for named in ("prefix column (vs the tree kernel)", "read prefix column"):
        again = draw([_group(one, {**origin, "cell": named})])
        assert re.findall(r'data-cells="([\d-]+)"', again) == PREFIX_COLUMNS, named
    # a tree cell that should be hidden: the chain's upper triangle, row by row (tree columns 2-4 of request 0)
    hidden = draw([_group(one, {**origin, "cell": "tree cell that should be hidden"})])
    assert re.findall(r'data-cells="([\d-]+)"', hidden)[:2] == ["3-5", "9-10"]
    # no cell, a class that names no cell of the mask, another buffer: nothing is drawn
    for other in ({**origin, "cell": ""}, {**origin, "cell": "reuse"},
                  {**origin, "buffer": "positions", "cell": "value"}):
        assert '<svg class="buffer' not in draw([_group(one, other)]), other
    # two batches: the origin's step says which is drawn, and without one nothing is
    two = _repro(tmp_path, "two.json", config, [{"seq_lens": [4]}, {"seq_lens": [2, 1]}], "fallback-equivalence")
    assert '<svg class="buffer' not in draw([_group(two, origin)])
    stepped = draw([_group(two, {**origin, "step": 1})])
    assert re.findall(r'data-cells="([\d-]+)"', stepped) == PREFIX_COLUMNS


def test_an_overrun_before_the_start_is_marked_left_of_cell_0(tmp_path):
    from vmfuzz.harness.report.html import buffer_picture
    config = {"mode": "QLEN_ONLY", "max_bs": 2, "max_context_len": 4, "num_draft_tokens": 2, "topk": 1,
              "spec_steps": 1}
    rep = _repro(tmp_path, "below.json", config, [{"seq_lens": [1, 1]}], "no-oob-write")
    origin = {"property": "no-oob-write", "effect": "overrun", "writer": "verify step", "buffer": "tree_mask",
              "side": "below", "cell": "request the buffer was sized for"}
    html = buffer_picture(_group(rep, origin), 0, folder=tmp_path)
    oob = re.search(r'<rect class="oob" x="([\d.]+)"[^>]*width="([\d.]+)"', html)
    start = re.search(r'<rect class="buf" x="([\d.]+)"', html)
    assert oob and start and float(oob.group(1)) + float(oob.group(2)) <= float(start.group(1)), html
    assert "before the start" in html and "buffer start: cell 0" in html


def test_routers_reached_is_a_table_router_by_mode():
    from vmfuzz.harness.report.html_sections import coverage_html
    classes = {"hybrid (prefill) -> prefill": 7, "hybrid (decode) -> decode": 3, "tbo (prefill) -> tbo-primary": 2,
               "hybrid: known finding x": 1, "bs < max_bs": 9}
    html = coverage_html({"properties": [{"name": "routing", "classes": classes}]})
    table = re.search(r'<th>routers reached</th><td>(<table class="routers">.*?</table>)</td>', html).group(1)
    rows = re.findall(r"<tr>(.*?)</tr>", table)
    assert re.findall(r"<th>(.*?)</th>", rows[0]) == ["router", "decode", "prefill"]
    assert rows[1] == "<th>hybrid</th><td>decode (3)</td><td>prefill (7)</td>"
    # a router never driven in a mode is an empty cell, not a missing line
    assert rows[2] == "<th>tbo</th><td>&ndash;</td><td>tbo-primary (2)</td>" and len(rows) == 3
    assert "<th>routers reached</th><td>none</td>" in coverage_html({"properties": []})
