"""Live (the sidebar toggle) in the real server and headless Chromium: a tick is a fragment run
(``st.fragment(run_every=cache_ttl_s)`` in ``dashboard/app.py``), not a rerun of the page. The
test reads Streamlit's own messages on the page's websocket (``ForwardMsg`` protobufs): on an
unchanged store each tick ends as a fragment run and redraws no element; after a commit the
next tick re-runs the page once, which then shows the new rows and keeps the user's selection.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from tests import dashboard_support as ds

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]


def _decoder(messages: list[tuple[str, object]]):
    """A websocket frame handler appending ``(message type, detail)`` per ForwardMsg: the
    status of a ``script_finished``, the fragment id of a ``delta`` ('' = the page's)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    def on_frame(payload) -> None:
        if isinstance(payload, str):
            return
        msg = ForwardMsg()
        msg.ParseFromString(bytes(payload))
        kind = msg.WhichOneof("type")
        detail = (msg.script_finished if kind == "script_finished" else
                  msg.delta.fragment_id if kind == "delta" else None)
        messages.append((kind, detail))

    return on_frame


def _wait_for(page, cond, what: str, timeout_s: float = 90.0) -> None:
    """Let Playwright deliver events (``wait_for_timeout``, not ``time.sleep``) until ``cond``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        page.wait_for_timeout(100)


def test_a_live_tick_is_a_fragment_run_and_new_data_reruns_the_page(tmp_path):
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    fragment_done = ForwardMsg.ScriptFinishedStatus.FINISHED_FRAGMENT_RUN_SUCCESSFULLY
    page_done = ForwardMsg.ScriptFinishedStatus.FINISHED_SUCCESSFULLY
    config = tmp_path / "prefixscope.toml"
    config.write_text("[dashboard]\ncache_ttl_s = 2\nlive = true\n", encoding="utf-8")
    db = ds.build_real_db(tmp_path / "live.duckdb")
    messages: list[tuple[str, object]] = []

    def finished(since: int, status: int) -> int:
        return sum(1 for k, s in messages[since:] if k == "script_finished" and s == status)

    def checked_range(page) -> str:
        return page.locator('[data-testid="stSidebar"] [role="radiogroup"] '
                            'input[type="radio"]:checked').first.evaluate(
            "e => e.closest('label').innerText.trim()")

    def rows_added(page) -> int:
        card = page.locator('[data-testid="stMetric"]', has_text="Rows added")
        return int(re.sub(r"\D", "", card.locator('[data-testid="stMetricValue"]').inner_text()))

    with ds.dashboard_server(db, env={"PREFIXSCOPE_CONFIG": str(config)},
                             log_path=tmp_path / "server.log") as url, \
            ds.chromium(tmp_path / "profile") as context:
        page = context.new_page()
        page.on("websocket", lambda ws: ws.on("framereceived", _decoder(messages)))
        page.goto(f"{url}/data_sources", wait_until="domcontentloaded")
        ds.wait_for_streamlit(page)
        assert page.get_by_role("switch", name="Live").is_checked()
        # a selection the refresh must keep: another time range than the default
        target = "7d" if checked_range(page) == "all" else "all"
        page.locator('[data-testid="stSidebar"] label').filter(
            has_text=re.compile(f"^{target}$")).click()
        ds.wait_for_streamlit(page)
        assert checked_range(page) == target
        before = rows_added(page)
        assert finished(0, page_done) >= 2  # the first run and the click's

        # an unchanged store: three ticks, each a fragment run that redraws only the (empty)
        # fragment, no element of the page
        mark = len(messages)
        _wait_for(page, lambda: finished(mark, fragment_done) >= 3, "three Live ticks")
        ticks = messages[mark:]
        assert finished(mark, page_done) == 0, ticks
        deltas = [d for k, d in ticks if k == "delta"]
        assert len(set(deltas)) == 1 and deltas[0] != "", ticks  # the tick fragment's own
        assert len(deltas) <= finished(mark, fragment_done) + 1, ticks
        assert not [k for k, _ in ticks if k == "ref_hash"], ticks

        # a commit: the next tick re-runs the page once, with the new rows, same selection
        copy = tmp_path / "more.requests.jsonl"  # the real capture under new request ids
        lines = ds.PROBE_REQUESTS.read_text(encoding="utf-8").splitlines()
        copy.write_text("".join(json.dumps({**json.loads(ln), "request_id": f"more-{i}"}) + "\n"
                                for i, ln in enumerate(lines)), encoding="utf-8")
        with store_db.writer(db) as con:
            added = ingest_usage_file(con, str(copy), instance="vllm-cpu-more")
        mark = len(messages)
        _wait_for(page, lambda: finished(mark, page_done) >= 1, "the page's rerun")
        assert len([d for k, d in messages[mark:] if k == "delta" and d == ""]) > 5, \
            "the rerun drew no page element"
        ds.wait_for_streamlit(page)
        assert added.rows_added == len(lines) and rows_added(page) == before + len(lines)
        assert checked_range(page) == target
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert ds.app_tracebacks(log) == [], [b[-600:] for b in ds.app_tracebacks(log)]
