"""The daily report: per model (and scope, when per-request data carries it) whether the prefix
cache worked on one calendar day, with its status OK / ALERT / NO DATA / STALE.

Definitions (also in ``docs/alerts.md``, with examples):

1. **The day** is ``[00:00, 24:00)`` of a date in an IANA time zone, as Unix seconds
   ``[start_s, end_s)``; it is 23 or 25 hours long across a DST change.
2. **Figures of a model line** come from the vLLM counters when the model has any counter
   samples in the day (source ``metrics``: ``hit_tokens`` = increase of
   ``vllm:prefix_cache_hits_total``, ``prompt_tokens`` = increase of
   ``vllm:prefix_cache_queries_total``, through
   :func:`prefixscope.store.queries.metrics.hit_rate_by_window` with one window of the day's length), else
   from production requests (``run_id = ''``) that reported ``cached_tokens`` (source
   ``requests``: :func:`prefixscope.store.queries.requests.request_hit_rate_by_window`). A **scope line**
   (model, PUBLIC/TENANT/PRINCIPAL) always comes from requests. ``hit_rate`` = cached / prompt
   tokens, a fraction, None when prompt tokens are 0.
3. **Status**, in this order: STALE when a metrics source of the model stopped reporting
   (point 4); NO DATA when ``prompt_tokens < min_query_tokens`` (a cold restart with 0 of 1
   queried tokens is not an alert); OK when ``hit_rate >= threshold`` (``per_model_threshold``
   of the model, else ``hit_rate_threshold``, default 0.5); ALERT below. These rules, the
   thresholds and the line text are :mod:`prefixscope.core.report`'s (shared with
   ``prefixscope report`` and the dashboard); this module gathers the figures.
4. **STALE**: an (instance, model) scraped at least once in ``[start_s - 86400, cutoff)``, with
   ``cutoff = min(end_s, now)``, whose last scrape is earlier than ``cutoff - stale_after_s``,
   ``stale_after_s = max(stale_min_s, stale_after_scrapes x median_gap_s)``, the median gap
   between its consecutive scrapes over the same range (0 with a single scrape).
5. **Changes** are differences of hit rates in percentage points against the previous day and
   the same weekday one week earlier (each computed the same way over its own local day), None
   when either side has fewer than ``min_query_tokens``.
6. **Fell most**: model lines and (model, tenant digest) namespaces from requests whose hit rate
   fell most since the previous day (both days at or above ``min_query_tokens``), at most
   ``top_changes`` each, largest fall first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import duckdb
import pandas as pd

from prefixscope.core.bounds import escape_control
from prefixscope.core import report as rules
from prefixscope.core.config import AlertsConfig
from prefixscope.core.errors import UsageError
from prefixscope.core.times import is_iana_zone
from prefixscope.core.report import ALERT, NO_DATA, STALE, threshold_for

LOOKBACK_S = 86400.0
DAY_S = 86400.0
PRODUCTION_RUN_ID = ""


# ---------------------------------------------------------------------------------------------
# Days and time zones
# ---------------------------------------------------------------------------------------------


def resolve_tz(name: str, *, key: str = "--tz") -> ZoneInfo:
    """The IANA zone ``name`` (e.g. ``Europe/Berlin``, ``UTC``).

    Raises:
        UsageError: unknown zone (``key`` names the option or config key in the message).
    """
    try:
        if not is_iana_zone(name):  # Factory, localtime, posixrules load but are no zone meant
            raise ZoneInfoNotFoundError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # OSError: a name too long
        shown = escape_control(name if len(name) <= 64 else name[:64] + "...")
        raise UsageError(f"{key}: unknown time zone '{shown}': use an IANA name such as "
                         "UTC or Europe/Berlin") from exc


def parse_day(text: str) -> date:
    """``YYYY-MM-DD`` as a date.

    Raises:
        UsageError: not a date in that form.
    """
    try:
        day = date.fromisoformat(text.strip())
    except ValueError as exc:
        raise UsageError(f"--date: cannot read {text!r}: use YYYY-MM-DD") from exc
    if not date(1970, 1, 2) <= day <= date(2099, 12, 30):  # the stored times' bound, a day inside
        raise UsageError(f"--date {day.isoformat()}: use a day from 1970-01-02 to 2099-12-30 "
                         "(stored times lie in 1970-2100)")
    return day


@dataclass(frozen=True, slots=True)
class DayWindow:
    """One local calendar day as Unix seconds ``[start_s, end_s)``.

    Attributes:
        day: the local date.
        tz: IANA zone name.
        start_s, end_s: Unix seconds of local midnight at the start and the end of the day.
    """

    day: date
    tz: str
    start_s: float
    end_s: float

    @classmethod
    def of(cls, day: date, tz: str) -> DayWindow:
        """The window of ``day`` in zone ``tz`` (raises UsageError for an unknown zone)."""
        zone = resolve_tz(tz)
        start = datetime(day.year, day.month, day.day, tzinfo=zone)
        nxt = day + timedelta(days=1)
        end = datetime(nxt.year, nxt.month, nxt.day, tzinfo=zone)
        return cls(day=day, tz=tz, start_s=start.timestamp(), end_s=end.timestamp())

    def shifted(self, days: int) -> DayWindow:
        """The window of the local date ``days`` later (negative: earlier)."""
        return DayWindow.of(self.day + timedelta(days=days), self.tz)

    @property
    def length_s(self) -> float:
        """Seconds in the day (86400, or 82800 / 90000 across a DST change)."""
        return self.end_s - self.start_s


def default_day(tz: str, *, now_unix_s: float | None = None) -> date:
    """Yesterday in zone ``tz`` relative to ``now_unix_s`` (default the wall clock)."""
    now = time.time() if now_unix_s is None else now_unix_s
    return datetime.fromtimestamp(now, tz=resolve_tz(tz)).date() - timedelta(days=1)


# ---------------------------------------------------------------------------------------------
# The report's values
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figures:
    """Token figures of one line over one day.

    Attributes:
        source: ``metrics`` (vLLM counters) or ``requests`` (per-request usage).
        prompt_tokens: tokens queried (metrics) or prompt tokens of requests that reported
            cached_tokens (requests).
        cached_tokens: tokens served from the prefix cache.
        hit_rate: cached / prompt, fraction in [0, 1]; None when prompt_tokens is 0.
        restarts: counter drops seen (metrics only).
        requests: requests in the day (requests only).
        coverage: fraction of those requests that reported cached_tokens (requests only).
    """

    source: str
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float | None
    restarts: int = 0
    requests: int | None = None
    coverage: float | None = None


@dataclass(frozen=True, slots=True)
class StaleSource:
    """A metrics source that stopped reporting (definition 4 of the module docstring).

    Attributes:
        instance, model: the source.
        last_ts_unix_s: its last scrape before the cutoff.
        median_gap_s: median seconds between its scrapes (None with a single scrape).
        stale_after_s: the silence that makes it stale.
        cutoff_unix_s: ``min(day end, now)``.
    """

    instance: str
    model: str
    last_ts_unix_s: float
    median_gap_s: float | None
    stale_after_s: float
    cutoff_unix_s: float


@dataclass(frozen=True, slots=True)
class Change:
    """A hit-rate fall since the previous day (a model line or a namespace).

    Attributes:
        model: model name.
        tenant_digest: the namespace digest (None for a model).
        scope: scope of the line (None for all scopes).
        hit_rate, prev_hit_rate: fractions on the day and the day before.
        change: hit_rate - prev_hit_rate (fraction, negative = fell).
        prompt_tokens: prompt tokens on the day.
    """

    model: str
    tenant_digest: str | None
    scope: str | None
    hit_rate: float
    prev_hit_rate: float
    change: float
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class ReportLine:
    """One line of the daily report: a model, or a (model, scope) pair.

    Attributes:
        model: model name.
        scope: PUBLIC / TENANT / PRINCIPAL, or None for the model's line over all scopes.
        figures: the day's :class:`Figures` (source ``none`` with zeros when nothing came in).
        threshold: the OK/ALERT boundary used, fraction.
        status: OK, ALERT, NO DATA or STALE.
        text: the report line, e.g. ``608,000 of 644,000 prompt tokens from cache (94.4%): OK``.
        prev_day, prev_week: figures of the previous day / same weekday a week earlier, same
            source, or None.
        change_prev_day, change_prev_week: hit-rate differences (fractions), None when either
            day is under ``min_query_tokens``.
        saved, cost_without_cache, currency, shadow_price, price_source: savings of the model
            on the day from per-request usage and the price table (model lines only; None when
            not priced or no requests).
        stale: the stale sources of this model (STALE lines).
        top_breaker: the rank-1 breaker of the model's newest stored diagnosis
            (``store.queries.breakers.top_breaker_by_model``: kind, segment, message_index,
            role, line, lost_tokens...), on model lines when one is known; an ALERT line then
            names it (:func:`breaker_hint`).
        instance: the vLLM instance of a per-instance line (a model served by more than one
            instance gets one line per instance after its model line, from the counters), else
            None.
        miss_cost: what the day's misses cost (prompt tokens computed, not read from the
            cache, at input minus cached-input price; model lines with a price only).
    """

    model: str
    scope: str | None
    figures: Figures
    threshold: float
    status: str
    text: str
    prev_day: Figures | None = None
    prev_week: Figures | None = None
    change_prev_day: float | None = None
    change_prev_week: float | None = None
    saved: float | None = None
    cost_without_cache: float | None = None
    currency: str | None = None
    shadow_price: bool | None = None
    price_source: str | None = None
    stale: tuple[StaleSource, ...] = ()
    top_breaker: dict[str, object] | None = None
    instance: str | None = None
    miss_cost: float | None = None

    @property
    def label(self) -> str:
        """``model``, ``model scope`` or ``model @ instance``."""
        if self.instance is not None:
            return f"{self.model} @ {self.instance}"
        return self.model if self.scope is None else f"{self.model} {self.scope}"

    @property
    def key(self) -> tuple[str, str]:
        """(model, scope or '@instance' or '') - identifies the line inside a report."""
        if self.instance is not None:
            return (self.model, "@" + self.instance)
        return (self.model, self.scope or "")

    @property
    def is_detail(self) -> bool:
        """A scope or instance line (shown under its model line)."""
        return self.scope is not None or self.instance is not None


@dataclass(frozen=True, slots=True)
class DailyReport:
    """The daily report of one local day.

    Attributes:
        window: the day.
        generated_unix_s: when it was computed.
        lines: model lines, each followed by its scope lines; models in name order.
        fell_models, fell_namespaces: :class:`Change` lists, largest fall first.
        stale_sources: every stale source (also attached to their model lines).
        min_query_tokens: the NO DATA volume used.
        status: the worst line status (NO DATA when there are no lines).
    """

    window: DayWindow
    generated_unix_s: float
    lines: tuple[ReportLine, ...]
    fell_models: tuple[Change, ...] = ()
    fell_namespaces: tuple[Change, ...] = ()
    stale_sources: tuple[StaleSource, ...] = ()
    min_query_tokens: int = 0
    status: str = NO_DATA

    def as_dict(self) -> dict[str, object]:
        """JSON-ready dict (``prefixscope report daily --json``)."""
        return {
            "day": self.window.day.isoformat(), "tz": self.window.tz,
            "start_unix_s": self.window.start_s, "end_unix_s": self.window.end_s,
            "generated_unix_s": self.generated_unix_s, "status": self.status,
            "min_query_tokens": self.min_query_tokens,
            "lines": [line_dict(line) for line in self.lines],
            "fell_models": [asdict(c) for c in self.fell_models],
            "fell_namespaces": [asdict(c) for c in self.fell_namespaces],
            "stale_sources": [asdict(s) for s in self.stale_sources],
        }


def line_dict(line: ReportLine) -> dict[str, object]:
    """One :class:`ReportLine` as a JSON-ready dict (figures flattened, hit rates fractions)."""
    d = asdict(line)
    d["label"] = line.label
    return d


# ---------------------------------------------------------------------------------------------
# Formatting of the line (the users' format, product-brief.md)
# ---------------------------------------------------------------------------------------------


def line_text(fig: Figures, status: str, *, threshold: float, min_query_tokens: int,
              stale: Sequence[StaleSource] = (), tz: str = "UTC",
              hint: str = rules.ALERT_HINT) -> str:
    """The report line of ``fig`` (:func:`prefixscope.core.report.report_line`; STALE times in
    the local time of ``tz``; ``hint`` after ALERT, :func:`prefixscope.core.report.alert_hint`). A NO DATA line of requests none of which reported cached tokens
    says so instead of the volume guard (their prompt tokens are not "under
    ``min_query_tokens``": an absent ``cached_tokens`` is null, not 0)."""
    if (status == NO_DATA and fig.source == "requests" and fig.requests
            and fig.prompt_tokens == 0):
        return (f"{fig.cached_tokens:,} of {fig.prompt_tokens:,} prompt tokens from cache: "
                f"NO DATA: no cached-token counts reported (none of the {fig.requests:,} "
                "requests of the day has prompt_tokens_details.cached_tokens; null is not 0: "
                "vLLM reports it with --enable-prompt-tokens-details)")
    return rules.report_line(fig.cached_tokens, fig.prompt_tokens, status, threshold=threshold,
                             min_query_tokens=min_query_tokens, stale=stale,
                             zone=resolve_tz(tz) if status == STALE or stale else None,
                             hint=hint)


#: Where the top breaker of a diagnosis is, in words (:func:`prefixscope.core.report.breaker_hint`).
breaker_hint = rules.breaker_hint


def status_of(fig: Figures, *, threshold: float, min_query_tokens: int, stale: bool) -> str:
    """Definition 3 of the module docstring (:func:`prefixscope.core.report.status_of`)."""
    return rules.status_of(fig.cached_tokens, fig.prompt_tokens, threshold=threshold,
                           min_query_tokens=min_query_tokens, stale=stale)


# ---------------------------------------------------------------------------------------------
# Gathering figures through the query modules of H1 (metrics) and H2 (requests, savings)
# ---------------------------------------------------------------------------------------------


def _int(value: object) -> int:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return 0
    return int(value)


def _opt_float(value: object) -> float | None:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def _rate(cached: int, prompt: int) -> float | None:
    return None if prompt <= 0 else cached / prompt


def metric_figures(con: duckdb.DuckDBPyConnection, w: DayWindow) -> dict[str, Figures]:
    """Production counter figures per model over the day (one window of the day's length);
    replay runs' samples are left out."""
    from prefixscope.store.queries.metrics import hit_rate_by_window

    df = hit_rate_by_window(con, start_s=w.start_s, end_s=w.end_s, window_s=w.length_s,
                            by=("model",), origin_s=w.start_s, run_ids=[PRODUCTION_RUN_ID])
    out: dict[str, Figures] = {}
    for row in df.itertuples(index=False):
        if row.model is None or (isinstance(row.model, float) and math.isnan(row.model)):
            continue
        hits, queries = _int(row.hit_tokens), _int(row.query_tokens)
        assert row.model not in out, f"one window per day expected, got two for {row.model}"
        out[row.model] = Figures("metrics", queries, hits, _rate(hits, queries),
                                 _int(getattr(row, "restarts", 0)))
    return out


def instance_figures(con: duckdb.DuckDBPyConnection, w: DayWindow) -> dict[tuple[str, str], Figures]:
    """Production counter figures per (model, instance) over the day, like
    :func:`metric_figures`."""
    from prefixscope.store.queries.metrics import hit_rate_by_window

    df = hit_rate_by_window(con, start_s=w.start_s, end_s=w.end_s, window_s=w.length_s,
                            by=("model", "instance"), origin_s=w.start_s,
                            run_ids=[PRODUCTION_RUN_ID])
    out: dict[tuple[str, str], Figures] = {}
    for row in df.itertuples(index=False):
        if not isinstance(row.model, str) or not isinstance(row.instance, str):
            continue
        hits, queries = _int(row.hit_tokens), _int(row.query_tokens)
        out[(row.model, row.instance)] = Figures("metrics", queries, hits, _rate(hits, queries),
                                                 _int(getattr(row, "restarts", 0)))
    return out


def request_figures(con: duckdb.DuckDBPyConnection, w: DayWindow,
                    by: tuple[str, ...]) -> dict[tuple, Figures]:
    """Production-request figures over the day, keyed by the ``by`` columns' values."""
    from prefixscope.store.queries.requests import request_hit_rate_by_window

    df = request_hit_rate_by_window(con, start_s=w.start_s, end_s=w.end_s, window_s=w.length_s,
                                    by=by, run_ids=[PRODUCTION_RUN_ID], origin_s=w.start_s)
    out: dict[tuple, Figures] = {}
    for row in df.to_dict("records"):
        key = tuple(None if pd.isna(row[c]) else row[c] for c in by)
        if key[0] is None:
            continue
        prompt = _int(row.get("reported_prompt_tokens"))
        cached = _int(row.get("cached_tokens"))
        assert key not in out, f"one window per day expected, got two for {key}"
        out[key] = Figures("requests", prompt, cached, _rate(cached, prompt),
                           requests=_int(row.get("requests")),
                           coverage=_opt_float(row.get("coverage")))
    return out


def savings_figures(con: duckdb.DuckDBPyConnection, w: DayWindow) -> dict[str, dict]:
    """Savings per model over the day (production requests and the price table), by model."""
    from prefixscope.store.queries.savings import savings_by_model

    df = savings_by_model(con, start_s=w.start_s, end_s=w.end_s, run_ids=[PRODUCTION_RUN_ID])
    out: dict[str, dict] = {}
    for row in df.to_dict("records"):
        if row.get("model") is None or _opt_float(row.get("saved")) is None:
            continue
        out[row["model"]] = row
    return out


def stale_sources(con: duckdb.DuckDBPyConnection, w: DayWindow, cfg: AlertsConfig, *,
                  now_unix_s: float) -> list[StaleSource]:
    """Definition 4 of the module docstring, for every metrics source."""
    from prefixscope.store.queries.alerts import scrape_activity

    cutoff = min(w.end_s, now_unix_s)
    if cutoff <= w.start_s:
        return []
    df = scrape_activity(con, start_s=w.start_s - LOOKBACK_S, end_s=cutoff)
    out: list[StaleSource] = []
    for row in df.itertuples(index=False):
        gap = _opt_float(row.median_gap_s)
        after = max(cfg.stale_min_s, cfg.stale_after_scrapes * (gap or 0.0))
        if float(row.last_ts_unix_s) < cutoff - after:
            out.append(StaleSource(instance=row.instance, model=row.model,
                                   last_ts_unix_s=float(row.last_ts_unix_s), median_gap_s=gap,
                                   stale_after_s=after, cutoff_unix_s=cutoff))
    return out


@dataclass
class _DayData:
    metrics: dict[str, Figures] = field(default_factory=dict)
    by_model: dict[tuple, Figures] = field(default_factory=dict)
    by_scope: dict[tuple, Figures] = field(default_factory=dict)
    by_tenant: dict[tuple, Figures] = field(default_factory=dict)
    by_instance: dict[tuple, Figures] = field(default_factory=dict)

    def model_figures(self, model: str, source: str | None = None) -> Figures | None:
        if source in (None, "metrics") and model in self.metrics:
            return self.metrics[model]
        if source in (None, "requests"):
            return self.by_model.get((model,))
        return None

    def models(self) -> set[str]:
        return set(self.metrics) | {k[0] for k in self.by_model}


def _day_data(con: duckdb.DuckDBPyConnection, w: DayWindow) -> _DayData:
    return _DayData(metrics=metric_figures(con, w),
                    by_model=request_figures(con, w, ("model",)),
                    by_scope=request_figures(con, w, ("model", "scope")),
                    by_tenant=request_figures(con, w, ("model", "tenant_digest")),
                    by_instance=instance_figures(con, w))


def _change(today: Figures | None, before: Figures | None, min_tokens: int) -> float | None:
    if today is None or before is None or today.hit_rate is None or before.hit_rate is None:
        return None
    if today.prompt_tokens < min_tokens or before.prompt_tokens < min_tokens:
        return None
    return today.hit_rate - before.hit_rate


def build_daily_report(con: duckdb.DuckDBPyConnection, *, day: date, tz: str,
                       cfg: AlertsConfig, now_unix_s: float | None = None) -> DailyReport:
    """Compute the daily report of ``day`` in zone ``tz`` (definitions in the module docstring).

    Args:
        con: a connection (read-only is enough) with the full schema.
        day: the local date reported.
        tz: IANA zone of the day boundary.
        cfg: thresholds, volume guard, staleness rule, and the models named in the config
            (``recipients_by_model``, ``per_model_threshold``), which get a NO DATA line when
            absent.
        now_unix_s: "now" for the STALE cutoff of a day not yet over (default wall clock).

    Returns:
        A :class:`DailyReport`.

    Raises:
        UsageError: unknown zone. ConfigError: a per-model threshold outside [0, 1].
    """
    now = time.time() if now_unix_s is None else now_unix_s
    w = DayWindow.of(day, tz)
    today = _day_data(con, w)
    prev = _day_data(con, w.shifted(-1))
    week = _day_data(con, w.shifted(-7))
    savings = savings_figures(con, w)
    stale = stale_sources(con, w, cfg, now_unix_s=now)
    stale_by_model: dict[str, list[StaleSource]] = {}
    for s in stale:
        stale_by_model.setdefault(s.model, []).append(s)
    min_tokens = cfg.min_query_tokens

    models = (today.models() | prev.models() | week.models() | set(stale_by_model)
              | set(cfg.recipients_by_model) | set(cfg.per_model_threshold))
    scopes = sorted({k for d in (today, prev, week) for k in d.by_scope if k[1] is not None},
                    key=lambda k: (k[0], k[1]))

    from prefixscope.store.queries.alerts import alert_hints

    hints = alert_hints(con, start_s=w.start_s, end_s=w.end_s, models=sorted(models))
    lines: list[ReportLine] = []
    for model in sorted(models):
        threshold = threshold_for(cfg, model)
        fig = today.model_figures(model)
        if fig is None:
            fig = Figures("none", 0, 0, None)
        source = fig.source if fig.source != "none" else None
        p = prev.model_figures(model, source)
        wk = week.model_figures(model, source)
        model_stale = tuple(stale_by_model.get(model, ()))
        status = status_of(fig, threshold=threshold, min_query_tokens=min_tokens,
                           stale=bool(model_stale))
        sv = savings.get(model, {})
        text = line_text(fig, status, threshold=threshold, min_query_tokens=min_tokens,
                         stale=model_stale, tz=tz, hint=hints.hint(model))
        top = hints.top_breakers.get(model)
        lines.append(ReportLine(
            model=model, scope=None, figures=fig, threshold=threshold, status=status,
            text=text, top_breaker=top,
            prev_day=p, prev_week=wk, change_prev_day=_change(fig, p, min_tokens),
            change_prev_week=_change(fig, wk, min_tokens),
            saved=_opt_float(sv.get("saved")),
            cost_without_cache=_opt_float(sv.get("cost_without_cache")),
            currency=sv.get("currency"),
            shadow_price=None if not sv else bool(sv.get("shadow")),
            price_source=sv.get("price_source"), stale=model_stale,
            miss_cost=_opt_float(sv.get("miss_cost"))))
        # one line per instance when the model's counters come from more than one instance
        insts = sorted(i for (m, i) in today.by_instance if m == model)
        if source == "metrics" and len(insts) > 1:
            for inst in insts:
                ifig = today.by_instance[(model, inst)]
                ip = prev.by_instance.get((model, inst))
                iw = week.by_instance.get((model, inst))
                istale = tuple(s for s in model_stale if s.instance == inst)
                istatus = status_of(ifig, threshold=threshold, min_query_tokens=min_tokens,
                                    stale=bool(istale))
                lines.append(ReportLine(
                    model=model, scope=None, instance=inst, figures=ifig, threshold=threshold,
                    status=istatus,
                    text=line_text(ifig, istatus, threshold=threshold,
                                   min_query_tokens=min_tokens, stale=istale, tz=tz),
                    prev_day=ip, prev_week=iw, change_prev_day=_change(ifig, ip, min_tokens),
                    change_prev_week=_change(ifig, iw, min_tokens), stale=istale))
        for key in (k for k in scopes if k[0] == model):
            sfig = today.by_scope.get(key) or Figures("none", 0, 0, None)
            sp, sw = prev.by_scope.get(key), week.by_scope.get(key)
            sstatus = status_of(sfig, threshold=threshold, min_query_tokens=min_tokens,
                                stale=False)
            lines.append(ReportLine(
                model=model, scope=key[1], figures=sfig, threshold=threshold, status=sstatus,
                text=line_text(sfig, sstatus, threshold=threshold, min_query_tokens=min_tokens,
                               tz=tz, hint=hints.hint(model, key[1])),
                prev_day=sp, prev_week=sw, change_prev_day=_change(sfig, sp, min_tokens),
                change_prev_week=_change(sfig, sw, min_tokens)))

    fell_models = sorted(
        (Change(model=ln.model, tenant_digest=None, scope=None,
                hit_rate=ln.figures.hit_rate, prev_hit_rate=ln.prev_day.hit_rate,
                change=ln.change_prev_day, prompt_tokens=ln.figures.prompt_tokens)
         for ln in lines
         if not ln.is_detail and ln.change_prev_day is not None and ln.change_prev_day < 0),
        key=lambda c: (c.change, c.model))[:cfg.top_changes]
    fell_ns: list[Change] = []
    for key, fig in today.by_tenant.items():
        model, digest = key
        before = prev.by_tenant.get(key)
        ch = _change(fig, before, min_tokens)
        if digest is None or ch is None or ch >= 0:
            continue
        fell_ns.append(Change(model=model, tenant_digest=str(digest), scope=None,
                              hit_rate=fig.hit_rate, prev_hit_rate=before.hit_rate, change=ch,
                              prompt_tokens=fig.prompt_tokens))
    fell_ns.sort(key=lambda c: (c.change, c.model, c.tenant_digest))

    return DailyReport(
        window=w, generated_unix_s=now, lines=tuple(lines), fell_models=tuple(fell_models),
        fell_namespaces=tuple(fell_ns[:cfg.top_changes]), stale_sources=tuple(stale),
        min_query_tokens=min_tokens, status=rules.worst(ln.status for ln in lines))


# ---------------------------------------------------------------------------------------------
# Day-by-day statuses (Overview's daily strip, the Alerts page's opening day)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DayStatus:
    """One model's figures and status over one local day (definitions 2 and 3 of the module
    docstring; STALE, definition 4, only when :func:`daily_statuses` is given ``now_unix_s``:
    Overview's daily strip, so a day reads the word the Alerts page's report of that day does).

    Attributes:
        day: the local date; model: model name.
        figures: the day's :class:`Figures` (counters when the model has any that day, else
            production requests that reported cached_tokens).
        threshold: the OK/ALERT boundary of the model, fraction.
        status: OK, ALERT, NO DATA (under ``min_query_tokens`` prompt tokens) or STALE (a
            metrics source of the model stopped reporting that day: :func:`stale_sources`, as
            :func:`build_daily_report`; its figures are 0 of 0 when it has no data that day).
    """

    day: date
    model: str
    figures: Figures
    threshold: float
    status: str


def _day_windows(first: date, last: date, tz: str) -> list[DayWindow]:
    return [DayWindow.of(first + timedelta(days=k), tz) for k in range((last - first).days + 1)]


def _per_day(df: pd.DataFrame, windows: list[DayWindow], *, cached_col: str,
             prompt_col: str) -> dict[tuple[date, str], tuple[int, int]]:
    """``{(day, model): (cached, prompt)}`` of a per-window frame whose windows start at the
    days' local midnights."""
    starts = {round(w.start_s): w.day for w in windows}
    out: dict[tuple[date, str], tuple[int, int]] = {}
    for row in df.to_dict("records"):
        model = row.get("model")
        day = starts.get(round(float(row["window_start_s"])))
        if not isinstance(model, str) or day is None:
            continue
        c, p = out.get((day, model), (0, 0))
        out[(day, model)] = (c + _int(row.get(cached_col)), p + _int(row.get(prompt_col)))
    return out


def daily_statuses(con: duckdb.DuckDBPyConnection, *, first_day: date, last_day: date, tz: str,
                   cfg: AlertsConfig, models: Sequence[str] | None = None,
                   instances: Sequence[str] | None = None,
                   run_ids: Sequence[str] | None = (PRODUCTION_RUN_ID,),
                   now_unix_s: float | None = None) -> list[DayStatus]:
    """Each model's status on each local day from ``first_day`` to ``last_day`` (inclusive) in
    zone ``tz``: the daily report's figures and status rule (definitions 2 and 3), in two
    queries for the whole span (one window per day), not one report per day.

    The days are windows of one day's length from local midnight of ``first_day``; across a DST
    change (days of 23 or 25 hours) each day is queried on its own. A model with counter
    samples on a day takes the counters' figures (``vllm:prefix_cache_hits_total`` /
    ``_queries_total`` increases, Δhits / Δqueries); otherwise that day's production requests
    that reported ``cached_tokens``. Days without either are left out.

    Args:
        con: a connection (read-only is enough).
        first_day, last_day: local dates, ``first_day <= last_day``.
        tz: IANA zone of the day boundaries.
        cfg: thresholds and ``min_query_tokens``.
        models, instances: filters (None = all); run_ids: runs (default production only).
        now_unix_s: "now" of the STALE rule (definition 4, :func:`stale_sources` of each day,
            one scrape query a day): a model with a stale source on a day reads STALE, as in
            :func:`build_daily_report` of that day, also on a day without its data. None (the
            default): no STALE status (one status from the day's tokens only).

    Returns:
        :class:`DayStatus` rows, by model name, then day.

    Raises:
        UsageError: unknown zone, or ``first_day`` after ``last_day``.
    """
    from prefixscope.store.queries.metrics import hit_rate_by_window
    from prefixscope.store.queries.requests import request_hit_rate_by_window

    if first_day > last_day:
        raise UsageError(f"first day {first_day} is after last day {last_day}")
    windows = _day_windows(first_day, last_day, tz)
    runs = None if run_ids is None else list(run_ids)
    common = dict(models=models, instances=instances, run_ids=runs)
    uniform = all(w.length_s == DAY_S for w in windows)
    spans = [(windows[0].start_s, windows[-1].end_s, DAY_S)] if uniform else \
        [(w.start_s, w.end_s, w.length_s) for w in windows]
    metrics: dict[tuple[date, str], tuple[int, int]] = {}
    reqs: dict[tuple[date, str], tuple[int, int]] = {}
    for start, end, length in spans:
        m = hit_rate_by_window(con, start_s=start, end_s=end, window_s=length, by=("model",),
                               origin_s=start, **common)
        metrics.update(_per_day(m, windows, cached_col="hit_tokens", prompt_col="query_tokens"))
        r = request_hit_rate_by_window(con, start_s=start, end_s=end, window_s=length,
                                       by=("model",), origin_s=start, **common)
        reqs.update(_per_day(r, windows, cached_col="cached_tokens",
                             prompt_col="reported_prompt_tokens"))
    stale: set[tuple[date, str]] = set()
    if now_unix_s is not None:
        wanted = None if models is None else set(models)
        for w in windows:
            stale |= {(w.day, s.model) for s in stale_sources(con, w, cfg, now_unix_s=now_unix_s)
                      if (wanted is None or s.model in wanted)
                      and (instances is None or s.instance in instances)}
    out: list[DayStatus] = []
    for day, model in sorted(set(metrics) | set(reqs) | stale, key=lambda k: (k[1], k[0])):
        if (day, model) in metrics:
            cached, prompt = metrics[(day, model)]
            fig = Figures("metrics", prompt, cached, _rate(cached, prompt))
        elif (day, model) in reqs:
            cached, prompt = reqs[(day, model)]
            fig = Figures("requests", prompt, cached, _rate(cached, prompt))
        else:  # stale, no data that day
            fig = Figures("metrics", 0, 0, None)
        threshold = threshold_for(cfg, model)
        status = status_of(fig, threshold=threshold, min_query_tokens=cfg.min_query_tokens,
                           stale=(day, model) in stale)
        out.append(DayStatus(day=day, model=model, figures=fig, threshold=threshold,
                             status=status))
    return out


def alert_since(statuses: Sequence[DayStatus]) -> dict[str, DayStatus]:
    """Per model whose last day in ``statuses`` reads ALERT: the first day of that run of
    ALERT days (NO DATA and STALE days inside the run or after it neither break nor start it:
    no reading), e.g. coder-7b ALERT on days 5, 6 and 7 gives day 5."""
    by_model: dict[str, list[DayStatus]] = {}
    for s in sorted(statuses, key=lambda s: (s.model, s.day)):
        by_model.setdefault(s.model, []).append(s)
    out: dict[str, DayStatus] = {}
    for model, days in by_model.items():
        counted = [s for s in days if s.status not in (NO_DATA, STALE)]
        if not counted or counted[-1].status != ALERT:
            continue
        first = counted[-1]
        for s in reversed(counted):
            if s.status != ALERT:
                break
            first = s
        out[model] = first
    return out


def opening_day(statuses: Sequence[DayStatus], *, fallback: date) -> tuple[date, str | None]:
    """The day the Alerts page opens on: the day the most recent alert began (the first day
    of the latest run of ALERT days of any model among ``statuses``, whose days should end
    yesterday), else ``fallback`` (yesterday).

    Returns:
        ``(day, model)``: the model whose alert began that day, None for the fallback.
    """
    alerted = [s for s in statuses if s.status == ALERT]
    if not alerted:
        return fallback, None
    last = max(s.day for s in alerted)
    runs = alert_since([s for s in statuses if s.day <= last])
    if not runs:
        return last, max(alerted, key=lambda s: (s.day, s.model)).model
    start = max(runs.values(), key=lambda s: (s.day, s.model))
    return start.day, start.model


@dataclass(frozen=True, slots=True)
class RegressionCost:
    """What a hit-rate regression cost since it began (``docs/metrics.md#what-a-regression-cost``).

    Attributes:
        baseline_hit_rate: the model's hit rate before the regression, fraction.
        hit_rate: its hit rate since, fraction.
        prompt_tokens, cached_tokens: Σ over the requests since the regression began that
            reported cached tokens (null is not 0: the others are in neither sum).
        extra_tokens: prompt tokens the prefill recomputed beyond what the baseline hit rate
            would have left it: ``max(0, baseline x prompt - cached)``.
        cost: ``extra_tokens x`` the price of a missed token (``miss_cost / missed_tokens``
            of the requests since: input minus cached-input price, tiers included),
            in ``currency``; None without a price.
    """

    baseline_hit_rate: float
    hit_rate: float
    prompt_tokens: int
    cached_tokens: int
    extra_tokens: int
    cost: float | None


def regression_cost(*, baseline_hit_rate: float, prompt_tokens: int, cached_tokens: int,
                    miss_cost: float | None,
                    missed_tokens: int | None = None) -> RegressionCost | None:
    """The cost of a regression from the figures of the requests since it began and the hit
    rate before it.

    ``prompt_tokens`` and ``cached_tokens`` are Σ over the requests since that reported cached
    tokens (``reported_prompt_tokens`` and ``cached_tokens`` of
    ``prefixscope.store.queries.requests.request_hit_rate_totals``: a request whose
    ``cached_tokens`` is null is left out of both, never counted as 0). ``miss_cost`` is the
    store's ``miss_cost`` of the requests since (``savings_by_model``, currency units; None or
    NaN without a price) and ``missed_tokens`` the missed prompt tokens it prices (its
    ``prompt_tokens - cached_tokens``, unreported requests included: it gives the price of a
    missed token, ``miss_cost / missed_tokens``); default ``prompt_tokens - cached_tokens``.

    Example: 1,000,000 prompt tokens since, 400,000 cached (40%), a baseline of 75% and misses
    costing USD 0.12 (600,000 missed tokens at USD 0.20 per million): 350,000 extra tokens,
    USD 0.07.

    Returns:
        None when there are no (reporting) prompt tokens since.
    """
    p, c = int(prompt_tokens), int(cached_tokens)
    if p <= 0:
        return None
    extra = max(0, round(baseline_hit_rate * p - c))
    missed = p - c if missed_tokens is None else int(missed_tokens)
    cost = None
    if miss_cost is not None and miss_cost == miss_cost:
        cost = 0.0 if missed <= 0 else float(miss_cost) * extra / missed
    return RegressionCost(baseline_hit_rate=float(baseline_hit_rate), hit_rate=c / p,
                          prompt_tokens=p, cached_tokens=c, extra_tokens=extra, cost=cost)
