"""The shared sidebar filters: time range, model, instance, run.

The router (``dashboard/app.py``) draws them once per script run with :func:`sidebar` and stores
the result in the session; every page reads it back with :func:`current`. The pure helpers
(:func:`quick_range`, :func:`default_range_label`, :func:`custom_range`) hold the rules and are
unit-tested without Streamlit.

Rules:
1. Quick picks are relative to the wall clock: ``1h``, ``6h``, ``24h``, ``7d`` mean the last
   hour, six hours... up to now; ``all`` is unbounded; ``custom`` is whole UTC days.
2. The default pick is ``all`` when the newest stored sample or request is older than 24 h (so
   a database built from past captures shows its data on first open); else ``7d`` when the
   oldest stored data is more than 24 h old (a week of history shows on first open), else
   ``24h``.
3. An empty multiselect means "all" (None is passed to the queries), never "none".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

from prefixscope.core.formatting import count_noun, md_text

QUICK_PICKS: dict[str, float | None] = {
    "1h": 3600.0,
    "6h": 6 * 3600.0,
    "24h": 86400.0,
    "7d": 7 * 86400.0,
    "all": None,
}
CUSTOM = "custom"
RANGE_CHOICES: tuple[str, ...] = (*QUICK_PICKS, CUSTOM)
STALE_AFTER_S = 86400.0
PRODUCTION_RUN_LABEL = "production"
_STATE_KEY = "prefixscope.filters"
#: The window lengths a page offers (label -> seconds); each page picks its labels.
WINDOWS_S: dict[str, float] = {"10s": 10.0, "1m": 60.0, "5m": 300.0, "15m": 900.0,
                               "1h": 3600.0, "1d": 86400.0}
#: The windows a run shorter than :data:`SHORT_RUN_S` is also offered (:func:`run_windows`):
#: read from the join, not the 5-minute rollup, so only for short runs.
SHORT_WINDOWS = ("10s", "1m")
SHORT_RUN_S = 3600.0
#: Most windows the default window of a short run gives (:func:`run_windows`).
SHORT_RUN_WINDOWS = 60


@dataclass(frozen=True, slots=True)
class Filters:
    """The user's selection, as the query functions take it.

    Attributes:
        start_s: start of the range, Unix seconds (UTC), or None for unbounded.
        end_s: end of the range (exclusive), Unix seconds, or None for unbounded.
        range_label: the pick that produced the range (``1h`` ... ``all``, ``custom``).
        models: selected model names, or None for all.
        instances: selected instances, or None for all.
        run_ids: selected run ids (``''`` = production traffic), or None for all. The sidebar
            selects production only by default when production data exists, so Overview,
            Requests, Savings and Alerts show production health, not replays.
    """

    start_s: float | None
    end_s: float | None
    range_label: str
    models: tuple[str, ...] | None = None
    instances: tuple[str, ...] | None = None
    run_ids: tuple[str, ...] | None = None

    def replay_run_ids(self) -> tuple[str, ...] | None:
        """Run filter for pages about replays (Replay, Scopes, Rejections, Invariants): the
        sidebar's default selection (production only) means every run there, since replay
        runs are what those pages compare."""
        return None if self.run_ids in (None, ("",)) else self.run_ids

    def describe(self, *, every_run_by_default: bool = False) -> str:
        """A one-line description for captions: ``'last 24h · 2 models · all instances'``, then
        the runs: ``production`` for the sidebar's default selection, ``N runs`` otherwise.

        Args:
            every_run_by_default: for the pages that read :meth:`replay_run_ids` (Replay,
                Scopes, Rejections, Invariants): the default selection reads ``all runs``
                there, as those pages show every run.
        """
        if self.range_label == "all":
            when = "all time"
        elif self.range_label == CUSTOM:
            from prefixscope.core.formatting import fmt_time

            when = f"{fmt_time(self.start_s)} to {fmt_time(self.end_s)}"
        else:
            when = f"last {self.range_label}"

        def part(values: tuple[str, ...] | None, noun: str) -> str:
            if values is None:
                return f"all {noun}s"
            return count_noun(len(values), noun)

        bits = [when, part(self.models, "model"), part(self.instances, "instance")]
        runs = self.replay_run_ids() if every_run_by_default else self.run_ids
        if every_run_by_default and runs is None:
            bits.append("all runs")
        elif runs == ("",):
            bits.append(PRODUCTION_RUN_LABEL)
        elif runs is not None:
            bits.append(part(runs, "run"))
        return " · ".join(bits)


def quick_range(label: str, *, now_s: float) -> tuple[float | None, float | None]:
    """The ``(start_s, end_s)`` of a quick pick relative to ``now_s`` (Unix seconds).

    ``all`` gives ``(None, None)``. Raises ValueError for an unknown label.
    """
    if label not in QUICK_PICKS:
        raise ValueError(f"unknown time range {label!r}; choose one of {list(QUICK_PICKS)}")
    span = QUICK_PICKS[label]
    if span is None:
        return None, None
    return now_s - span, None


def period_start_s(now_s: float) -> float:
    """``now_s`` floored to the start of its cache period (``prefixscope.dashboard.data``'s
    ``CACHE_TTL_S``, default 15 s), Unix seconds. Quick picks start from it, so every rerun
    inside one period (a Live tick, a widget click) asks the same query and reads the cache;
    a quick pick's start moves once per period (at most one TTL late)."""
    from prefixscope.dashboard import data

    ttl = max(float(data.CACHE_TTL_S), 1e-3)
    return (float(now_s) // ttl) * ttl


def default_range_label(max_ts_unix_s: float | None, *, now_s: float,
                        min_ts_unix_s: float | None = None) -> str:
    """``'all'`` when there is no data or the newest data is older than 24 h; ``'7d'`` when the
    oldest data (``min_ts_unix_s``) is more than 24 h old; else ``'24h'`` (Unix seconds)."""
    if max_ts_unix_s is None or now_s - float(max_ts_unix_s) > STALE_AFTER_S:
        return "all"
    if min_ts_unix_s is not None and now_s - float(min_ts_unix_s) > STALE_AFTER_S:
        return "7d"
    return "24h"


def custom_range(first_day: date, last_day: date) -> tuple[float, float]:
    """Whole UTC days ``first_day`` to ``last_day`` inclusive as ``(start_s, end_s)``."""
    if last_day < first_day:
        first_day, last_day = last_day, first_day
    start = datetime(first_day.year, first_day.month, first_day.day, tzinfo=timezone.utc)
    end = datetime(last_day.year, last_day.month, last_day.day, tzinfo=timezone.utc) + timedelta(days=1)
    return start.timestamp(), end.timestamp()


def utc_day(ts_unix_s: float) -> date:
    """The UTC calendar day of a Unix time."""
    return datetime.fromtimestamp(float(ts_unix_s), tz=timezone.utc).date()


def selection(values: Sequence[str]) -> tuple[str, ...] | None:
    """A multiselect's value as a query filter: empty means all (None)."""
    return tuple(values) if values else None


def run_label(run_id: str) -> str:
    """How a run id reads in the sidebar: ``''`` is production traffic."""
    return PRODUCTION_RUN_LABEL if run_id == "" else run_id


def sidebar(values: dict, *, now_s: float) -> Filters:
    """Draw the filter widgets in the sidebar and return the selection (also stored in session).

    Args:
        values: ``prefixscope.dashboard.data.filter_values`` output: ``models``, ``instances``, ``run_ids``
            (lists), ``min_ts_unix_s``, ``max_ts_unix_s`` (Unix s or None).
        now_s: the wall clock, Unix seconds (for quick picks).
    """
    import streamlit as st

    st.sidebar.header("Filters")
    default = default_range_label(values.get("max_ts_unix_s"), now_s=now_s,
                                  min_ts_unix_s=values.get("min_ts_unix_s"))
    label = st.sidebar.radio(
        "Time range", RANGE_CHOICES, index=RANGE_CHOICES.index(default), horizontal=True,
        key="filter_range",
        help="Quick picks end now. 'all' is everything stored; 'custom' is whole UTC days.",
    )
    if label == CUSTOM:
        lo = values.get("min_ts_unix_s")
        hi = values.get("max_ts_unix_s")
        first = utc_day(lo) if lo is not None else utc_day(now_s)
        last = utc_day(hi) if hi is not None else utc_day(now_s)
        picked = st.sidebar.date_input("Days (UTC)", value=(first, last), key="filter_days")
        days = tuple(picked) if isinstance(picked, (tuple, list)) else (picked,)
        if len(days) == 1:
            days = (days[0], days[0])
        start_s, end_s = custom_range(days[0], days[1])
    else:  # from the cache period's start: a rerun inside one period reads the cache
        start_s, end_s = quick_range(label, now_s=period_start_s(now_s))
    models = st.sidebar.multiselect("Model", values.get("models") or [], key="filter_models",
                                    placeholder="All models")
    instances = st.sidebar.multiselect("Instance", values.get("instances") or [],
                                       key="filter_instances", placeholder="All instances")
    run_ids = values.get("run_ids") or []
    runs: list[str] = []
    if len(run_ids) > 1:
        runs = st.sidebar.multiselect("Run", run_ids, key="filter_runs", format_func=run_label,
                                      default=[""] if "" in run_ids else None,
                                      placeholder="All runs",
                                      help="'production' is ingested traffic; other runs are replays.")
    f = Filters(start_s=start_s, end_s=end_s, range_label=label, models=selection(models),
                instances=selection(instances), run_ids=selection(runs))
    st.session_state[_STATE_KEY] = f
    return f


def current() -> Filters:
    """The selection the router stored for this script run (all data when none was stored)."""
    import streamlit as st

    f = st.session_state.get(_STATE_KEY)
    if isinstance(f, Filters):
        return f
    return Filters(start_s=None, end_s=None, range_label="all")


def window_picker(key: str, labels: Sequence[str], *, default: str, help: str | None = None,
                  span_s: tuple[float, float] | None = None) -> tuple[str, float]:
    """The page's "Window" radio over ``labels`` (keys of :data:`WINDOWS_S`), starting on
    ``default``; with ``span_s`` (the shown run's span) the choices of :func:`run_windows`;
    returns (label, seconds)."""
    import streamlit as st

    labels, default = run_windows(span_s, labels, default=default)

    label = st.radio("Window", list(labels), index=list(labels).index(default), horizontal=True,
                     key=key, help=help)
    return label, WINDOWS_S[label]


def run_windows(span_s: tuple[float, float] | None, labels: Sequence[str], *, default: str
                ) -> tuple[tuple[str, ...], str]:
    """The window choices of a page showing a run over ``span_s`` (Unix s, first and last
    time; None = unknown): a run shorter than :data:`SHORT_RUN_S` (a live gateway run of a few
    minutes) also gets :data:`SHORT_WINDOWS` and starts on the shortest window giving at most
    :data:`SHORT_RUN_WINDOWS` windows over the span, so its charts read as several windows,
    not one bar filling the plot; longer runs keep
    ``labels`` and ``default``. Pure.

    Returns:
        (labels, default label).
    """
    labels = tuple(labels)
    if span_s is None or float(span_s[1]) - float(span_s[0]) >= SHORT_RUN_S:
        return labels, default
    span = max(0.0, float(span_s[1]) - float(span_s[0]))
    labels = tuple(w for w in SHORT_WINDOWS if w not in labels) + labels
    return labels, next(w for w in labels if span / WINDOWS_S[w] <= SHORT_RUN_WINDOWS)


def run_span(runs, picked: Sequence[str]) -> tuple[float, float] | None:
    """The span (Unix s, first and last decision) of the ``picked`` runs of a
    ``run_list(with_decisions=True)`` frame ``runs``: from the first run's start to the last
    run's end; None when none is known. Pure."""
    rows = runs[runs["run_id"].astype(str).isin([str(r) for r in picked])]
    first = rows["first_ts_unix_s"].dropna() if "first_ts_unix_s" in rows else []
    last = rows["last_ts_unix_s"].dropna() if "last_ts_unix_s" in rows else []
    if len(first) == 0 or len(last) == 0:
        return None
    return float(first.min()), float(last.max())


def _is_time(x: object) -> bool:
    return isinstance(x, (int, float)) and x == x


def run_option_label(run_id: str, label: object, kind: object, created_unix_s: object, *,
                     first_ts_unix_s: object = None, last_ts_unix_s: object = None) -> str:
    """How a run reads in a run picker: ``label · kind · created YYYY-MM-DD HH:MM`` (the run id
    when it has no label); a run without a ``runs`` row (production traffic from the live
    gateway, ``run_id`` ``''``) reads ``production (gateway) · from <first> to <last>`` from
    the span of its decisions when given (it has no creation time: the ingest time is not
    the traffic's); pure."""
    from prefixscope.core.formatting import fmt_time

    if not (isinstance(kind, str) and kind) and _is_time(first_ts_unix_s) \
            and _is_time(last_ts_unix_s):
        name = "production (gateway)" if run_id == "" else run_id
        return (f"{name} · from {fmt_time(float(first_ts_unix_s))} "
                f"to {fmt_time(float(last_ts_unix_s))}")
    if run_id == "" and not (isinstance(label, str) and label):
        label = PRODUCTION_RUN_LABEL
    name = label if isinstance(label, str) and label else run_id
    parts = [name]
    if isinstance(kind, str) and kind:
        parts.append(kind)
    if isinstance(created_unix_s, (int, float)) and created_unix_s == created_unix_s:
        parts.append(f"made {fmt_time(float(created_unix_s))}")
    return " · ".join(parts)


def default_runs(run_ids: Sequence[str], *, n: int) -> list[str]:
    """The runs a picker starts with: the ``n`` newest (``run_ids`` is newest first)."""
    return list(run_ids[:max(0, n)])


def run_picker(runs, *, key: str, default_n: int = 1, label: str = "Runs",
               help: str | None = None, default: Sequence[str] | None = None
               ) -> tuple[str, ...]:
    """A searchable picker of every run in ``runs`` (newest first), for the pages that show
    one run or compare chosen runs (Replay, Scopes, Rejections, Invariants).

    Args:
        runs: ``prefixscope.store.queries.replay.run_list`` rows (``run_id, kind, label,
            created_unix_s``), newest first.
        key: the widget key (the selection survives reruns and the live refresh).
        default_n: how many of the newest runs are picked at first.
        label, help: the widget's label and help text.
        default: the runs picked at first (else the ``default_n`` newest).

    Returns:
        The picked run ids (empty when the user cleared the picker).
    """
    import streamlit as st

    ids = [str(r) for r in runs["run_id"]]
    n = len(runs)
    firsts = runs["first_ts_unix_s"] if "first_ts_unix_s" in runs else [None] * n
    lasts = runs["last_ts_unix_s"] if "last_ts_unix_s" in runs else [None] * n
    names = {str(r): run_option_label(str(r), lab, kind, made, first_ts_unix_s=a,
                                      last_ts_unix_s=b)
             for r, lab, kind, made, a, b in
             zip(runs["run_id"], runs["label"], runs["kind"], runs["created_unix_s"], firsts,
                 lasts)}
    picked = st.multiselect(
        label, ids, default=list(default) if default else default_runs(ids, n=default_n),
        key=key,
        format_func=lambda r: names.get(r, r), placeholder="Type to search the runs",
        help=help or f"All {len(ids):,} runs, newest first; type to search. Each run is shown "
                     "whole (the sidebar's time range does not cut it).")
    return tuple(picked)


def unserved_text(unserved: tuple[int, ...] | None) -> str | None:
    """The note of Scopes and Rejections for accepts the engine could not serve, from
    ``prefixscope.store.queries.scopes.unserved_accepts`` (``(requests, tokens,
    bypass_requests, bypass_tokens)``; a 2-tuple: shadow only): the gateway's ``shadow`` mode
    forwards every request with a salt unique to it, so its accepts are candidate hits, not
    hits; so does its cache bypass (``/admin/bypass``), named apart. None when there are none.
    Pure."""
    from prefixscope.core.formatting import fmt_int

    if not unserved:
        return None
    n, tokens, bn, btokens = (tuple(int(v) for v in unserved) + (0, 0))[:4]
    parts = []
    if n:
        noun = "accept was" if n == 1 else "accepts were"
        parts.append(
            f"Shadow: {fmt_int(n)} {noun} not served ({fmt_int(tokens)} candidate tokens): "
            "the gateway forwarded them with a salt unique to the request (mode `shadow`), so "
            "they are counted as Accepted decisions, what `tenant` mode would reuse, while the "
            "hit rates are the engine's cached tokens (docs/gateway.md#rollout-and-rollback).")
    if bn:
        noun = "accept was" if bn == 1 else "accepts were"
        parts.append(
            f"Bypass: {fmt_int(bn)} {noun} not served ({fmt_int(btokens)} candidate tokens): "
            "the cache bypass was on (`/admin/bypass`), so the gateway forwarded them with a "
            "salt unique to the request and logged 0 accepted tokens; they are counted as "
            "Accepted decisions, what the identity check found "
            "(docs/gateway.md#rollout-and-rollback).")
    return " ".join(parts) or None


def refused_text(refused) -> str | None:
    """The "Refused / errors" line of Scopes and Rejections from
    ``prefixscope.store.queries.scopes.refused_by_reason`` rows (``error, requests``): the
    requests the engine never answered, left out of the hit rates and miss counts; None when
    there are none. Pure."""
    from prefixscope.core.formatting import fmt_int

    if refused is None or len(refused) == 0:
        return None
    total = int(refused["requests"].sum())
    by = ", ".join(f"{md_text(e)} {fmt_int(int(n))}"
                   for e, n in zip(refused["error"], refused["requests"]))
    noun = "request" if total == 1 else "requests"
    return (f"Refused / errors: {fmt_int(total)} {noun} ({by}) never reached the engine (the "
            "gateway answered them itself, or the upstream failed); they are left out of the "
            "hit rates and the request and miss counts here (docs/metrics.md#refused-requests).")


#: What Scopes, Rejections and Invariants say when no gateway decision is stored in the range.
NO_DECISIONS = ("No data in this range — no gateway decisions stored. Put `prefixscope gateway` in "
                "front of vLLM (it writes the decision log; docs/gateway.md) and ingest it with "
                "`prefixscope ingest decisions FILE`, replay a multi-tenant trace with "
                "`prefixscope replay gateway data/multitenant/trace.jsonl`, or widen the time range.")


def pick_decision_runs(db: str, *, key: str, empty: str = NO_DECISIONS) -> tuple[str, ...]:
    """The run picker of the pages over gateway decisions (Scopes, Rejections, Invariants):
    every run that has decisions, newest first; stops the page with ``empty`` when there is
    none, or with a hint when the user cleared the picker.

    Args:
        db: the database path (read through :func:`prefixscope.dashboard.data.query`).
        key: the picker's widget key.
        empty: the page's text for a database without decision runs.

    Returns:
        The picked run ids (never empty: the page stops first).
    """
    import streamlit as st

    from prefixscope.dashboard import data

    runs = data.query(db, "replay", "run_list", with_decisions=True)
    if runs.empty:
        st.info(empty, icon=":material/info:")
        st.stop()
    ids = [str(r) for r in runs["run_id"]]
    side = current().run_ids  # the sidebar's Run (None: all runs)
    wanted = [r for r in ids if side is not None and r in side]
    picked = run_picker(runs, key=key, label="Run (or runs to compare)",
                        default=wanted or None)
    if side is not None and set(picked) != set(side):
        missing = [run_label(r) for r in side if r not in ids]
        why = (f"the sidebar's run {', '.join(md_text(r) for r in missing)} has no gateway "
               "decisions"
               if missing and not wanted else "picked here")
        st.caption(f"Showing {', '.join(md_text(run_label(r)) for r in picked) or 'no run'} "
                   f"({why}); the sidebar's Run is "
                   f"{', '.join(md_text(run_label(r)) for r in side)}.")
    if not picked:
        st.info("Pick at least one run.", icon=":material/info:")
        st.stop()
    return picked


def partial_windows_note(start_s: float | None, end_s: float | None, window_s: float, *,
                         now_s: float) -> str:
    """Which windows of a time range hold only part of their length (UTC-aligned windows of
    ``window_s`` seconds; Unix seconds; None = open end): ``Bars are 1d windows (UTC); the
    first starts at the range's start (2026-11-29 20:05 UTC) and the last ends now: both hold
    part of a window.`` A quick pick (start set, end open) ends now; the range "all" (both
    open) has no cut window. Empty when both ends are on window boundaries."""
    from prefixscope.core.formatting import fmt_time, fmt_window

    parts = []
    if start_s is not None and float(start_s) % window_s:
        parts.append(f"the first starts at the range's start ({fmt_time(start_s)})")
    end = now_s if end_s is None else float(end_s)
    if (start_s is not None or end_s is not None) and end % window_s:
        parts.append("the last ends " + ("now" if end_s is None else f"at {fmt_time(end_s)}"))
    if not parts:
        return ""
    return (f"Bars are {fmt_window(window_s)} windows (UTC); " + " and ".join(parts)
            + (": both hold" if len(parts) == 2 else ": it holds") + " part of a window.")
