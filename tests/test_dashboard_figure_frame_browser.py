"""The frame rule of every dashboard figure (``figures.frame``), drawn by Plotly.js in a real
headless Chromium: the modebar never covers a title and a legend never lands on the x-axis
title, at half and full page width, for the charts a new user found colliding (session 7:
Rejections' legend on "time (UTC)", the modebar over the Overview titles)."""

from __future__ import annotations

import pandas as pd
import pytest

from prefixscope.dashboard import figures
from tests import dashboard_support as ds

pytestmark = pytest.mark.browser

T0 = 1_796_172_000.0
REASONS = ("adapter_digest", "authorization_epoch", "cache_epoch", "model_digest",
           "policy_revision", "tokenizer_digest", "toolset_digest")


def _figures() -> dict[str, object]:
    reasons = pd.DataFrame({"window_start_s": [T0 + 900 * (i % 4) for i in range(len(REASONS))],
                            "reason": list(REASONS), "rejects": 1,
                            "lost_candidate_tokens": 100})
    ns = pd.DataFrame({"window_start_s": [T0 + 900 * k for k in range(3) for _ in range(10)],
                       "namespace": [f"TENANT {i:016x}" for _ in range(3) for i in range(10)],
                       "hit_rate": 0.5, "cached_tokens": 1, "reported_prompt_tokens": 2})
    windows = pd.DataFrame({"window_start_s": [T0 + 3600 * (k // 2) for k in range(48)],
                            "model": "tiny-llama-random",
                            "instance": [f"server-{'ab'[k % 2]}" for k in range(48)],
                            "window_end_s": [T0 + 3600 * (k // 2 + 1) for k in range(48)],
                            "hit_rate": 0.6, "hit_tokens": 60, "query_tokens": 100,
                            "restarts": 0})
    return {
        "reasons": figures.rejection_reasons_figure(reasons, window_s=900),
        "one_reason": figures.rejection_reasons_figure(reasons.head(1), window_s=900),
        "namespaces": figures.scope_rate_figure(ns, series="namespace", window_s=900,
                                                title="Hit rate by namespace digest (top 10)"),
        "overview": figures.hit_rate_over_time(windows, window_s=3600,
                                               title="Prefix-cache hit rate"),
    }


def _overlap(a: dict, b: dict) -> bool:
    return not (a["right"] <= b["left"] or b["right"] <= a["left"]
                or a["bottom"] <= b["top"] or b["bottom"] <= a["top"])


BOXES = """() => {
  const box = (sel) => { const e = document.querySelector(sel); if (!e) return null;
    const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top,
                                                 bottom: r.bottom}; };
  return {title: box('.gtitle'), modebar: box('.modebar'), legend: box('.legend'),
          xtitle: box('.xtitle'), entries: document.querySelectorAll('.legend .traces').length};
}"""


def test_titles_clear_the_modebar_and_legends_clear_the_axis_title(tmp_path):
    figs = _figures()
    assert figures.FRAMED and all(getattr(getattr(figures, n), "framed", False)
                                  for n in figures.FRAMED)
    with ds.chromium(tmp_path / "profile", width=1300, height=900) as ctx:
        page = ctx.new_page()
        for name, fig in figs.items():
            for width in (560, 1200):
                fig.update_layout(width=width, height=450)
                html = fig.to_html(include_plotlyjs=True, full_html=True,
                                   config={"displayModeBar": True})
                path = tmp_path / f"{name}-{width}.html"
                path.write_text(html)
                page.goto(path.as_uri())
                page.wait_for_selector(".xtitle", timeout=30_000)
                b = page.evaluate(BOXES)
                where = f"{name} at {width} px"
                assert b["title"] and b["modebar"] and b["xtitle"], where
                assert b["title"]["top"] >= b["modebar"]["bottom"], where
                assert b["legend"] is not None and b["entries"] >= 1, where
                assert not _overlap(b["legend"], b["xtitle"]), where
                assert b["legend"]["top"] >= b["xtitle"]["bottom"], where
    assert len(figs["one_reason"].data) == 1 and figs["one_reason"].layout.showlegend is True
