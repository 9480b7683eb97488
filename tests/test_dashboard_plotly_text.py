"""Nothing from the data is ever Plotly markup (issue 27 #1): the one escaping rule for Plotly
text fields (``prefixscope.core.formatting.plotly_text``), every public figure function of
``dashboard/figures.py`` over hostile names, and every page's figures over the hostile store
(:func:`tests.dashboard_support.build_hostile_db`), read from the figures' JSON.

The oracle reads a text the way the plotly.js bundled with Streamlit 1.67 draws it
(``src/lib/svg_text_utils.js``: tags are ``<[^<>]*>``, the styled ones ``a b i em s u sup sub
span`` and ``br``; then ``&name;`` and ``&#N;`` references become characters; a text with a
``$...$`` pair is TeX; in a hover template ``%{...}`` is substituted first).
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from tests import dashboard_support as ds

# --- an oracle of plotly.js' pseudo-HTML ---------------------------------------------------

_TAG_SPLIT = re.compile(r"(<[^<>]*>)")
_TAG = re.compile(r"<(/?)([^ >]*)(\s+(.*))?>", re.I)
_STYLED = {"sup", "sub", "s", "u", "b", "i", "a", "span", "em"}
_ENTITIES = {"mu": "μ", "amp": "&", "lt": "<", "gt": ">", "nbsp": "\xa0", "times": "×",
             "plusmn": "±", "deg": "°"}
_ENTITY = re.compile(r"&(#\d+|#x[\da-fA-F]+|[a-z]+);")
_TEX = re.compile(r"([^$]*)([$]+[^$]*[$]+)([^$]*)")
_TEMPLATE = re.compile(r"%{([^\s%{}:]*)([:|\|][^}]*)?}")


def _entities(text: str) -> str:
    def one(m):
        t = m.group(1)
        if t.startswith("#"):
            return chr(int(t[2:], 16) if t[1] == "x" else int(t[1:]))
        return _ENTITIES.get(t, m.group(0))

    return _ENTITY.sub(one, text)


def plotly_render(text: str) -> tuple[str, list[str]]:
    """``(shown text, tags)`` of ``text`` drawn by plotly.js: the tags it acts on (styled tags
    and ``br``, lower case) and the text between them with references converted."""
    shown, tags = [], []
    for part in _TAG_SPLIT.split(text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")):
        m = _TAG.fullmatch(part) if part.startswith("<") else None
        name = m.group(2).lower() if m else None
        if name == "br" or name in _STYLED:
            tags.append(name)
        else:
            shown.append(_entities(part))
    return "".join(shown), tags


def plotly_markup(text: str) -> list[str]:
    """What plotly.js would make of ``text`` that a plain text must not: styled tags, TeX, a
    template substitution."""
    found = [f"<{t}>" for t in plotly_render(text)[1] if t != "br"]
    if _TEX.search(text) and text.count("$") >= 2:
        found.append("TeX")
    if _TEMPLATE.search(text):
        found.append("%{...}")
    return found


CASES = [
    '<a href="https://evil.example/x">link</a>', "<b>bold</b> <i>i</i> <em>e</em>",
    '<span style="font-size:60px;color:red">big</span>', "a<br>b <br/> c", "<sup>1</sup>",
    "&amp; &lt;b&gt; &#60;a&#62; &#x3c;", "$x^2$ and $$y$$", "%{y} %{customdata[0]:.1%} 50%",
    "a\nb\r\nc\x00d\x1b[31m\u202eevil\u2028e", "<img src=x onerror=alert(1)>", "< > & $ %",
]


@pytest.mark.parametrize("text", CASES)
def test_plotly_text_is_drawn_as_written(text):
    from prefixscope.core.formatting import plotly_text

    out = plotly_text(text)
    shown, tags = plotly_render(out)
    assert tags == [], (text, out)
    assert plotly_markup(out) == [] and plotly_markup(f"{out}<br>%{{y:.1%}}") == ["%{...}"]
    # the reader sees the text itself, line breaks as spaces and controls as U+FFFD
    expected = re.sub(r"[\n\r\u2028]+", " ", text)
    expected = re.sub(r"[\x00\x1b\u202e]", "\ufffd", expected)
    assert shown == expected, (text, out, shown)


def test_plotly_text_leaves_plain_names_alone():
    from prefixscope.core.formatting import plotly_text

    for name in ("tiny-llama-random", "meta-llama/Llama-3.1-8B", "vllm-b:8000", "gw-1"):
        assert plotly_text(name) == name
    assert plotly_text("a<b") == "a&lt;b" and plotly_text("50%") == "50&#37;"


def test_the_oracle_sees_raw_markup():
    assert plotly_markup('<a href="https://e.x">l</a>') == ["<a>", "<a>"]
    assert plotly_markup("$x$") == ["TeX"] and plotly_markup("x %{y}") == ["%{...}"]
    assert plotly_render("a<br>b")[1] == ["br"]


# --- every figure function over hostile names ----------------------------------------------

#: Raw fragments of :data:`tests.dashboard_support.HOSTILE` that must never be in a figure's
#: JSON (escaped, each reads differently).
RAW = ("<a ", "<span", "<b>", "<img", "<br>brk", "%{y}pct", "$x^2$", "\u202e", "\x00")


def figure_strings(spec: dict) -> list[tuple[str, str]]:
    """``(path, string)`` of every string of a figure's JSON (data and layout)."""
    out: list[tuple[str, str]] = []

    def walk(node, path):
        if isinstance(node, str):
            out.append((path, node))
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(spec, "")
    return out


