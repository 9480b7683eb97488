"""Number and time formatting for people: ``94.4%``, ``608,000 tokens``, ``Rs 48.64``.

Values arrive in the store's units (fractions in [0, 1], token counts, currency amounts, Unix
seconds) and are formatted only here, at the edge, so that every page writes a number the same
way. Missing values (None or NaN: "not reported") format as an em dash, never as 0.
"""

from __future__ import annotations

import math
import re
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where it is used: the CLI's count_noun does not load it
    import pandas as pd

MISSING = "—"

# Currency codes shown with the symbol users read in the brief; anything else prints as given.
_CURRENCY_PREFIX = {"INR": "Rs", "RS": "Rs", "USD": "$", "EUR": "€", "GBP": "£"}


def _missing(value: object) -> bool:
    if value is None:
        return True
    pd = sys.modules.get("pandas")  # pd.NA / pd.NaT exist only once pandas is loaded
    if pd is not None and (value is pd.NA or value is pd.NaT):
        return True
    try:
        return bool(math.isnan(float(value)))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value).strip().lower() in ("", "none", "nan", "null")


def _number(value: object) -> float | None:
    """``value`` as a float, or None when it is not a number (shown as given)."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def fmt_pct(fraction: float | None, *, digits: int = 1) -> str:
    """A fraction in [0, 1] as a percent, THE percent format of every page and table: one
    decimal, rounded as Python's ``{:.1%}`` (the CLI's tables, the notes and Plotly's hovers
    round the same way): ``0.944 -> '94.4%'``, ``0 -> '0.0%'``; None/NaN -> ``'—'``."""
    if _missing(fraction):
        return MISSING
    x = _number(fraction)
    return str(fraction) if x is None else f"{x * 100:.{digits}f}%"


def fmt_share(part: float | None, whole: float | None, *, digits: int = 1) -> str:
    """``part`` of ``whole`` as a percent in :func:`fmt_pct`'s one format (one decimal,
    rounded): ``(6_432, 10_380) -> '62.0%'``, ``(1_093, 10_000) -> '10.9%'``; the report,
    alerts and email lines use it, so they read what the pages read. ``whole`` 0 or missing
    -> ``'—'``."""
    p, w = _number(part), _number(whole)
    if p is None or w is None or _missing(part) or _missing(whole) or w == 0:
        return MISSING
    return fmt_pct(p / w, digits=digits)


def fmt_share_vs(part: float | None, whole: float | None, threshold: float, *,
                 digits: int = 1) -> str:
    """:func:`fmt_share`, with as many more decimals as it takes (at most 4) for the text to
    read on the same side of ``threshold`` (a fraction) as the value: an ALERT at 49.96% of a
    50% threshold reads ``'49.96%'``, not ``'50.0%'``; a value exactly at the threshold reads
    it (``'50.0%'``, OK). Used by the OK/ALERT lines, so a status never contradicts its
    figure."""
    p, w = _number(part), _number(whole)
    if p is None or w is None or _missing(part) or _missing(whole) or w == 0:
        return MISSING
    return fmt_pct_vs(p / w, threshold, digits=digits)


def fmt_pct_vs(fraction: float | None, threshold: float | None, *, digits: int = 1) -> str:
    """:func:`fmt_pct` of a hit rate shown beside its OK/ALERT status: as many more decimals
    as it takes (at most 4) to read on the same side of ``threshold`` as the value
    (``(0.49996, 0.5) -> '49.996%'``); ``threshold`` None: :func:`fmt_pct`."""
    x = None if _missing(fraction) else _number(fraction)
    if x is None or threshold is None:
        return fmt_pct(fraction, digits=digits)
    for d in range(digits, digits + 4):
        shown = round(x * 100, d) / 100
        if (x < threshold) == (shown < threshold):
            return fmt_pct(x, digits=d)
    return fmt_pct(x, digits=digits + 4)


def fmt_share_band(low: float | None, high: float | None, unit: str) -> str:
    """A band of shares as text, whole percents: ``< 10% cached`` (no lower bound), ``10–80%
    cached``, ``≥ 80% cached`` (no upper bound); ``low`` inclusive, ``high`` exclusive
    (fractions), ``unit`` after the numbers. The rule text of the TTFT bands
    (``prefixscope.store.queries.serving.ttft_band``)."""
    if low is None and high is None:
        return f"any share {unit}"
    if low is None:
        return f"< {high:.0%} {unit}"
    if high is None:
        return f"≥ {low:.0%} {unit}"
    return f"{low:.0%}".removesuffix("%") + f"–{high:.0%} {unit}"


def fmt_pp(change: float | None, *, digits: int = 1) -> str:
    """A change of two fractions in percentage points, signed, one decimal as :func:`fmt_pct`:
    ``0.0123 -> '+1.2 pp'``, ``-0.05 -> '-5.0 pp'``, ``-0.0004 -> '0.0 pp'``; None/NaN ->
    ``'—'``."""
    if _missing(change):
        return MISSING
    x = _number(change)
    if x is None:
        return str(change)
    text = f"{x * 100:+.{digits}f}"
    if float(text) == 0:  # -0.0004 rounds to "-0.0": no sign on a change that reads as none
        text = text[1:]
    return f"{text} pp"


def fmt_int(value: float | None) -> str:
    """A count with thousands separators: ``608000 -> '608,000'``; None/NaN -> ``'—'``."""
    if _missing(value):
        return MISSING
    x = _number(value)
    return str(value) if x is None else f"{round(x):,}"


def fmt_tokens(value: float | None) -> str:
    """A token count: ``608000 -> '608,000 tokens'`` (``'1 token'``); None/NaN -> ``'—'``."""
    if _missing(value):
        return MISSING
    x = _number(value)
    if x is None:
        return f"{value} tokens"
    return count_noun(round(x), "token")


def count_noun(n: int, noun: str) -> str:
    """``1 line``, ``2 lines``, ``500,000 requests``: thousands separators, singular for 1
    (the noun takes a plain ``s`` in the plural)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def price_label(shadow: object, source: object) -> str:
    """How a price is described, naming its kind and source: ``'shadow price: <source>'`` or
    ``'list price: <source>'`` (a source that already starts with its kind is not repeated);
    the Savings page and ``ingest prices`` alike.

    ``shadow`` is a bool, or missing (None, NaN, ``pd.NA``: the store's ``shadow`` of a model
    without a price): missing with no source reads ``'no price'``, missing with a source
    ``'price: <source>'``. A missing ``source`` reads ``'source not given'``. Plain text: a
    page escapes it (:func:`md_text`) before it reaches Markdown.
    """
    src = "" if _missing(source) else str(source).strip()
    if _missing(shadow):
        return f"price: {src}" if src else "no price"
    kind = "shadow price" if bool(shadow) else "list price"
    if not src:
        return f"{kind}: source not given"
    if src.lower().startswith(kind):
        return src
    return f"{kind}: {src}"


