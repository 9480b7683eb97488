"""The default page also opens at its own URL path: ``/overview`` shows Overview (as
``/requests`` shows Requests), with no "Page not found" dialog, in a real headless Chromium
against a real ``prefixscope dashboard`` server."""

from __future__ import annotations

import pytest

from tests import dashboard_support as ds

pytestmark = pytest.mark.browser


def test_overview_url_path_opens_overview(tmp_path):
    from prefixscope.dashboard.app import PAGES, url_path

    db = ds.build_real_db(tmp_path / "real.duckdb")
    first = url_path(PAGES[0][0])
    assert first == "overview"
    with ds.dashboard_server(db, log_path=tmp_path / "server.log") as url, \
            ds.chromium(tmp_path / "profile") as browser:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{url}/{first}?tab=x", wait_until="domcontentloaded")
        ds.wait_for_streamlit(page)
        assert page.locator("h1").first.inner_text().strip() == "Overview"
        body = page.locator("body").inner_text()
        assert "Page not found" not in body
        assert "You have requested page" not in body
        # the alias hands over to the default page at / and keeps the query
        assert page.url == f"{url}/?tab=x"
        # the menu lists each page once (the alias is hidden)
        nav = page.locator('[data-testid="stSidebarNav"] a')
        assert nav.count() == len(ds.page_entries())
        assert nav.first.inner_text().strip().endswith("Overview")
        # an unknown path still says so
        page.goto(f"{url}/no_such_page", wait_until="domcontentloaded")
        ds.wait_for_streamlit(page)
        assert "Page not found" in page.locator("body").inner_text()
        assert not errors, errors
