"""Nothing from the data is ever Markdown (issue 27 #1): the one escaping rule
(``prefixscope.core.formatting.md_text``) and every page over a store whose text fields hold
Markdown, HTML, LaTeX, Streamlit directives and control characters
(:func:`tests.dashboard_support.build_hostile_db`), and the Alerts page's ``?tz=``/``?day=``.

The oracle reads every Markdown body a run draws (markdown, captions, alerts, headings, metric
labels and help, expander, tab and widget labels and help) the way Streamlit 1.67 would:
CommonMark (markdown-it) for links, images and HTML, plus the rules Streamlit applies to the
parsed text (bare links and e-mail addresses of GFM, ``:material/...:`` icons, emoji,
``:colour[...]`` directives) and to the source (``$`` is LaTeX).
"""

from __future__ import annotations

import re

import pytest

from tests import dashboard_support as ds
from tests.test_savings_user_data import DAY0, _records

ALL_PAGES = [p[0] for p in ds.page_entries()]

# --- the rule ------------------------------------------------------------------------------

#: GFM's bare links and e-mail addresses, as Streamlit's bundle matches them in parsed text
#: (mdast-util-gfm-autolink-literal), and Streamlit's own text rules (icons, emoji, logo).
_TEXT_RULES = [
    re.compile(r"(https?://|www(?=\.))([-.\w]+)", re.I),
    re.compile(r"(?<![\w])([-.\w+]+)@([-\w]+(?:\.[-\w]+)+)"),
    re.compile(r":material[/_]\w+:"),
    re.compile(r":streamlit:"),
    re.compile(r":(smile|red)[:\[]"),
]


_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def _unescaped(body: str) -> str:
    """``body`` without its backslash escapes and code spans (what CommonMark still reads
    as Markdown)."""
    return _CODE_SPAN.sub("", re.sub(r"\\.", "", body, flags=re.S))


def markup_of(body: str) -> list[str]:
    """The Markdown constructs Streamlit would render from ``body`` that a plain text must not
    make: links, images, raw HTML, LaTeX, bare links, icons, emoji, hostile directives."""
    from markdown_it import MarkdownIt

    found = []
    if "](" in _unescaped(body):
        found.append("`](` outside an escape")
    if "$" in _unescaped(body):
        found.append("`$` outside an escape (LaTeX)")
    md = MarkdownIt("commonmark").enable(["strikethrough", "table"])

    def walk(tokens):
        for t in tokens:
            if t.type in ("link_open", "image", "html_inline", "html_block"):
                found.append(f"{t.type}: {t.content or t.attrs}")
            if t.type == "text" or t.type == "code_inline":
                text = t.content.replace("\u2060", "\x00") if t.type == "text" else ""
                found.extend(f"text rule {r.pattern}: {text!r}" for r in _TEXT_RULES
                             if r.search(text))
            if t.children:
                walk(t.children)

    walk(md.parse(body.replace(":material/", ":material_")))
    return found


CASES = [
    "evil **bold** [Re-login](https://evil.example/login) ![p](http://127.0.0.1:9/p.png)",
    "<img src=x onerror=alert(1)> <script>x</script> &amp; &lt;",
    "$x^2$ and $$y$$", ":red[red] :red-badge[ALERT] :material/home: :smile: :streamlit:",
    "https://evil.example/bare www.evil.example a@evil.example <https://evil.example>",
    "- item", "+ item", "12. item", "3) item", "# head", "> quote", "    code", "|a|b|",
    "a\nb\r\nc\x00d\x1b[31m\u202eevil\u2028e", "`code` ``x``", "a\\*b\\", "~~s~~ __u__ _i_",
    "[x]: https://evil.example/ref", "[x][y] ![z][y]",
]


@pytest.mark.parametrize("text", CASES)
def test_md_text_leaves_no_markup(text):
    from prefixscope.core.formatting import md_text

    for code in (False, True):
        out = md_text(text, code=code)
        assert markup_of(out) == [], (text, code, out)
        assert markup_of(f"Model {out}: **status**") == []
        assert "\n" not in out and "\r" not in out and "\x00" not in out and "\u202e" not in out


def test_md_text_shows_the_text_as_written():
    """Escapes are removed by the Markdown parser: the reader sees the original text (control
    characters aside, and an invisible word joiner after ``:`` and ``@``)."""
    from markdown_it import MarkdownIt

    from prefixscope.core.formatting import MD_BREAK, md_text

    md = MarkdownIt("commonmark")
    for text in ["evil **bold** [L](https://e.x/l) ![p](http://h/p.png)", "a_b*c`d`$e$ #f |g|",
                 "<b>x</b> &amp;", "- item", "12. item", "llama3:8b", "meta-llama/Llama-3.1-8B"]:
        html = md.render(md_text(text))
        shown = re.sub(r"<[^>]+>", "", html).strip()
        import html as html_mod

        assert html_mod.unescape(shown).replace(MD_BREAK, "") == text, (text, html)
        assert md.render(md_text(text, code=True)).count("<code>") == 1
    assert md_text("tiny-llama-random") == "tiny-llama-random"  # the common case unchanged
    assert md_text("vllm-b:8000 after 09:30") == "vllm-b:8000 after 09:30"
    assert md_text("tiny-llama-random", code=True) == "`tiny-llama-random`"


