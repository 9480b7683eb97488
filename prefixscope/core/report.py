"""The report rules: status (OK / ALERT / NO DATA / STALE), thresholds and the report line.

The one owner of these rules for ``prefixscope report`` (lines built by
:func:`prefixscope.store.queries.requests.report`), the daily report and its email
(:mod:`prefixscope.alerts.daily`, :mod:`prefixscope.alerts.render`) and the dashboard (Overview
badges, Requests threshold line, Alerts page). Pure functions over token counts; no I/O.

Rules (docs/alerts.md, product-brief.md):

- **OK / ALERT**: OK when ``cached_tokens >= threshold x prompt_tokens`` (integer tokens, so
  a rate just under the threshold is ALERT), ALERT below. ``threshold`` is a fraction in [0, 1].
- **INCONSISTENT**: more cached (hit) tokens than prompt (query) tokens. vLLM counts a hit only
  inside a query (``vllm/v1/core/kv_cache_manager.py``: hits <= queries per request), so such
  figures come from mixed sources, a counter reset seen on one series only, or a usage shape
  whose cached tokens are exclusive of the prompt: never OK, whatever the threshold. It ranks
  with ALERT (something needs a look) and its line says why.
- **NO DATA**: no prompt tokens, or fewer than ``min_query_tokens`` (the daily report's volume
  guard: a cold restart with 0 of 1 queried tokens is not an alert).
- **STALE** (daily report only): a metrics source of the model stopped reporting; it wins over
  OK and NO DATA, never over ALERT: a line under the threshold whose source also went silent
  reads ALERT and names the silent source too (both are shown). Severity, worst first: ALERT,
  STALE, NO DATA, OK.
- **Threshold** of a model: ``[alerts] per_model_threshold[model]``, else
  ``[alerts] hit_rate_threshold`` (default :data:`DEFAULT_THRESHOLD`).
- **The line**: ``608,000 of 644,000 prompt tokens from cache (94.4%): OK``; the percentage
  is the pages' one format (:func:`prefixscope.core.formatting.fmt_share`: one decimal,
  rounded), the status is decided on the tokens (4,999,600 of 10,000,000 prints ``50.0%`` and
  reads ALERT under a 0.5 threshold); ALERT adds ``: check the top of the prompt``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, tzinfo
from typing import Protocol

from prefixscope.core.config import AlertsConfig
from prefixscope.core.errors import ConfigError
from prefixscope.core.formatting import fmt_share, fmt_share_vs

OK = "OK"
ALERT = "ALERT"
NO_DATA = "NO DATA"
STALE = "STALE"
INCONSISTENT = "INCONSISTENT"
#: Worst first: the status of an email (or a page) is that of its worst line.
SEVERITY: dict[str, int] = {INCONSISTENT: 4, ALERT: 3, STALE: 2, NO_DATA: 1, OK: 0}
INCONSISTENT_HINT = "more hits than queries: the figures do not add up (mixed sources or a reset)"
#: The OK/ALERT boundary when the config names none (``[alerts] hit_rate_threshold``).
DEFAULT_THRESHOLD = 0.5
ALERT_HINT = "check the top of the prompt"


def hit_status(cached_tokens: int, prompt_tokens: int, threshold: float) -> str:
    """OK when ``cached >= threshold x prompt`` (tokens), ALERT below, NO DATA without prompt
    tokens, INCONSISTENT when ``cached > prompt`` (never OK)."""
    if int(prompt_tokens) <= 0:
        return NO_DATA
    if int(cached_tokens) > int(prompt_tokens):
        return INCONSISTENT
    return OK if int(cached_tokens) >= threshold * int(prompt_tokens) else ALERT


def status_of(cached_tokens: int, prompt_tokens: int, *, threshold: float,
              min_query_tokens: int = 1, stale: bool = False) -> str:
    """The status of one line, in the module's order: ALERT when under the threshold (stale or
    not), else STALE, then NO DATA (fewer than ``min_query_tokens`` prompt tokens), then OK."""
    if int(prompt_tokens) < min_query_tokens or int(prompt_tokens) <= 0:
        base = NO_DATA
    else:
        base = hit_status(cached_tokens, prompt_tokens, threshold)
    if stale:
        return ALERT if base == ALERT else STALE
    return base


def worst(statuses: Iterable[str]) -> str:
    """The worst status by :data:`SEVERITY` (NO DATA when there is none)."""
    statuses = list(statuses)
    return max(statuses, key=lambda s: SEVERITY[s]) if statuses else NO_DATA


def threshold_for(cfg: AlertsConfig, model: str | None = None) -> float:
    """``per_model_threshold[model]``, else ``hit_rate_threshold`` (fractions).

    Raises:
        ConfigError: a per-model threshold outside [0, 1].
    """
    value = cfg.hit_rate_threshold if model is None else cfg.per_model_threshold.get(
        model, cfg.hit_rate_threshold)
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"alerts.per_model_threshold.{model}: {value} is not a fraction in [0, 1]")
    return float(value)


def format_report_line(cached_tokens: int, prompt_tokens: int, threshold: float) -> tuple[str, str]:
    """(status, text) of one OK/ALERT/INCONSISTENT report line; status ALERT when cached /
    prompt < threshold, INCONSISTENT when cached > prompt (the text says why).

    Raises:
        ValueError: prompt_tokens is not positive.
    """
    if prompt_tokens <= 0:
        raise ValueError("a report line needs prompt tokens")
    status = hit_status(cached_tokens, prompt_tokens, threshold)
    text = (f"{int(cached_tokens):,} of {int(prompt_tokens):,} prompt tokens from cache "
            f"({fmt_share_vs(cached_tokens, prompt_tokens, threshold)}): {status}")
    if status == ALERT:
        text += f": {ALERT_HINT}"
    elif status == INCONSISTENT:
        text += f": {INCONSISTENT_HINT}"
    return status, text


class SilentSource(Protocol):
    """What a STALE line names of a source (e.g. :class:`prefixscope.alerts.daily.StaleSource`)."""

    instance: str
    last_ts_unix_s: float
    median_gap_s: float | None


def report_line(cached_tokens: int, prompt_tokens: int, status: str, *, threshold: float,
                min_query_tokens: int = 1, stale: Sequence[SilentSource] = (),
                zone: tzinfo | None = None) -> str:
    """The report line of any status.

    OK and ALERT are :func:`format_report_line`'s text (the line ``prefixscope report``
    prints); NO DATA names the volume guard; STALE names each silent source and its last
    scrape (local time in ``zone``, default UTC).
    """
    if status in (OK, ALERT, INCONSISTENT):
        fstatus, text = format_report_line(cached_tokens, prompt_tokens, threshold)
        assert fstatus == status, (fstatus, status)
        if stale:  # ALERT and a silent source: say both
            text += "; also STALE: " + _silent(stale, zone)
        return text
    head = f"{int(cached_tokens):,} of {int(prompt_tokens):,} prompt tokens from cache"
    if prompt_tokens > 0:
        head += f" ({fmt_share(cached_tokens, prompt_tokens)})"
    if status == NO_DATA:
        return f"{head}: NO DATA: under {min_query_tokens:,} prompt tokens in the day"
    assert status == STALE, status
    return f"{head}: STALE: " + _silent(stale, zone)


def _silent(stale: Sequence[SilentSource], zone: tzinfo | None) -> str:
    parts = []
    for s in stale:
        last = datetime.fromtimestamp(s.last_ts_unix_s, tz=zone or _utc())
        every = f", scraped every {s.median_gap_s:g} s before" if s.median_gap_s else ""
        parts.append(f"no scrape from {s.instance} after {last:%Y-%m-%d %H:%M}{every}")
    return "; ".join(parts)


def _utc() -> tzinfo:
    from datetime import timezone

    return timezone.utc


def uncounted_note(requests: int, prompt_tokens: int, *, counters_hit: int | None = None,
                   counters_query: int | None = None, per_request_cached: int | None = None,
                   per_request_prompt: int | None = None) -> str | None:
    """The reason printed beside a hit rate when the counters and the per-request figure of the
    same traffic differ because of gateway-rejected requests (None when there are none).

    vLLM leaves a request sent with ``skip_reading_prefix_cache`` (a gateway rejection) out of
    ``prefix_cache_queries``/``hits``; the per-request figure counts its prompt tokens (cached
    0). Both figures are named when given: ``counters 714,720 of 839,952 (85.1%), per request
    714,720 of 1,032,930 (69.2%): vLLM's counters leave out the 192,978 prompt tokens of 57
    rejected requests (sent with skip_reading_prefix_cache)``.
    """
    if requests <= 0 or prompt_tokens <= 0:
        return None
    parts = []
    if counters_hit is not None and counters_query:
        parts.append(f"counters {counters_hit:,} of {counters_query:,} "
                     f"({counters_hit / counters_query:.1%})")
    if per_request_cached is not None and per_request_prompt:
        parts.append(f"per request {per_request_cached:,} of {per_request_prompt:,} "
                     f"({per_request_cached / per_request_prompt:.1%})")
    head = (", ".join(parts) + ": ") if parts else ""
    noun = "request" if requests == 1 else "requests"
    return (f"{head}vLLM's counters leave out the {prompt_tokens:,} prompt tokens of {requests:,} "
            f"rejected {noun} (sent with skip_reading_prefix_cache), the per-request figure "
            "counts them")


def uncounted_note_of(figures: dict[str, int]) -> str | None:
    """:func:`uncounted_note` of the dict of
    ``prefixscope.store.queries.requests.counters_and_requests``; None when the selection has
    no counters (nothing to leave out: the per-request figure is the only one)."""
    if not figures["counter_query_tokens"]:
        return None
    return uncounted_note(figures["uncounted_requests"], figures["uncounted_prompt_tokens"],
                          counters_hit=figures["counter_hit_tokens"],
                          counters_query=figures["counter_query_tokens"],
                          per_request_cached=figures["request_cached_tokens"],
                          per_request_prompt=figures["request_prompt_tokens"])
