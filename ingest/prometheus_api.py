"""vLLM counters for a time range from a Prometheus-compatible query API into ``metric_samples``.

Works with anything that serves Prometheus' HTTP API (``/api/v1/query``,
``/api/v1/query_range``): Prometheus, Thanos, Mimir, VictoriaMetrics. Queries go through
prometheus-api-client's :class:`~prometheus_api_client.PrometheusConnect`.

Two modes:

1. **raw** (default): range-vector queries (``{__name__=~"..."}[Nms]`` evaluated at the end of
   each chunk, to the millisecond, :meth:`PrometheusConnect.custom_query`) return every stored sample with
   its own scrape time and value, so the hit rate equals the one computed from direct scrapes of
   the same server (same samples).
2. **step** (``--step``): :meth:`PrometheusConnect.custom_query_range` returns the latest value
   at each step (Prometheus' 5-minute lookback). Times move to the step grid, and a restart
   whose counter outgrows its old value within one step cannot be seen; use it for downsampled
   long-term stores.

The same families as the exposition ingester are kept (:mod:`prefixscope.ingest.exposition`), legacy names
mapped the same way. Labels are kept minus ``job`` and the instance label; ``instance`` is the
value of ``--instance-label`` (default ``instance``). ``<family>_created`` series, which
Prometheus stores as gauges when it scrapes the 0.0.4 text format, become created-zero samples
exactly as in a direct scrape. (A Prometheus that scrapes OpenMetrics may not store them; then
the first sample of each process in the range is the baseline and its tokens are not counted.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
import math
import time
from datetime import datetime, timezone

from prefixscope.core.bounds import MAX_COUNTER_VALUE, TS_MAX_UNIX_S, TS_MIN_UNIX_S
from prefixscope.ingest.bookkeeping import Quarantined
from prefixscope.ingest.exposition import (
    CONFIGURED_KEY,
    CREATED_SPECS,
    SAMPLE_SPECS,
    V0_HIT_RATE_GAUGES,
    ExpositionRead,
    MetricSample,
    ScrapeOutcome,
    REFUSED_LABEL,
    configured_label_key,
    encode_labels,
    instance_for_url,
    normalise_sample,
    read_notes,
    save_samples,
)
from prefixscope.core.errors import NothingIngested, SourceUnavailable

KIND = "prometheus"


def series_selector() -> str:
    """The PromQL selector of every kept sample name and ``_created`` series:
    ``{__name__=~"vllm:(a|b|...)"}`` (names sorted)."""
    names = sorted(set(SAMPLE_SPECS) | set(CREATED_SPECS))
    tails = [n.removeprefix("vllm:") for n in names]
    return '{__name__=~"vllm:(' + "|".join(tails) + ')"}'


def _connect(url: str, timeout_s: float):
    from prometheus_api_client import PrometheusConnect

    return PrometheusConnect(url=url.rstrip("/"), disable_ssl=False, timeout=timeout_s)


def _dt(ts_unix_s: float) -> datetime:
    return datetime.fromtimestamp(ts_unix_s, tz=timezone.utc)


def query_range(url: str, *, start_s: float, end_s: float, step_s: float | None = None,
                timeout_s: float = 30.0) -> list[dict]:
    """Series and values of the kept families over ``[start_s, end_s]`` (one API call).

    Args:
        url: base URL of the API (``http://host:9090``, Thanos/Mimir/VictoriaMetrics prefix).
        start_s, end_s: range, Unix seconds. Raw mode asks for the range to the millisecond
            (Prometheus stores sample times in milliseconds): ``start_s`` down and ``end_s``
            up to a whole millisecond, evaluated at ``end_s`` with a ``[Nms]`` range, the
            ``time`` given with its decimals (the HTTP API takes a Unix time "with optional
            decimal places for sub-second precision"); prometheus-api-client's
            ``get_metric_range_data`` rounded both to whole seconds, so an end of "now" lost up
            to the last half second of samples. Step mode rounds to whole seconds (the
            library's ``custom_query_range``).
        step_s: None for raw samples; else the query_range step in seconds.

    Returns:
        The API's ``result`` list: ``{"metric": {labels, "__name__"}, "values": [[ts, "v"], ...]}``.

    Raises:
        SourceUnavailable: the API cannot be reached or rejects the query.
    """
    import requests
    from prometheus_api_client import PrometheusApiClientException

    con = _connect(url, timeout_s)
    try:
        if step_s is None:
            start_ms, end_ms = math.floor(start_s * 1000), math.ceil(end_s * 1000)
            if end_ms <= start_ms:
                return []
            # a range vector [T - N, T] (Prometheus 3: (T - N, T]) at T = the end, to the ms
            return con.custom_query(f"{series_selector()}[{end_ms - start_ms}ms]",
                                    params={"time": f"{end_ms // 1000}.{end_ms % 1000:03d}"})
        return con.custom_query_range(series_selector(), start_time=_dt(start_s),
                                      end_time=_dt(end_s), step=f"{step_s:g}s")
    except (requests.RequestException, PrometheusApiClientException) as exc:
        raise SourceUnavailable(f"cannot query {url}: {type(exc).__name__}: {exc}") from exc
    finally:
        con.close()


def _number(x) -> float | int:
    """``float(x)`` (a JSON number or the API's decimal string); an int past the DOUBLE range
    (``10**400``) stays an int, for :func:`~prefixscope.ingest.exposition.normalise_sample` to
    quarantine by its bound. Raises TypeError or ValueError when it is not a number."""
    if isinstance(x, int) and not isinstance(x, bool):
        try:
            return float(x)
        except OverflowError:
            return x
    if not isinstance(x, (str, float)):
        raise TypeError("not a number")
    return float(x)


def samples_from_series(result: list[dict], *, location: str, default_instance: str,
                        instance_label: str = "instance", ts_unix_s: float | None = None,
                        step_s: float | None = None,
                        label_key: bytes | None = None, first_line: int = 1) -> ExpositionRead:
    """Turn API series into stored samples (pure), with created-zero samples.

    Labels outside ``prefixscope.ingest.exposition.ALLOWED_LABELS`` are digested with ``label_key`` or the
    series is quarantined, as for direct scrapes.

    A ``<family>_created`` series gives one created-zero sample per distinct created time ``C``
    for every series of that family with the same labels (``le`` aside) and instance, when the
    series has a sample after that time. Raw samples: the zero is placed at ``C``. Step samples
    (``step_s``): values sit on the step grid, so the old process's last value can be reported
    at steps after ``C`` (when Prometheus saw no failed scrape in between); the zero is then
    placed at ``max(C, S - step_s / 2)``, where ``S`` is the first step that shows ``C``: after
    every step of the old process and before the new process's first value.

    A quarantined sample's ``line`` is its ordinal in the answer (1-based, series after
    series, from ``first_line``: a later chunk of the same source goes on counting), and its
    reason names it: ``... (series S, sample N)``, both 1-based, so every quarantined sample
    is its own row (the quarantine key is source and line).

    Returns:
        An :class:`~ingest.exposition.ExpositionRead` (``lines`` = number of series).
    """
    problems: list[Quarantined] = []
    created: dict[tuple[str, str, str], dict[float, float]] = {}  # C -> first step showing C
    kept: list[tuple] = []
    saw_v0 = False
    base = first_line
    for si, series in enumerate(result):
        labels = {k: str(v) for k, v in series.get("metric", {}).items()}
        name = labels.pop("__name__", "")
        instance = labels.get(instance_label) or default_instance
        for drop in ("job", instance_label):
            labels.pop(drop, None)
        values = series.get("values") or []
        line0, base = base, base + len(values)
        labels_json = None
        # once a sample of the series is kept, the label rules of normalise_sample (1-3) hold
        # for all its samples (same name, same labels): the others need only the time and value
        # rules (3-4), checked inline; a sample failing them goes through normalise_sample for
        # its reason. Same samples, same quarantine, about 3x faster on a long range.
        fast: tuple | None = None
        for j, (ts, v) in enumerate(values):
            try:
                value, at = _number(v), _number(ts)
            except (TypeError, ValueError):
                problems.append(Quarantined(location, line0 + j, "value or time is not a number"
                                            f" (series {si + 1}, sample {j + 1})",
                                            name if name in SAMPLE_SPECS else None))
                continue
            if fast is not None and TS_MIN_UNIX_S <= at < TS_MAX_UNIX_S \
                    and isinstance(value, float) and math.isfinite(value) and (0 <= value <= MAX_COUNTER_VALUE or not fast[2]) \
                    and (not fast[3] or 0 <= value <= 1):
                kept.append((*fast[0], float(at), value, name))
                continue
            verdict = normalise_sample(name, labels, value, at, label_key=label_key)
            if verdict.reason is not None:
                problems.append(Quarantined(location, line0 + j, f"{verdict.reason} (series "
                                            f"{si + 1}, sample {j + 1})", verdict.field))
                if verdict.reason == REFUSED_LABEL:
                    break  # the whole series carries the label
                continue
            at, value = verdict.ts_unix_s, verdict.value
            if verdict.created is not None:
                family, sans_le = verdict.created
                seen = created.setdefault((family, sans_le, instance), {})
                seen[value] = min(at, seen.get(value, math.inf))
                continue
            spec = verdict.spec
            if spec is None:
                break  # not a kept series
            if name in V0_HIT_RATE_GAUGES:
                saw_v0 = True
            if labels_json is None:
                labels_json = encode_labels(verdict.labels)
            head = (spec, labels_json, instance, verdict.labels.get("model_name"),
                    verdict.labels.get("engine"))
            kept.append((*head, at, value, name))
            fast = (head, None, spec.kind in ("counter", "histogram"),
                    spec.metric == "vllm:kv_cache_usage_perc")
    by_key: dict[tuple, MetricSample] = {}
    last_ts: dict[tuple, float] = {}
    for spec, labels_json, instance, model, engine, ts, value, name in kept:
        key = (spec.metric, labels_json, instance, ts)
        prior = by_key.get(key)
        if prior is not None and not prior.legacy:
            continue
        by_key[key] = MetricSample(spec.metric, labels_json, instance, model, engine, ts, value,
                                   name, spec.legacy, False)
        skey = (spec, labels_json, instance, model, engine, name)
        last_ts[skey] = max(ts, last_ts.get(skey, ts))
    zeros: dict[tuple, MetricSample] = {}
    for (spec, labels_json, instance, model, engine, name), latest in last_ts.items():
        if spec.kind not in ("counter", "histogram"):
            continue
        sans_le = encode_labels(json.loads(labels_json), drop=("le",))
        for c, first_seen in created.get((spec.family, sans_le, instance), {}).items():
            at = c if step_s is None else max(c, first_seen - step_s / 2)
            if at < latest and (spec.metric, labels_json, instance, at) not in by_key:
                zeros[(spec.metric, labels_json, instance, at)] = MetricSample(
                    spec.metric, labels_json, instance, model, engine, at, 0.0, name,
                    spec.legacy, True)
    samples = tuple(zeros.values()) + tuple(by_key.values())
    notes = read_notes(samples, saw_v0=saw_v0, nothing="no vLLM prefix-cache series in this range")
    return ExpositionRead(location, default_instance,
                          time.time() if ts_unix_s is None else ts_unix_s, samples,
                          tuple(problems), tuple(notes), len(result))


def _merge(a, b):
    from prefixscope.ingest.bookkeeping import IngestSummary

    if a is None:
        return b
    notes = []
    for n in (a.note, b.note):
        for part in (n or "").split("; "):
            if part and part not in notes:
                notes.append(part)
    return IngestSummary(a.source, a.kind, a.rows_read + b.rows_read, a.rows_added + b.rows_added,
                         a.rows_duplicate + b.rows_duplicate,
                         a.rows_quarantined + b.rows_quarantined, "; ".join(notes) or None)


def ingest_prometheus_range(db_path: str, url: str, *, start_s: float, end_s: float,
                            step_s: float | None = None, instance_label: str = "instance",
                            chunk_s: float = 3600.0, timeout_s: float = 30.0,
                            label_key: bytes | None | str = CONFIGURED_KEY,
                            raise_when_nothing: bool = True) -> ScrapeOutcome:
    """Pull ``[start_s, end_s]`` from a Prometheus-compatible API and store it, chunk by chunk.

    ``raise_when_nothing=False`` returns even when nothing was kept (the CLI prints the
    quarantined series first, then raises :func:`range_nothing_error`).

    Each chunk (``chunk_s`` seconds, default 1 h) is one query and one short write transaction;
    chunk edges may return a sample twice (Prometheus 2 ranges are closed) and the primary key
    keeps it once. Running it again over the same range adds nothing.

    Args:
        db_path: DuckDB file.
        url: base URL of the query API.
        start_s, end_s: range, Unix seconds.
        step_s: None for raw samples (exact), else sample every ``step_s`` seconds.
        instance_label: label naming the vLLM instance (dropped from the stored labels).
        chunk_s: seconds per query.
        label_key: HMAC key for labels outside the allowlist (None: quarantine them); default
            the configured key (``prefixscope.ingest.exposition.configured_label_key``), read once.

    Returns:
        One :class:`~ingest.exposition.ScrapeOutcome` for the whole range.

    Raises:
        SourceUnavailable: the API cannot be reached or rejects the query.
        NothingIngested: no kept series in the range.
        ConfigError: a configured HMAC key cannot be read (before the first query).
    """
    from prefixscope.store import db as store_db

    if chunk_s <= 0:
        raise ValueError("chunk_s must be > 0")
    key = configured_label_key() if label_key == CONFIGURED_KEY else label_key
    default_instance = instance_for_url(url)
    total = None
    problems: list[Quarantined] = []
    lo = float(start_s)
    line = 1  # quarantine lines go on counting across chunks (one source, one key space)
    while lo < end_s:
        hi = min(float(end_s), lo + chunk_s)
        result = query_range(url, start_s=lo, end_s=hi, step_s=step_s, timeout_s=timeout_s)
        read = samples_from_series(result, location=url, default_instance=default_instance,
                                   instance_label=instance_label, step_s=step_s,
                                   label_key=key, first_line=line)
        line += sum(len(r.get("values") or []) for r in result)
        if read.samples or read.problems:
            with store_db.writer(db_path) as con:
                total = _merge(total, save_samples(con, read, kind=KIND))
            problems.extend(read.problems)
        lo = hi
    if total is None:
        from prefixscope.ingest.bookkeeping import IngestSummary

        total = IngestSummary(url, KIND, 0, 0, 0, 0, None)
    outcome = ScrapeOutcome(total, tuple(problems))
    if raise_when_nothing and total.rows_read == 0:
        raise range_nothing_error(outcome, start_s=start_s, end_s=end_s)
    return outcome


def range_nothing_error(outcome: ScrapeOutcome, *, start_s: float, end_s: float
                        ) -> NothingIngested:
    """The error of a Prometheus range that kept no sample: how many series were quarantined
    and the first (``url:line: field: reason``), or that the range has no prefix-cache series."""
    from prefixscope.core.errors import problem_text

    s = outcome.summary
    if outcome.problems:
        q = outcome.problems[0]
        return NothingIngested(
            f"nothing could be read: {s.source}: every series quarantined "
            f"({s.rows_quarantined:,}; the first: "
            f"{problem_text(q.location, q.line, q.reason, q.field)})")
    return NothingIngested(
        f"nothing could be read: {s.source} has no vLLM prefix-cache series between "
        f"{_dt(start_s).isoformat()} and {_dt(end_s).isoformat()}")


#: The reason for an empty saved answer (the word of the JSONL ingesters' note).
EMPTY_FILE = ("empty file (a saved answer is the JSON body of /api/v1/query_range or "
              "/api/v1/query)")


def read_query_range_file(path: str) -> list[dict]:
    """The ``data.result`` series of a saved Prometheus ``/api/v1/query_range`` (or range-vector
    ``/api/v1/query``) response body, a JSON file (``curl .../api/v1/query_range?... > FILE``).

    Raises:
        SourceUnavailable: the file cannot be read. ParseError: empty (``empty file``), not
            JSON, not a successful response, or its ``resultType`` is not ``matrix``.
    """
    import os
    import stat

    from prefixscope.core.documents import load_json_file
    from prefixscope.core.errors import ParseError

    try:
        st = os.stat(path)
    except OSError:
        st = None  # load_json_file names why it cannot be read
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == 0:
        raise ParseError(str(path), None, EMPTY_FILE)
    doc = load_json_file(path)
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict) or doc.get("status") != "success":
        raise ParseError(str(path), None, "not a successful Prometheus API response", "$.status")
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise ParseError(str(path), None, "resultType is not 'matrix'", "$.data.resultType")
    return data["result"]


def ingest_query_range_file(con, path: str, *, instance_label: str = "instance",
                            label_key: bytes | None | str = CONFIGURED_KEY,
                            step_s: float | None = None):
    """Store a saved Prometheus range response on a read-write connection.

    The recorded-file form of :func:`ingest_prometheus_range`: the same series rules
    (:func:`samples_from_series`, created-zero samples from ``_created`` series), one
    transaction; running it again adds nothing. Series without the instance label get the
    file name stem as instance.

    Args:
        con: a read-write DuckDB connection.
        path: the saved response body (JSON).
        instance_label: the label that names the vLLM instance.
        label_key: HMAC key for labels outside the allowed set (default: the configured one).
        step_s: the ``step`` of the saved ``/api/v1/query_range`` answer, seconds (created-zero
            placement on the step grid, as :func:`samples_from_series`), or None for raw
            samples (a range-vector ``/api/v1/query`` answer).

    Returns:
        The :class:`~ingest.bookkeeping.IngestSummary`.

    Raises:
        SourceUnavailable, ParseError: from :func:`read_query_range_file`. ConfigError: a
        configured HMAC key cannot be read.
    """
    return _save_query_range(con, _read_query_range(path, instance_label=instance_label,
                                                    label_key=label_key, step_s=step_s)).summary


def _read_query_range(path: str, *, instance_label: str, label_key, step_s: float | None):
    from pathlib import Path

    key = configured_label_key() if label_key == CONFIGURED_KEY else label_key
    result = read_query_range_file(path)
    return samples_from_series(result, location=str(path), default_instance=Path(path).stem,
                               instance_label=instance_label, step_s=step_s, label_key=key)


def _save_query_range(con, read) -> ScrapeOutcome:
    return ScrapeOutcome(save_samples(con, read, kind=KIND), read.problems)


def ingest_query_range_files(db_path: str, paths: Sequence[str], *,
                             instance_label: str = "instance", step_s: float | None = None,
                             label_key: bytes | None | str = CONFIGURED_KEY,
                             raise_when_nothing: bool = True,
                             ) -> tuple[list[ScrapeOutcome], list[str]]:
    """``prefixscope ingest query-range FILE...``: every saved Prometheus range response of
    ``paths`` through :func:`ingest_query_range_file`'s rules, each in its own short write
    transaction (as ``ingest metrics`` stores each saved scrape).

    Args:
        db_path: the DuckDB file (created and migrated when absent).
        paths: saved ``/api/v1/query_range`` (or range-vector ``/api/v1/query``) bodies.
        instance_label, step_s, label_key: as :func:`ingest_query_range_file`.
        raise_when_nothing: False returns even when nothing was kept (the caller reports the
            outcomes, then raises :func:`~prefixscope.ingest.exposition.nothing_error`).

    Returns:
        ``(outcomes, errors)``: one :class:`ScrapeOutcome` per readable file in the given order
        (its quarantined series in ``problems``), and one ``file: reason`` message per file that
        could not be read or is not a successful matrix answer.

    Raises:
        NothingIngested: no file gave a single kept sample (the message lists each reason).
        ConfigError: a configured HMAC key cannot be read (before any file is read).
    """
    from prefixscope.core.errors import ParseError
    from prefixscope.ingest.exposition import nothing_error
    from prefixscope.store import db as store_db

    key = configured_label_key() if label_key == CONFIGURED_KEY else label_key
    outcomes: list[ScrapeOutcome] = []
    errors: list[str] = []
    for path in paths:
        try:
            read = _read_query_range(path, instance_label=instance_label, label_key=key,
                                     step_s=step_s)
        except (SourceUnavailable, ParseError) as exc:
            errors.append(str(exc))
            continue
        with store_db.writer(db_path) as con:
            outcomes.append(_save_query_range(con, read))
    if raise_when_nothing and not any(o.summary.rows_read > 0 for o in outcomes):
        raise nothing_error(outcomes, errors)
    return outcomes, errors
