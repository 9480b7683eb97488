"""prefixscope dashboard: the router (page config, shared sidebar filters, navigation).

Run with ``prefixscope dashboard [--db PATH]``, or
``streamlit run dashboard/app.py -- --db PATH`` (or ``PREFIXSCOPE_DB=PATH``).

Each page is one file in ``dashboard/views/``. It reads the sidebar selection with
``prefixscope.dashboard.filters.current()`` and the database path with ``prefixscope.dashboard.data.db_path()``, calls
the cached wrappers of ``prefixscope.dashboard.data`` inside ``with dashboard.data.guard(db):``, and draws
figures from ``prefixscope.dashboard.figures``. Pages never open the database or write SQL.
"""

from __future__ import annotations

import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent

# Pages, in menu order: (file relative to this folder, title, Material icon). The order is the
# README's "What the demo shows: look at these, in this order" (tests/test_dashboard_pages.py
# checks they agree), then the pages the README does not walk through.
# To add a page: create dashboard/views/<name>.py and add ONE line below.
PAGES: list[tuple[str, str, str]] = [
    ("views/overview.py", "Overview", ":material/monitoring:"),
    ("views/alerts.py", "Alerts", ":material/notifications:"),
    ("views/savings.py", "Savings", ":material/savings:"),
    ("views/breakers.py", "Breakers", ":material/troubleshoot:"),
    ("views/miss_ledger.py", "Miss ledger", ":material/waterfall_chart:"),
    ("views/replay.py", "Replay", ":material/replay:"),
    ("views/requests.py", "Requests", ":material/receipt_long:"),
    ("views/scopes.py", "Scopes", ":material/shield_person:"),
    ("views/rejections.py", "Rejections", ":material/block:"),
    ("views/invariants.py", "Invariants", ":material/verified_user:"),
    ("views/residency.py", "Residency", ":material/hourglass_top:"),
    ("views/data_sources.py", "Data sources", ":material/database:"),
    # append one line per page here: ("views/<file>.py", "<Title>", ":material/<icon>:"),
]


def page_files() -> list[Path]:
    """Absolute paths of the PAGES files that exist, in menu order (used by the tests)."""
    return [(_HERE / f) for f, _, _ in PAGES if (_HERE / f).is_file()]


def url_path(rel: str) -> str:
    """The URL path of a page: its file name without ``.py`` (``/data_sources``). The first page
    is the default page, served at ``/``; its own path (``/overview``) opens it too
    (:func:`default_page_alias`)."""
    return Path(rel).stem


def default_page_alias(default_page, entry: tuple[str, str, str]):
    """A hidden page at the default page's own URL path (``/overview``) that switches to the
    default page (served at ``/``), keeping the query parameters: every page opens by its file
    name, the first one too. Streamlit serves a ``default=True`` page only at ``/``."""
    import streamlit as st

    rel, title, icon = entry

    def _open_default() -> None:
        st.switch_page(default_page, query_params=st.query_params.to_dict())

    return st.Page(_open_default, title=title, icon=icon, url_path=url_path(rel),
                   visibility="hidden")


_FULL_RUN_KEY = "prefixscope.full_run_monotonic_s"
_VERSION_KEY = "prefixscope.full_run_store_version"
_TICKS: dict[tuple[float, str], object] = {}

#: With Live on and nothing committed to the store, the page still re-runs this often (seconds):
#: quick-pick ranges slide and "N min ago" ages move.
LIVE_IDLE_RERUN_S = 60.0


def live_rerun_due(*, since_full_run_s: float, every_s: float, version, last_version) -> bool:
    """Whether a Live tick re-runs the whole app: the app ran at least ``0.9 x every_s`` seconds
    ago and either the store changed since (``version`` != ``last_version``, from
    ``prefixscope.dashboard.data.store_version``) or :data:`LIVE_IDLE_RERUN_S` passed. A tick
    on an unchanged store redraws nothing (no greyed page)."""
    if since_full_run_s < 0.9 * every_s:
        return False
    return version != last_version or since_full_run_s >= 0.9 * max(LIVE_IDLE_RERUN_S, every_s)