#: Characters :func:`md_text` escapes with a backslash wherever they are: inline Markdown
#: (emphasis ``* _ ~``, code `````, links and images ``[ ] ( ) !``, headings ``#``, tables
#: ``|``, the escape itself), raw HTML and entities (``< > &``) and Streamlit's LaTeX (``$``).
MD_ESCAPED = frozenset("\\`*_[]()!#~|<>&$")
#: U+2060 WORD JOINER (invisible): put after a ``:`` (before a letter or ``/``), after an
#: ``@`` and inside ``www.`` of data,
#: it breaks the patterns Streamlit matches in the text AFTER the Markdown is parsed (so a
#: backslash cannot stop them): icons ``:material/x:``, ``:streamlit:``, emoji ``:smile:``,
#: colour directives ``:red[...]``, GFM's bare links ``https://...``, ``www.x`` and e-mail
#: addresses (Streamlit 1.67 ``StreamlitMarkdown``; mdast-util-gfm-autolink-literal).
MD_BREAK = "\u2060"
# Line breaks and other C0/C1 controls, and the bidirectional overrides that make text read
# other than it is stored (Trojan Source): none belongs in a label.
_MD_SPACES = re.compile(r"[\t\n\v\f\r\x1c-\x1f\x85\u2028\u2029]+")
_MD_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\u061c\u200e\u200f"
                          r"\u202a-\u202e\u2066-\u2069]")