def assert_plain_figure(spec: dict, where: str) -> None:
    """No raw fragment of the hostile text and no markup plotly.js would draw from it in any
    title, name, tick, text, hover template or ``customdata`` of the figure."""
    bad = [(p, s[:200], [r for r in RAW if r in s] + plotly_markup(s))
           for p, s in figure_strings(spec)
           if any(r in s for r in RAW) or plotly_markup(s) and not p.endswith("hovertemplate")]
    # a hover template holds the figure's own %{...}: only the styled tags count there
    bad += [(p, s[:200], [f"<{t}>" for t in plotly_render(s)[1] if t != "br"])
            for p, s in figure_strings(spec) if p.endswith("hovertemplate")
            and any(t != "br" for t in plotly_render(s)[1])]
    assert not bad, (where, bad)


H = ds.HOSTILE
M1, M2 = f"m-a{H}", f"m-b{H}"
T0 = 1795910400.0


def _windows(n: int = 3, step: float = 3600.0) -> list[float]:
    return [T0 + k * step for k in range(n)]


def _rate_rows(**text) -> pd.DataFrame:
    rows = []
    for name in (M1, M2):
        for t in _windows():
            rows.append({"window_start_s": t, "window_end_s": t + 3600, "model": name,
                         "instance": f"i{H}", "hit_tokens": 50.0, "query_tokens": 100.0,
                         "hit_rate": 0.5, "restarts": 1, **text})
    return pd.DataFrame(rows)


def _figures() -> dict:
    """name -> (figure, whether data text reaches it) for every public figure function."""
    from prefixscope.dashboard import figures as f

    rates = _rate_rows()
    bands = pd.DataFrame([{"window_start_s": t, "model": m, "requests": 3, "p10": 0.1,
                           "p25": 0.2, "p50": 0.5, "p75": 0.7, "p90": 0.9, "hit_rate": 0.5}
                          for m in (M1, M2) for t in _windows()])
    ttft = pd.DataFrame([{"window_start_s": t, "model": m, "band": b, "requests": 3,
                          "p50_ms": 10.0, "p90_ms": 20.0}
                         for m in (M1, M2) for t in _windows() for b in ("cold", "warm")])
    quant = pd.DataFrame([{"band": b, "requests": 3, "p05_ms": 1.0, "p25_ms": 2.0,
                           "p50_ms": 3.0, "p75_ms": 4.0, "p95_ms": 5.0, "mean_ms": 3.0}
                          for b in ("cold", "partial", "warm")])
    priced = pd.DataFrame([{"model": m, "currency": f"USD{H}", "shadow": s,
                            "cost_without_cache": 2.0, "cost_with_cache": 1.0, "saved": 1.0,
                            "saved_fraction": 0.5} for m, s in ((M1, True), (M2, False))])
    saved = pd.DataFrame([{"window_start_s": t, "model": m, "currency": c, "saved": 1.0}
                          for m in (M1, M2) for t in _windows() for c in ("USD", f"X{H}")])
    scopes = pd.DataFrame([{"window_start_s": t, "scope": s, "namespace": f"ns{H}",
                            "series": f"s{H}", "hit_rate": 0.5, "cached_tokens": 5,
                            "reported_prompt_tokens": 10, "saved_prefill_tokens": 5}
                           for t in _windows() for s in ("PUBLIC", "TENANT")])
    rejects = pd.DataFrame([{"window_start_s": t, "reason": r, "rejects": 2,
                             "lost_candidate_tokens": 10}
                            for t in _windows() for r in (f"tools{H}", f"model{H}")])
    many = pd.DataFrame([{"window_start_s": t, "reason": f"tools{H}", "rejects": 1,
                          "lost_candidate_tokens": 1} for t in _windows(f.MAX_BARS + 5, 60.0)])
    misses = pd.DataFrame([{"window_start_s": t, "ordinary_miss_requests": 1,
                            "version_mismatch_requests": 1, "other_reject_requests": 1}
                           for t in _windows()])
    runs = pd.DataFrame([{"run_id": r, "label": f"run {r}{H}", "hit_rate": 0.5,
                          "cost_without_cache": 2.0, "cost_with_cache": 1.0}
                         for r in ("r1", f"r2{H}")])
    run_windows = pd.DataFrame([{"run_id": r, "window_start_s": w, "hit_rate": 0.5}
                                for r in ("r1", f"r2{H}") for w in (0.0, 60.0, 180.0)])
    breakers = pd.DataFrame([
        {"rank": 1, "kind": f"timestamp{H}", "lost_tokens": 100, "lost_tokens_measured": True,
         "segment": "message", "message_index": 0, "role": f"system{H}", "line": 3},
        {"rank": 2, "kind": f"tools{H}", "lost_tokens": 50, "lost_tokens_measured": False,
         "segment": f"seg{H}", "message_index": None, "role": None, "line": None}])
    cov = pd.DataFrame([{"model": m, "instance": f"i{H}", "requests": 4,
                         "reported_requests": 3, "coverage": 0.75} for m in (M1, M2)])
    hist = pd.DataFrame([{"bin_start": 0.0, "bin_end": 0.5, "requests": 2},
                         {"bin_start": 0.5, "bin_end": 1.0, "requests": 3}])
    ledger = pd.DataFrame([{"router": r, "prompt_tokens": 100, "hit_tokens": 40,
                            "granularity_tokens": 5, "routing_tokens": 30, "capacity_tokens": 5,
                            "isolation_tokens": 0, "prompt_change_tokens": 10,
                            "cold_tokens": 10} for r in ("round-robin", f"policy{H}")])
    return {
        "ledger_waterfall_figure": (f.ledger_waterfall_figure(ledger), True),
        "hit_rate_over_time": (f.hit_rate_over_time(rates, window_s=3600.0,
                                                    min_query_tokens=200), True),
        "tokens_over_time": (f.tokens_over_time(rates, window_s=3600.0), True),
        "request_hit_rate_histogram": (f.request_hit_rate_histogram(hist), False),
        "request_hit_rate_over_time": (f.request_hit_rate_over_time(bands, bands,
                                                                    window_s=3600.0), True),
        "coverage_bars": (f.coverage_bars(cov), True),
        "latency_by_band": (f.latency_by_band(quant), False),
        "ttft_by_band": (f.ttft_by_band(ttft, window_s=3600.0), True),
        "savings_by_model_bars": (f.savings_by_model_bars(priced), True),
        "savings_over_time": (f.savings_over_time(saved, window_s=3600.0), True),
        "scope_rate_figure": (f.scope_rate_figure(scopes, series="namespace", title="t",
                                                  window_s=3600.0), True),
        "scope_saved_figure": (f.scope_saved_figure(scopes, window_s=3600.0), False),
        "rejection_reasons_figure": (f.rejection_reasons_figure(rejects, window_s=3600.0), True),
        "rejection_reasons_figure stepped": (f.rejection_reasons_figure(many, window_s=60.0),
                                             True),
        "miss_breakdown_figure": (f.miss_breakdown_figure(misses, window_s=3600.0), False),
        "run_hit_rate_bars": (f.run_hit_rate_bars(runs), True),
        "run_cost_bars": (f.run_cost_bars(runs, f"USD{H}"), True),
        "run_windows_figure": (f.run_windows_figure(run_windows, {"r1": f"one{H}"}, 60.0),
                               True),
        "breakers_lost_figure": (f.breakers_lost_figure(breakers), True),
        "window_lines": (f.window_lines(rates, series={"hit_tokens": "hits"}, window_s=3600.0,
                                        by=("model", "instance"), title="t", y_title="y"),
                         True),
    }


