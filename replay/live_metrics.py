"""Live replay, ``/metrics`` side: scrape a server and turn a before/after pair of expositions
into run-scoped counter deltas.

vLLM's counters are cumulative since the server started; a drop between the two scrapes is a
restart and the increase counts from the new value (as for any Prometheus counter). The
counters can lag the last answer, so :func:`wait_for_counters` polls until they caught up.
Talks HTTP (httpx); no DuckDB.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import httpx

from prefixscope.core.errors import SourceUnavailable

# Counters whose run-scoped deltas are stored (vLLM 0.32/0.33 names as exposed, tokens unless
# noted; vllm/v1/metrics/loggers.py).
DELTA_COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",  # preemptions, not tokens
    "vllm:request_success_total",  # requests, summed over finished_reason
)



def scrape_metrics(base_url: str, *, timeout_s: float = 10.0,
                   api_key: str | None = None) -> tuple[str, float]:
    """GET ``{base_url}/metrics``; returns (exposition text, scrape time in Unix seconds).

    Raises:
        SourceUnavailable: the endpoint cannot be read (names the URL and the reason).
    """
    url = base_url.rstrip("/") + "/metrics"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url, timeout=timeout_s, headers=headers)
        r.raise_for_status()
    except httpx.HTTPError as exc:
        raise SourceUnavailable(f"{url}: cannot scrape ({type(exc).__name__}: {exc})") from exc
    return r.text, time.time()


def counter_totals(text: str, names: Sequence[str] = DELTA_COUNTERS) -> dict[str, float]:
    """Sum each named counter over all its series (labels) in one exposition (a display
    figure: cumulative since the server started; never differenced, see
    :func:`counter_deltas`).

    Names are as exposed (``..._total``). Uses prometheus_client's parser; a counter absent from
    the exposition is absent from the result.
    """
    totals: dict[str, float] = {}
    for name, _labels, value in _series(text, names)[0]:
        totals[name] = totals.get(name, 0.0) + value
    return totals


def _series(text: str, names: Sequence[str]
            ) -> tuple[list[tuple[str, str, float]], dict[tuple[str, str], float]]:
    """``([(counter, labels JSON, value)], {(counter, labels JSON): created time})``."""
    import json

    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(names)
    created_of = {n.removesuffix("_total") + "_created": n for n in names}
    values: list[tuple[str, str, float]] = []
    created: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = json.dumps(dict(sorted(s.labels.items())), separators=(",", ":"))
            if s.name in wanted:
                values.append((s.name, labels, float(s.value)))
            elif s.name in created_of:
                created[(created_of[s.name], labels)] = float(s.value)
    return values, created


def counter_deltas(before: str, after: str,
                   names: Sequence[str] = DELTA_COUNTERS, *,
                   before_ts_unix_s: float | None = None,
                   after_ts_unix_s: float | None = None) -> dict[str, float]:
    """Run-scoped increase of each counter between two expositions of the same server.

    Per series (labels: engine, model_name, finished_reason, ...) by the store's rule
    (:func:`prefixscope.store.queries.metrics.increases_of_samples`, docs/metrics.md rules 1-2):
    ``after - before``, or ``after`` when it dropped (a restart during the run), then summed
    over the series, so a reset of one engine is never hidden by another's growth. With the
    scrape times given, a series whose ``_created`` time lies inside the run (a restart, or a
    series the run's traffic created) gets a zero at that time, as the store's created-zero
    rule: its increase counts from 0 even when it grew past its old value. A series seen in
    only one exposition otherwise has no increase. A counter missing from either exposition is
    left out.
    """
    from prefixscope.store.queries.metrics import increases_of_samples

    t_before = 0.0 if before_ts_unix_s is None else before_ts_unix_s
    t_after = t_before + 1.0 if after_ts_unix_s is None else after_ts_unix_s
    b_values, _ = _series(before, names)
    a_values, a_created = _series(after, names)
    samples = [(n, lab, t_before, v) for n, lab, v in b_values]
    samples += [(n, lab, t_after, v) for n, lab, v in a_values]
    for n, lab, _ in a_values:
        c = a_created.get((n, lab))
        if c is not None and before_ts_unix_s is not None and t_before < c < t_after:
            samples.append((n, lab, c, 0.0))  # the process started inside the run
    in_both = {n for n, _, _ in b_values} & {n for n, _, _ in a_values}
    inc = increases_of_samples(samples, [n for n in names if n in in_both])
    return {n: inc.get(n, 0.0) for n in names if n in in_both}


def wait_for_counters(base_url: str, before_text: str, *, prompt_tokens: int,
                      timeout_s: float = 30.0, poll_s: float = 0.5,
                      api_key: str | None = None) -> tuple[str, float, bool]:
    """Scrape until Δ ``vllm:prefix_cache_queries_total`` reaches ``prompt_tokens``.

    vLLM records the counters at admission and exports them with the engine's next stats
    update, so they can lag the last response (vLLM's own end-to-end test polls up to 30 s).

    Returns:
        (exposition text, scrape time in Unix seconds, settled). ``settled`` is False when the
        timeout passed first (the last scrape is returned anyway) or the server has no such
        counter.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        text, ts = scrape_metrics(base_url, api_key=api_key)
        d = counter_deltas(before_text, text, ("vllm:prefix_cache_queries_total",))
        q = d.get("vllm:prefix_cache_queries_total")
        if q is not None and q >= prompt_tokens:
            return text, ts, True
        if q is None or time.monotonic() >= deadline:
            return text, ts, False
        time.sleep(poll_s)