# a ``:`` before a letter, ``/``, ``_``, ``+`` or ``-`` (an icon, emoji, directive or link can
# follow; a digit cannot start a directive or icon: ``host:8000`` and ``09:30`` stay as they
# are), an ``@`` before anything but a space (an e-mail address)
_MD_BREAK_AFTER = re.compile(r"(:)(?=[A-Za-z/_+-])|(@)(?=\S)")
_MD_WWW = re.compile(r"(www)(?=\.)", re.IGNORECASE)
# At the start of the text: a list item (``- x``, ``+ x``, ``1. x``, ``1) x``)
_MD_LEADING_LIST = re.compile(r"^(\s*)(?:([-+])|(\d+)([.)]))")


def md_text(value: object, *, code: bool = False) -> str:
    """``value`` as text that Streamlit shows exactly as written wherever it takes Markdown
    (``st.markdown``, captions, ``st.info``/``warning``/``error``/``success``, metric labels
    and help, headings, expander and tab labels, widget labels and help): THE rule for every
    string from data or from the URL (names, labels, sources, query parameters) that reaches
    a page. Nothing from the data is ever Markdown, HTML, LaTeX, a directive, an icon or a link.

    - Every character of :data:`MD_ESCAPED` gets a backslash; a leading list marker too
      (``-``, ``+``, ``1.``, ``1)``).
    - Line breaks, tabs and other whitespace controls become one space; other control
      characters and bidirectional overrides become U+FFFD.
    - :data:`MD_BREAK` (invisible) goes after a ``:`` followed by a letter, ``/``, ``_``,
      ``+`` or ``-``, after an ``@`` followed by a character, and between ``www`` and ``.``:
      Streamlit matches icons, emoji and bare links in the parsed text, where a backslash no
      longer is. (``host:8000`` and ``09:30`` read as written: no icon, directive or link
      starts with a digit.)

    ``code=True``: the text as an inline code span instead (shown in monospace; no escapes
    inside, which code spans would show): a backtick fence longer than any run of backticks
    in the text, padded with a space when the text starts or ends with one; the same control
    and :data:`MD_BREAK` rules.

    Args:
        value: any object; ``str(value)`` is escaped (None -> ``'None'``: format missing
            values first, e.g. with :data:`MISSING`).

    Returns:
        The escaped text, for an f-string of Markdown. Not for a place that is not Markdown
        (``st.dataframe`` cells, ``st.text``, ``st.code``, metric values): there it would show
        the backslashes.
    """
    text = _MD_SPACES.sub(" ", str(value))
    text = _MD_CONTROLS.sub("\ufffd", text)
    text = _MD_WWW.sub(r"\1" + MD_BREAK,
                       _MD_BREAK_AFTER.sub(lambda m: m.group(0) + MD_BREAK, text))
    if code:
        longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
        fence = "`" * (longest + 1)
        pad = " " if text.startswith(("`", " ")) or text.endswith(("`", " ")) else ""
        return f"{fence}{pad}{text}{pad}{fence}" if text else "` `"
    out = "".join("\\" + ch if ch in MD_ESCAPED else ch for ch in text)
    m = _MD_LEADING_LIST.match(out)
    if m:
        lead, sign, digits, delim = m.groups()
        out = lead + ("\\" + sign if sign else f"{digits}\\{delim}") + out[m.end():]
    return out


