"""Nothing from the data is ever Markdown, in a real headless Chromium (issue 27 #1): every page
over the hostile store (:func:`tests.dashboard_support.build_hostile_db`) and the Alerts page
with a hostile ``?tz=`` / ``?day=`` make no request to a host the page did not name (the
dashboard's own ``127.0.0.1:PORT``), and show no link to the data's hosts, in the page or
drawn by Plotly inside a chart (a title, legend name or tick holding ``<a href>``: the charts
show the names as text, :func:`prefixscope.core.formatting.plotly_text`).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests import dashboard_support as ds
from tests.test_savings_user_data import DAY0, _records

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory) -> str:
    work = tmp_path_factory.mktemp("hostile_browser")
    shift = 1795910400.0 - 4 * 86400 - DAY0  # m-alert's ALERT days: the real captures' days
    records = [dict(r, ts_unix_s=r["ts_unix_s"] + shift) for r in _records()]
    return ds.build_hostile_db(work / "hostile.duckdb", usage_records=records, workdir=work)


def test_no_request_leaves_for_a_host_the_page_did_not_name(hostile_db, tmp_path):
    entries = ds.page_entries()
    with ds.dashboard_server(hostile_db, log_path=tmp_path / "server.log") as url:
        own = urlsplit(url).netloc
        foreign: list[str] = []
        with ds.chromium(tmp_path / "chromium-profile") as context:
            context.on("request", lambda r: foreign.append(r.url)
                       if urlsplit(r.url).scheme in ("http", "https", "ws", "wss")
                       and urlsplit(r.url).netloc != own else None)
            page = context.new_page()
            links: list[str] = []
            chart_links: list[str] = []
            shown: list[str] = []
            charts = 0
            urls = [f"{url}/{ds.page_url_path(rel, first=(i == 0))}"
                    for i, (rel, _t, _i) in enumerate(entries)]
            urls += [f"{url}/alerts?tz=!%5Bp%5D(http://127.0.0.1:9/p.png)",
                     f"{url}/alerts?tz=%5BSession%20expired:%20log%20in%5D"
                     "(https://evil.example/login)",
                     f"{url}/alerts?day=!%5Bp%5D(https://evil.example/p.png)&tz=UTC"]
            for target in urls:
                page.goto(target, wait_until="domcontentloaded")
                ds.wait_for_streamlit(page)
                page.wait_for_timeout(500)  # images of the last render start loading
                # a link to the data's hosts (the page's own anchors carry its URL, ?tz=
                # included, and stay on its host)
                links += page.eval_on_selector_all(
                    "a[href]", "els => els.map(e => e.href).filter(h => h.startsWith('http')"
                    " && new URL(h).host !== location.host"
                    " && (h.includes('evil.example') || h.includes('127.0.0.1:9/')))")
                # a link drawn inside a chart (Plotly's pseudo-HTML ``<a href>`` in a title,
                # legend name or tick: an SVG ``<a>`` with an ``xlink:href``): the figures
                # draw none, so any is from the data (issue 27 #1, plotly_text)
                chart_links += [f"{target}: {h}" for h in page.eval_on_selector_all(
                    ".js-plotly-plot svg a", "els => els.map(e => (e.href && e.href.baseVal"
                    " !== undefined) ? e.href.baseVal : (e.getAttribute('href') || ''))")]
                charts += page.locator(".js-plotly-plot").count()
                shown += page.eval_on_selector_all(
                    ".js-plotly-plot svg text", "els => els.map(e => e.textContent)"
                    ".filter(t => t.includes('evil'))")
        log = (tmp_path / "server.log").read_text(errors="replace")
    assert not foreign, sorted(set(foreign))
    assert not links, links
    assert not chart_links, chart_links
    # the charts were drawn, with the data's names in them as text
    assert charts > 5 and any("<a href=" in t and "<b>html</b>" in t for t in shown), (
        charts, shown[:3])
    assert not ds.app_tracebacks(log), ds.app_tracebacks(log)[:1]
