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
  reads ALERT under a 0.5 threshold); ALERT adds a hint, :func:`alert_hint`: ``: check the
  top of the prompt``, naming the top breaker of a stored diagnosis when there is one, else
  what the gateway's decision log says of the misses (rejections after a cache-epoch bump or
  a revocation, accepts not served) before it suggests the prompt; a stored miss ledger of
  the model adds its largest loss class (:func:`loss_hint`). Every place that prints
  the hint (``prefixscope report``, the daily report, its email, the Alerts page, Overview's
  "Why") takes it from :class:`AlertHints` (built by
  :func:`prefixscope.store.queries.alerts.alert_hints`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any, Protocol

from prefixscope.core.config import AlertsConfig
from prefixscope.core.errors import ConfigError
from prefixscope.core.formatting import fmt_pct, fmt_share, fmt_share_vs

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


def format_report_line(cached_tokens: int, prompt_tokens: int, threshold: float,
                       hint: str = ALERT_HINT) -> tuple[str, str]:
    """(status, text) of one OK/ALERT/INCONSISTENT report line; status ALERT when cached /
    prompt < threshold (the text ends ``: ALERT: <hint>``, :func:`alert_hint`), INCONSISTENT
    when cached > prompt (the text says why).

    Raises:
        ValueError: prompt_tokens is not positive.
    """
    if prompt_tokens <= 0:
        raise ValueError("a report line needs prompt tokens")
    status = hit_status(cached_tokens, prompt_tokens, threshold)
    text = (f"{int(cached_tokens):,} of {int(prompt_tokens):,} prompt tokens from cache "
            f"({fmt_share_vs(cached_tokens, prompt_tokens, threshold)}): {status}")
    if status == ALERT:
        text += f": {hint}"
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
                zone: tzinfo | None = None, hint: str = ALERT_HINT) -> str:
    """The report line of any status.

    OK and ALERT are :func:`format_report_line`'s text (the line ``prefixscope report``
    prints; ``hint`` after ALERT, :func:`alert_hint`); NO DATA names the volume guard; STALE names each silent source and its last
    scrape (local time in ``zone``, default UTC).
    """
    if status in (OK, ALERT, INCONSISTENT):
        fstatus, text = format_report_line(cached_tokens, prompt_tokens, threshold, hint)
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


def breaker_hint(b: Mapping[str, object]) -> str:
    """Where the top breaker of a diagnosis is, in words (no prompt text): ``top breaker:
    timestamp on line 5 of message 0 (system), see prefixscope diagnose``; ``b`` is a row of
    ``prefixscope.store.queries.breakers.top_breaker_by_model``."""
    kind = str(b.get("kind")).replace("_", " ")
    if b.get("segment") == "message":
        where = f" on line {b.get('line')} of message {b.get('message_index')} ({b.get('role')})"
    elif b.get("segment") == "tools":
        where = " in the tools list"
    elif b.get("segment") == "template":
        where = f" in the template before message {b.get('message_index')}"
    else:
        where = ""
    return f"top breaker: {kind}{where}, see prefixscope diagnose"


#: The ledger's loss classes in the hint's words (``store.queries.ledger.LOSS_CLASSES``).
_LOSS_WORDS = {"granularity": "engine granularity", "routing": "routing",
               "capacity": "capacity", "isolation": "isolation",
               "prompt_change": "prompt change", "cold": "cold"}


def loss_hint(loss: Mapping[str, object]) -> str:
    """The largest loss class of a model's newest stored miss ledger, in words:
    ``largest loss: routing (46.6% of missed)``; ``loss`` is a value of
    ``prefixscope.store.queries.ledger.largest_loss_by_model`` (``class``,
    ``share_of_missed`` a fraction in [0, 1])."""
    cls = str(loss.get("class"))
    share = loss.get("share_of_missed")
    pct = fmt_pct(share if isinstance(share, (int, float)) else None)
    return f"largest loss: {_LOSS_WORDS.get(cls, cls.replace('_', ' '))} ({pct} of missed)"


#: What a rejection's first mismatching field means, in the hint's words (fields of
#: ``prefixscope.core.identity``; the Rejections page names the same fields).
_AFTER = {"cache_epoch": "a cache-epoch bump", "authorization_epoch": "a revocation",
          "scope": "a scope mismatch", "namespace": "a namespace mismatch",
          "salt": "a salt mismatch", "content_digest": "a content-digest collision"}


def _after(reason: str) -> str:
    return _AFTER.get(reason, f"a {reason.replace('_', ' ')} change")


@dataclass(frozen=True, slots=True)
class MissCauses:
    """What the gateway's decision log says of the misses of a model (or a model and scope)
    over a range: requests the gateway decided and the engine served (refused ones left out,
    as on the Scopes and Rejections pages) that did not get the cache's reuse.

    Attributes:
        ordinary: decision ``miss`` (no candidate object: the prompt's prefix was new).
        rejects: ``(first mismatching field, requests)`` of decision ``reject`` (a candidate
            refused: served as a miss), most first, then by field.
        unserved_accepts: ``accept`` decisions of the gateway's shadow mode (forwarded with a
            salt unique to the request, ``salt_applied`` false), which the engine could not
            serve.
        bypassed: ``accept`` decisions sent while the cache bypass was on (``bypass`` true,
            ``/admin/bypass``: forwarded isolated, nothing accepted for use).
    """

    ordinary: int = 0
    rejects: tuple[tuple[str, int], ...] = ()
    unserved_accepts: int = 0
    bypassed: int = 0

    @property
    def rejected(self) -> int:
        """Rejected requests (all fields)."""
        return sum(n for _, n in self.rejects)

    @property
    def misses(self) -> int:
        """Every miss the log names: ordinary + rejected + accepts not served (shadow mode
        or bypass)."""
        return self.ordinary + self.rejected + self.unserved_accepts + self.bypassed

    def __add__(self, other: "MissCauses") -> "MissCauses":
        by: dict[str, int] = dict(self.rejects)
        for reason, n in other.rejects:
            by[reason] = by.get(reason, 0) + n
        return MissCauses(self.ordinary + other.ordinary,
                          tuple(sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))),
                          self.unserved_accepts + other.unserved_accepts,
                          self.bypassed + other.bypassed)


