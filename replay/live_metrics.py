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
    """Sum each named counter over all its series (labels) in one exposition.

    Names are as exposed (``..._total``). Uses prometheus_client's parser; a counter absent from
    the exposition is absent from the result.
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(names)
    totals: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in wanted:
                totals[s.name] = totals.get(s.name, 0.0) + float(s.value)
    return totals


def counter_deltas(before: str, after: str,
                   names: Sequence[str] = DELTA_COUNTERS) -> dict[str, float]:
    """Run-scoped increase of each counter between two expositions of the same server.

    ``after - before``; a drop means the server restarted during the run, and the increase then
    counts from zero (``after``), as for any Prometheus counter. A counter missing from either
    exposition is left out.
    """
    b, a = counter_totals(before, names), counter_totals(after, names)
    out: dict[str, float] = {}
    for name in names:
        if name in a and name in b:
            out[name] = a[name] - b[name] if a[name] >= b[name] else a[name]
    return out


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