def live_ticker(every_s: float, db: str):
    """A fragment that re-runs the whole app every ``every_s`` seconds (the cache TTL) when
    :func:`live_rerun_due` says so, so a page left open shows new data: ``st.rerun(scope="app")``
    keeps every widget's value (selections, time range, window), unlike a browser reload. The
    full run also runs the fragment (and then it does nothing)."""
    import streamlit as st

    from prefixscope.dashboard import data

    if (every_s, db) not in _TICKS:
        @st.fragment(run_every=every_s)
        def _tick() -> None:
            last = st.session_state.get(_FULL_RUN_KEY, 0.0)
            if live_rerun_due(since_full_run_s=time.monotonic() - last, every_s=every_s,
                              version=data.store_version(db),
                              last_version=st.session_state.get(_VERSION_KEY)):
                st.rerun(scope="app")

        _TICKS[(every_s, db)] = _tick
    return _TICKS[(every_s, db)]


def favicon():
    """The browser tab's icon: a small image the dashboard serves itself (a teal disc, 32 x 32
    px, a PIL image). A ``:material/...:`` or emoji ``page_icon`` makes Streamlit 1.67's page
    fetch it from fonts.gstatic.com or a CDN: a request to a host the page does not name
    (issue 27 #1, tests/test_dashboard_markdown_browser.py)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGBA", (32, 32), (0, 0, 0, 0))
    ImageDraw.Draw(img).ellipse((2, 2, 29, 29), fill=(0, 128, 128, 255))
    return img


def main() -> None:
    """Draw the shared chrome and run the selected page."""
    import streamlit as st

    from prefixscope.dashboard import data, filters
    from prefixscope.core.errors import PrefixscopeError
    from prefixscope.core.formatting import fmt_age, fmt_time, md_text

    st.set_page_config(page_title="prefixscope", page_icon=favicon(), layout="wide")
    db = data.db_path()

    pages = []
    missing = []
    for i, (rel, title, icon) in enumerate(PAGES):
        path = _HERE / rel
        if not path.is_file():
            missing.append(rel)
            continue
        pages.append(st.Page(str(path), title=title, icon=icon, default=(i == 0),
                             url_path="" if i == 0 else url_path(rel)))
    if pages and (_HERE / PAGES[0][0]).is_file():
        pages.append(default_page_alias(pages[0], PAGES[0]))
    nav = st.navigation(pages)

    st.sidebar.markdown("### prefixscope")
    st.sidebar.caption(f"Database: {md_text(db, code=True)}")
    now_s = data.clock()  # the clock of the cache periods (time.time; tests move it)
    values = {"models": [], "instances": [], "run_ids": [], "min_ts_unix_s": None,
              "max_ts_unix_s": None}
    try:
        values = data.filter_values(db)
    except PrefixscopeError:
        pass  # the page runs the same reads inside data.guard, which explains the problem
    filters.sidebar(values, now_s=now_s)
    newest = values.get("max_ts_unix_s")
    newest_prod = values.get("production_max_ts_unix_s")
    if newest is not None and newest_prod is not None and newest_prod < newest:
        # replay runs are newer than production: say both (production is what pages show first)
        st.sidebar.caption(f"Newest production data: {fmt_time(newest_prod)} "
                           f"({fmt_age(now_s - newest_prod)} ago); newest run: "
                           f"{fmt_time(newest)} ({fmt_age(now_s - newest)} ago)")
    elif newest is not None:
        st.sidebar.caption(f"Newest data: {fmt_time(newest)} ({fmt_age(now_s - newest)} ago)")
    else:
        st.sidebar.caption("No data stored yet.")
    if st.sidebar.button("Refresh now", icon=":material/refresh:",
                         help=f"Results are cached for {data.CACHE_TTL_S:g} s."):
        data.clear_cache()
    live = st.sidebar.toggle("Live", value=data.LIVE_DEFAULT, key="live_refresh",
                             help=f"Re-run the page every {data.CACHE_TTL_S:g} s (the cache "
                                  "TTL) to show new data; your selections stay.")
    st.sidebar.caption(f"Results refresh every {data.CACHE_TTL_S:g} s"
                       + (" and the page follows on its own." if live else "; live is off."))
    st.session_state[_FULL_RUN_KEY] = time.monotonic()
    st.session_state[_VERSION_KEY] = data.store_version(db)
    if live:
        with st.sidebar:
            live_ticker(float(data.CACHE_TTL_S), db)()
    for rel in missing:
        st.sidebar.caption(f"(page {md_text(rel)} listed but not found)")
    nav.run()


if __name__ == "__main__":  # streamlit run and AppTest execute this file as __main__
    main()