def test_every_figure_function_is_covered():
    from prefixscope.dashboard import figures

    assert {n.split()[0] for n in _figures()} == set(figures.FRAMED)


@pytest.mark.parametrize("name", sorted(_figures()))
def test_figure_shows_hostile_names_as_text(name):
    fig, has_text = _figures()[name]
    spec = json.loads(fig.to_json())
    assert_plain_figure(spec, name)
    if has_text:  # the hostile names reached the figure, escaped
        shown = [s for _p, s in figure_strings(spec) if "&lt;b&gt;html&lt;/b&gt;" in s]
        assert shown, name


# --- every page's figures over the hostile store -------------------------------------------


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory) -> str:
    from tests.test_savings_user_data import DAY0, _records

    work = tmp_path_factory.mktemp("hostile_plotly")
    shift = 1795910400.0 - 4 * 86400 - DAY0  # m-alert's ALERT days: the real captures' days
    records = [dict(r, ts_unix_s=r["ts_unix_s"] + shift) for r in _records()]
    return ds.build_hostile_db(work / "hostile.duckdb", usage_records=records, workdir=work)


def page_figures(at) -> list[dict]:
    """The JSON spec of every Plotly chart of an AppTest run."""
    return [json.loads(e.proto.spec) for e in at.get("plotly_chart")]


def test_every_page_draws_hostile_names_as_text(hostile_store, use_db):
    reached = {}
    for page, _title, _icon in ds.page_entries():
        at = ds.run_app(use_db(hostile_store), page, timeout_s=180,
                        setup=lambda a: a.radio(key="filter_range").set_value("all"))
        assert not at.exception, (page, [e.value for e in at.exception])
        specs = page_figures(at)
        for k, spec in enumerate(specs):
            assert_plain_figure(spec, f"{page} chart {k}")
        reached[page] = sum(1 for spec in specs for _p, s in figure_strings(spec)
                            if "evil" in s)
    # the store's names reach the charts of these pages (escaped), so the test above covers them
    for page in ("views/overview.py", "views/requests.py", "views/savings.py",
                 "views/replay.py"):
        assert reached.get(page), (page, reached)