# --- every page over a hostile store -------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory) -> str:
    work = tmp_path_factory.mktemp("hostile_md")
    # m-alert's ALERT days on 2026-11-28/29, the days of the real captures: the latest days
    shift = 1795910400.0 - 4 * 86400 - DAY0
    records = [dict(r, ts_unix_s=r["ts_unix_s"] + shift) for r in _records()]
    return ds.build_hostile_db(work / "hostile.duckdb", usage_records=records, workdir=work)


def markdown_bodies(at) -> list[tuple[str, str]]:
    """``(element kind, Markdown text)`` of every element of the run whose text Streamlit
    renders as Markdown: bodies of markdown/caption/alerts/headings, labels and help of
    metrics, expanders, tabs and widgets (a metric's value is plain text: left out). Bodies
    drawn as HTML (``st.html``, ``unsafe_allow_html``) come as kind ``...html``."""
    out: list[tuple[str, str]] = []

    def walk(node):
        proto = getattr(node, "proto", None)
        if proto is not None and hasattr(proto, "ListFields"):
            kind = type(node).__name__
            fields = dict((f.name, v) for f, v in proto.ListFields())
            html = kind == "Html" or bool(fields.get("allow_html"))
            for name, value in fields.items():
                if name in ("label", "help") or (name == "body" and kind != "Metric"):
                    if isinstance(value, str) and value:
                        out.append((f"{kind}.{name}" + (".html" if html and name == "body"
                                                       else ""), value))
        children = getattr(node, "children", None)
        if isinstance(children, dict):
            for child in children.values():
                walk(child)

    walk(at._tree)
    return out


#: HOSTILE's HTML: a body drawn as HTML holds it only escaped.
_RAW_HTML = ("<img src=https://evil", "<b>html</b>")


def assert_no_markup(at, where: str) -> None:
    """No exception, no Markdown construct from the data in any Markdown body of the run, and
    none of the data's HTML in a body drawn as HTML."""
    assert not at.exception, (where, [e.value for e in at.exception])
    bodies = markdown_bodies(at)
    assert bodies, where
    bad = [(kind, body[:300], markup_of(body)) for kind, body in bodies
           if not kind.endswith(".html") and markup_of(body)]
    bad += [(kind, body[:300], "raw HTML") for kind, body in bodies
            if kind.endswith(".html") and any(h in body for h in _RAW_HTML)]
    assert not bad, (where, bad)


@pytest.mark.parametrize("page", ALL_PAGES)
def test_every_page_over_hostile_text(hostile_db, use_db, page):
    at = ds.run_app(use_db(hostile_db), page, timeout_s=180,
                    setup=lambda a: a.radio(key="filter_range").set_value("all"))
    assert_no_markup(at, page)


def test_the_hostile_text_reaches_the_pages(hostile_db, use_db):
    """The store's text is on the pages (as text), so the test above covers it: Overview's
    ALERT banner and card, Savings' regression cost and price sources, Requests' coverage."""
    reached = {}
    for page in ("views/overview.py", "views/savings.py", "views/requests.py"):
        at = ds.run_app(use_db(hostile_db), page, timeout_s=180,
                        setup=lambda a: a.radio(key="filter_range").set_value("all"))
        reached[page] = [k for k, body in markdown_bodies(at) if "evil" in body]
    assert all(reached.values()), reached
    assert any(k.startswith("Warning") for k in reached["views/overview.py"]), reached
    assert any(k.startswith("Metric.label") for k in reached["views/savings.py"]), reached
    assert any(k.startswith("Warning") for k in reached["views/requests.py"]), reached


@pytest.mark.parametrize("params", [
    {"tz": "![p](http://127.0.0.1:9/p.png)"},
    {"tz": "[Session expired: log in](https://evil.example/login)"},
    {"tz": "$x$ :red[x] <img src=https://evil.example/p.png>\n- x"},
    {"day": "[Session expired: log in](https://evil.example/login)"},
    {"day": "![p](https://evil.example/p.png)", "tz": "UTC"},
])
def test_alerts_url_parameters_are_text(hostile_db, use_db, params):
    from streamlit.testing.v1 import AppTest

    use_db(hostile_db)
    at = AppTest.from_file(str(ds.APP), default_timeout=180)
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    ds.switch(at, "views/alerts.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    warnings = [w.value for w in at.warning]
    assert any("The link's" in w for w in warnings), warnings
    assert_no_markup(at, str(params))