def alert_hint(causes: MissCauses | None = None,
               top_breaker: Mapping[str, object] | None = None,
               largest_loss: Mapping[str, object] | None = None) -> str:
    """The words after ``ALERT: `` on a report line (the one rule for every place that prints
    it, docs/alerts.md "The hint").

    - A stored diagnosis of the model (``top_breaker``) wins: ``check the top of the prompt
      (top breaker: timestamp on line 1 of message 0 (system), see prefixscope diagnose)``.
    - Else, when the decision log (``causes``) has rejections or accepts not served, it names
      them first, with the rejections by first mismatching field as the Rejections page
      shows them, then points at the prompt for the ordinary misses only: ``4 of 13 misses
      were gateway rejections after a cache-epoch bump or a revocation (cache_epoch 3,
      authorization_epoch 1) and 1 sent with the cache bypass on, per the decision log; for
      the other 8: check the top of the prompt``. Shadow-mode accepts (forwarded with a salt
      unique to the request) read ``N accepts not served (shadow mode)``.
    - Else :data:`ALERT_HINT`.

    A stored miss ledger of the model (``largest_loss``, a value of
    ``store.queries.ledger.largest_loss_by_model``) adds its largest loss class, inside the
    parentheses of the top breaker (``(top breaker: ..., see prefixscope diagnose; largest
    loss: prompt change (81.0% of missed))``) or after the other hints (``check the top of the
    prompt (largest loss: routing (78.0% of missed))``; ``...; largest loss: ...`` after the
    decision log's words).
    """
    loss = None if largest_loss is None else loss_hint(largest_loss)
    if top_breaker is not None:
        extra = f"; {loss}" if loss else ""
        return f"{ALERT_HINT} ({breaker_hint(top_breaker)}{extra})"
    if causes is None or not (causes.rejected or causes.unserved_accepts or causes.bypassed):
        return f"{ALERT_HINT} ({loss})" if loss else ALERT_HINT
    said = []
    if causes.rejected:
        afters = list(dict.fromkeys(_after(r) for r, _ in causes.rejects))
        after = afters[0] if len(afters) == 1 else ", ".join(afters[:-1]) + " or " + afters[-1]
        fields = ", ".join(f"{r} {n:,}" for r, n in causes.rejects)
        what = ("a gateway rejection" if causes.rejected == 1 else "gateway rejections")
        said.append((causes.rejected, f"{what} after {after} ({fields})"))
    if causes.unserved_accepts:
        n = causes.unserved_accepts
        said.append((n, ("an accept" if n == 1 else "accepts") + " not served (shadow mode)"))
    if causes.bypassed:
        said.append((causes.bypassed, "sent with the cache bypass on"))
    (n0, w0), rest = said[0], said[1:]
    verb = "was" if n0 == 1 else "were"
    text = f"{n0:,} of {causes.misses:,} misses {verb} {w0}"
    text += "".join(f" and {n:,} {w}" for n, w in rest) + ", per the decision log"
    if causes.ordinary:
        text += f"; for the other {causes.ordinary:,}: {ALERT_HINT}"
    return text + (f"; {loss}" if loss else "")


@dataclass(frozen=True, slots=True)
class AlertHints:
    """The hints of one range: built by :func:`prefixscope.store.queries.alerts.alert_hints`.

    Attributes:
        top_breakers: model -> the rank-1 breaker of its newest stored diagnosis.
        causes: ``(model, scope)`` -> :class:`MissCauses` of the range (scope None: the model
            over all scopes).
        largest_losses: model -> the largest loss class of its newest stored miss ledger
            (``store.queries.ledger.largest_loss_by_model``).
    """

    top_breakers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    causes: Mapping[tuple[str, str | None], MissCauses] = field(default_factory=dict)
    largest_losses: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def causes_of(self, model: str | None, scope: str | None = None) -> MissCauses | None:
        """The decision log's causes of a model (None: every model summed), or of one scope."""
        if model is None:
            found = [c for (m, s), c in self.causes.items() if s is None]
            if not found:
                return None
            total = MissCauses()
            for c in found:
                total = total + c
            return total
        return self.causes.get((model, scope))

    def hint(self, model: str | None, scope: str | None = None) -> str:
        """:func:`alert_hint` of a report line: a model's (its diagnosis first), one of its
        scopes (the decision log only: a diagnosis is of the model), or the overall line
        (``model`` None: the decision log summed over the models)."""
        breaker = self.top_breakers.get(model) if model is not None and scope is None else None
        loss = self.largest_losses.get(model) if model is not None and scope is None else None
        return alert_hint(self.causes_of(model, scope), breaker, loss)


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
    0). Both figures are named when given: ``counters 641,536 of 856,368 (74.9%), per request
    641,536 of 1,032,930 (62.1%): vLLM's counters leave out the 176,562 prompt tokens of 52
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