#: What :func:`plotly_text` replaces, with the character reference Plotly turns back into the
#: character when it draws the text: ``& < >`` (its pseudo-HTML: ``<a href>``, ``<b>``,
#: ``<br>``, ``<span style>``... and its entities), ``$`` (a ``$...$`` text is typeset as TeX
#: where MathJax is loaded) and ``%`` (``%{...}`` in a hover template is a substitution).
PLOTLY_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "$": "&#36;", "%": "&#37;"}
_PLOTLY_SPECIAL = re.compile("[&<>$%]")


def plotly_text(value: object) -> str:
    """``value`` as text that a Plotly figure shows exactly as written in any of its text
    fields: THE rule for every string from data or from the URL (model, instance, run,
    tenant-digest, reason, currency names...) that reaches a chart title, axis title, tick,
    legend name, annotation, bar text, hover template or ``customdata``/``text`` shown by a
    hover template. Nothing from the data is ever Plotly's pseudo-HTML (a clickable ``<a>``,
    ``<b>``, a ``<br>`` line break, ``<span style>``), an entity, TeX or a hover substitution.

    - Each character of :data:`PLOTLY_ESCAPES` becomes its character reference (the
      plotly.js bundled with Streamlit 1.67, ``svg_text_utils``: tags are ``<[^<>]*>``, then
      ``&name;``/``&#N;`` are converted back to characters; TeX is matched on the raw text;
      ``%{...}`` is substituted in the template before either).
    - Line breaks, tabs and other whitespace controls become one space; other control
      characters and bidirectional overrides become U+FFFD (as :func:`md_text`).

    Args:
        value: any object; ``str(value)`` is escaped (None -> ``'None'``: format missing
            values first).

    Returns:
        The escaped text, for a Plotly text field (the figure functions' own markup,
        ``<br>`` and ``<extra>``, goes around it). Not for Markdown (:func:`md_text`) or a
        table cell: there it would show the references. Idempotent it is not: escape once,
        where the data becomes figure text.
    """
    text = _MD_CONTROLS.sub("\ufffd", _MD_SPACES.sub(" ", str(value)))
    return _PLOTLY_SPECIAL.sub(lambda m: PLOTLY_ESCAPES[m.group(0)], text)


def fmt_ms(value: float | None) -> str:
    """Milliseconds with one decimal and separators: ``1234.56 -> '1,234.6'``; None -> ``'—'``."""
    if _missing(value):
        return MISSING
    x = _number(value)
    return str(value) if x is None else f"{x:,.1f}"


def currency_prefix(currency: str | None) -> str:
    """The symbol shown before an amount: ``'INR' -> 'Rs'``, ``'USD' -> '$'``, else the code."""
    if not currency:
        return ""
    return _CURRENCY_PREFIX.get(currency.strip().upper(), currency.strip())


def money_decimals(amount: float) -> int:
    """Decimals that show an amount: 2, or for amounts under 0.1 enough for 3 significant digits
    (``0.0593 -> 4``, ``0.000593 -> 6``), so a small shadow cost never reads 0.00. At most 8."""
    a = abs(float(amount))
    if a >= 0.1 or a == 0.0:
        return 2
    return min(8, max(2, -math.floor(math.log10(a)) + 2))


def fmt_money(amount: float | None, currency: str | None) -> str:
    """An amount with its currency: ``(48.64, 'INR') -> 'Rs 48.64'``, ``(0.000593, 'USD') ->
    '$0.000593'`` (two decimals, more under 1: :func:`money_decimals`).

    Symbols of one character attach without a space (``$1,234.50``); codes and ``Rs`` get one.
    None/NaN -> ``'—'``.
    """
    if _missing(amount):
        return MISSING
    prefix = currency_prefix(currency)
    value = float(amount)
    sign = "-" if value < 0 else ""
    body = f"{abs(value):,.{money_decimals(value)}f}"
    if not prefix:
        return f"{sign}{body}"
    sep = "" if len(prefix) == 1 and not prefix.isalpha() else " "
    return f"{sign}{prefix}{sep}{body}"


