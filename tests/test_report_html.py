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
const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
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
    assert html.count('<svg class="chart"') == 5


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)")
def test_charts_are_drawn_in_headless_chromium(report, tmp_path):
    page = tmp_path / "probe.html"
    page.write_text((report / "report.html").read_text().replace("</body>", PROBE))
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert m, "the page did not render (no probe output): " + dom[:300]
    charts = json.loads(m.group(1).replace("&quot;", '"'))
    summary = json.loads((report / "summary.json").read_text())
    assert {c["id"] for c in charts} == {"bs-ratio", "reuse-fallback", "layouts", "overflow-margin", "examples"}
    for c in charts:
        assert c["width"] > 100 and c["height"] > 30, c
    by_id = {c["id"]: c for c in charts}
    # every chart with data has visible bars; the counts come from the run, not from the page
    assert by_id["examples"]["drawn"] == sum(1 for p in summary["properties"] if p["examples"] > 0)
    assert by_id["bs-ratio"]["drawn"] >= 2
    assert by_id["overflow-margin"]["drawn"] >= 1
    assert by_id["layouts"]["drawn"] >= 1