def fmt_time(ts_unix_s: float | None, *, seconds: bool = False) -> str:
    """Unix seconds as ``2026-11-28 10:00 UTC`` (``10:00:05`` with ``seconds``); None -> ``'—'``."""
    if _missing(ts_unix_s):
        return MISSING
    pattern = "%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC"
    return datetime.fromtimestamp(float(ts_unix_s), tz=timezone.utc).strftime(pattern)


def fmt_age(age_s: float | None) -> str:
    """A duration in seconds as a rough age: ``'45 s'``, ``'12 min'``, ``'5 h'``, ``'3 days'``."""
    if _missing(age_s):
        return MISSING
    s = max(0.0, float(age_s))
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 36 * 3600:
        return f"{s / 3600:.0f} h"
    return f"{s / 86400:.0f} days"


def fmt_window(window_s: float) -> str:
    """A window length as its usual name: ``300 -> '5m'``, ``3600 -> '1h'``, ``86400 -> '1d'``."""
    w = float(window_s)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if w >= size and w % size == 0:
            return f"{w / size:.0f}{unit}"
    return f"{w:.0f}s"


def utc_times(ts_unix_s: pd.Series) -> pd.Series:
    """Unix seconds -> naive UTC datetimes (plotly and Streamlit tables show them as given: UTC
    wall time)."""
    import pandas as pd

    return pd.to_datetime(ts_unix_s.astype("float64"), unit="s", utc=True).dt.tz_localize(None)


def breaker_position(row: pd.Series) -> str:
    """The structural position of a breaker (a ``breakers_of`` row), in words (no prompt
    text): ``segment``, ``message_index``, ``role``, ``line``."""
    seg = row.get("segment")
    if seg == "message":
        return f"message {int(row['message_index'])} ({row['role']}), line {int(row['line'])}"
    if seg == "tools":
        return "tools"
    if seg == "template":
        idx = row.get("message_index")
        return "template" + ("" if _missing(idx) else f" before message {int(idx)} ({row['role']})")
    if isinstance(seg, str):
        return seg
    return "whole request"


#: First characters that make a spreadsheet read a CSV cell as a formula (OWASP "CSV
#: injection"): ``=``, ``+``, ``-``, ``@``, tab and carriage return.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: A negative number written as text (``-1,234.50``, ``-3.5%``, ``-1e-05``): a number, not a
#: formula, left as it is (the dashboard's tables hold formatted numbers). Python and DuckDB
#: regular-expression syntax alike (full match).
NEGATIVE_NUMBER = r"-[0-9][0-9,]*(\.[0-9]+)?([eE][+-]?[0-9]+)?%?"
_NEGATIVE_NUMBER = re.compile(NEGATIVE_NUMBER)


def csv_cell(value: object) -> object:
    """``value`` safe as a cell of a CSV file people open in a spreadsheet: a string starting
    with one of :data:`FORMULA_STARTS` gets a leading apostrophe (``=HYPERLINK(...)`` ->
    ``'=HYPERLINK(...)``, shown as text), unless it is a negative number written as text
    (:data:`NEGATIVE_NUMBER`); anything else (numbers, None, other text) as given. The rule of
    ``prefixscope export --format csv`` (store/queries/export.py) and the dashboard's CSV
    downloads."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and \
            _NEGATIVE_NUMBER.fullmatch(value) is None:
        return "'" + value
    return value


def csv_safe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` with :func:`csv_cell` applied to its text columns (object and string
    dtypes; numbers and times untouched), for ``df.to_csv``. The column names are ours and are
    kept."""
    import pandas as pd

    out = df.copy()
    for i in range(out.shape[1]):  # by position: column names may repeat
        s = out.iloc[:, i]
        if s.dtype == object or isinstance(s.dtype, pd.StringDtype):
            out.isetitem(i, s.map(csv_cell))  # None, NaN and NA pass through as given
    return out
