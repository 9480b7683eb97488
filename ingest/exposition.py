"""vLLM ``/metrics`` expositions (Prometheus text format 0.0.4) into ``metric_samples``.

A source is a ``/metrics`` URL (scraped with httpx, once or every N seconds) or a saved
exposition file (stamped with its modification time or a given time). Lines are parsed by
``prometheus_client.parser.text_string_to_metric_families``, **one line at a time**, so that a
malformed line is quarantined with its line number while every good line is kept (the parser
gives up on the whole text at the first bad line).

What is kept (see :data:`COUNTER_FAMILIES`, :data:`HISTOGRAM_FAMILIES`, :data:`GAUGE_FAMILIES`;
names as exposed by vLLM 0.32/0.33, ``vllm/v1/metrics/loggers.py``):

1. Counters (tokens unless noted): ``vllm:prefix_cache_queries_total``, ``..._hits_total``,
   ``vllm:external_prefix_cache_queries_total`` / ``..._hits_total``, ``vllm:prompt_tokens_total``,
   ``vllm:prompt_tokens_by_source_total``, ``vllm:prompt_tokens_cached_total``,
   ``vllm:prompt_tokens_cached_by_source_total``, ``vllm:request_success_total`` (requests),
   ``vllm:num_preemptions_total`` (preemptions).
2. Histograms (``_bucket``, ``_sum``, ``_count``): ``vllm:time_to_first_token_seconds``,
   ``vllm:request_prefill_kv_computed_tokens``, ``vllm:request_prefill_time_seconds``, and the
   KV residency histograms of ``--kv-cache-metrics`` (seconds): ``vllm:kv_block_lifetime_seconds``,
   ``vllm:kv_block_idle_before_evict_seconds``, ``vllm:kv_block_reuse_gap_seconds``.
3. Gauges: ``vllm:kv_cache_usage_perc`` (fraction 0..1), ``vllm:cache_config_info`` (fixed 1;
   the cache configuration is in its labels), ``vllm:num_requests_running`` and
   ``vllm:num_requests_waiting`` (requests).
4. Legacy names (vLLM < 0.11) mapped to the canonical ones with ``legacy=TRUE``:
   ``vllm:gpu_prefix_cache_queries_total``, ``vllm:gpu_prefix_cache_hits_total``,
   ``vllm:gpu_cache_usage_perc``. The V0 gauges ``vllm:gpu_prefix_cache_hit_rate`` and
   ``vllm:cpu_prefix_cache_hit_rate`` are stored under their own names and never used as a hit
   rate. A source that shows legacy names gets the note :data:`LEGACY_NOTE`.

Created-zero samples: prometheus_client exposes each counter's (and histogram's) creation time
as a separate gauge ``<family>_created`` (0.0.4 text format). For every kept counter or
histogram series with a ``_created`` time earlier than the scrape, a sample of value 0 is stored
at the created time with ``created_zero=TRUE``, like Prometheus' created-timestamp zero
ingestion. So the first scrape after a (re)start counts the tokens since the start, and a
restart is seen even when the counter has already grown past its old value. See
``docs/metrics.md#created-zero``.

Labels: every label except ``instance`` and ``job``, as sorted-key JSON; ``model`` and
``engine`` columns come from ``model_name`` and ``engine``. ``instance`` is ``--instance``, or
the URL's host:port, or for a saved file the name of the folder that holds it
(:func:`file_instance`): saved scrapes of one server are one series, whatever their file names,
and :func:`process_overlaps` warns when one command's files look like several processes at once.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import duckdb
from prometheus_client.parser import text_string_to_metric_families

from prefixscope.ingest.bookkeeping import (
    IngestSummary,
    Quarantined,
    new_ingest_run_id,
    record_quarantine,
    record_run,
    source_id_for,
    upsert_source,
)
from prefixscope.ingest.bookkeeping import SourceOutcome as ScrapeOutcome  # one stored scrape
from prefixscope.core.bounds import (
    BINARY_REASON,
    BINARY_SAMPLE_BYTES,
    COUNTER_OVER,
    LINE_TOO_LONG,
    MAX_COUNTER_VALUE,
    MAX_ID_CHARS,
    MAX_LINE_BYTES,
    TIME_RANGE,
    looks_binary,
    time_ok,
)
from prefixscope.core.errors import NothingIngested, SourceUnavailable, StoreLocked
from prefixscope.ingest.privacy import CLOSED_LABELS, OTHER_LABEL_VALUE, closed_label_value
from prefixscope.store.db import DEFAULT_LOCK_TIMEOUT_S
from prefixscope.store.queries.ingest import ingest_transaction

LEGACY_NOTE = "legacy metric names (vllm:gpu_prefix_cache_*): vLLM < 0.11"
V0_GAUGE_NOTE = ("V0 gauge vllm:gpu_prefix_cache_hit_rate stored for reference, never used as "
                 "a hit rate (hit rates come from counter increases)")
NOTHING_NOTE = "no vLLM prefix-cache metrics in this exposition (is it a vLLM /metrics page?)"

#: Counter families (name without ``_total``) kept as they are exposed.
COUNTER_FAMILIES: tuple[str, ...] = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits",
    "vllm:prompt_tokens",
    "vllm:prompt_tokens_by_source",
    "vllm:prompt_tokens_cached",
    "vllm:prompt_tokens_cached_by_source",
    "vllm:request_success",
    "vllm:num_preemptions",
)
#: Histogram families kept with their ``_bucket``, ``_sum`` and ``_count`` series.
HISTOGRAM_FAMILIES: tuple[str, ...] = (
    "vllm:time_to_first_token_seconds",
    "vllm:request_prefill_kv_computed_tokens",
    # prefill throughput for the GPU-time shadow price (docs/pricing.md#gpu-time)
    "vllm:request_prefill_time_seconds",
    # KV residency (vLLM --kv-cache-metrics, sampled by --kv-cache-metrics-sample)
    "vllm:kv_block_lifetime_seconds",
    "vllm:kv_block_idle_before_evict_seconds",
    "vllm:kv_block_reuse_gap_seconds",
)
#: Gauge families kept as they are exposed.
GAUGE_FAMILIES: tuple[str, ...] = ("vllm:kv_cache_usage_perc", "vllm:cache_config_info",
                                   "vllm:num_requests_running", "vllm:num_requests_waiting")
#: Legacy counter families (vLLM < 0.11) -> canonical family.
LEGACY_COUNTERS: dict[str, str] = {
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
}
#: Legacy gauges -> stored name. The V0 hit-rate gauges keep their names (never used).
LEGACY_GAUGES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_hit_rate": "vllm:gpu_prefix_cache_hit_rate",
    "vllm:cpu_prefix_cache_hit_rate": "vllm:cpu_prefix_cache_hit_rate",
}
V0_HIT_RATE_GAUGES = frozenset({"vllm:gpu_prefix_cache_hit_rate", "vllm:cpu_prefix_cache_hit_rate"})

QUERIES_METRIC = "vllm:prefix_cache_queries_total"
HITS_METRIC = "vllm:prefix_cache_hits_total"
EXTERNAL_QUERIES_METRIC = "vllm:external_prefix_cache_queries_total"
EXTERNAL_HITS_METRIC = "vllm:external_prefix_cache_hits_total"
CACHE_CONFIG_METRIC = "vllm:cache_config_info"

_DROPPED_LABELS = frozenset({"instance", "job"})
#: Labels stored as they are: the ones vLLM itself puts on the kept families. Every label of
#: ``vllm:cache_config_info`` is a cache-config field and is kept too. Any other label (a
#: router's or proxy's ``tenant``, ``user``, ``api_key``...) could carry a raw tenant id: it is
#: stored only as an HMAC digest under the server-side key, and without a key the sample is
#: quarantined (privacy rule: no raw tenant id in a metric label, ``docs/ingest.md``).
ALLOWED_LABELS = frozenset({"model_name", "engine", "source", "le", "finished_reason",
                            "quantile", "instance", "job"})
#: Labels whose values are a closed vocabulary (``ingest/privacy.py`` CLOSED_LABELS, engine).
_CLOSED_NAMES = frozenset(CLOSED_LABELS) | {"engine"}
_ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


@dataclass(frozen=True, slots=True)
class _Spec:
    metric: str        # canonical sample name stored
    family: str        # canonical family (the key of its _created time)
    kind: str          # counter, histogram, gauge
    legacy: bool


def _build_specs() -> tuple[dict[str, _Spec], dict[str, tuple[str, bool]]]:
    samples: dict[str, _Spec] = {}
    created: dict[str, tuple[str, bool]] = {}
    for fam in COUNTER_FAMILIES:
        samples[fam + "_total"] = _Spec(fam + "_total", fam, "counter", False)
        created[fam + "_created"] = (fam, False)
    for raw, fam in LEGACY_COUNTERS.items():
        samples[raw + "_total"] = _Spec(fam + "_total", fam, "counter", True)
        created[raw + "_created"] = (fam, True)
    for fam in HISTOGRAM_FAMILIES:
        for suffix in ("_bucket", "_sum", "_count"):
            samples[fam + suffix] = _Spec(fam + suffix, fam, "histogram", False)
        created[fam + "_created"] = (fam, False)
    for fam in GAUGE_FAMILIES:
        samples[fam] = _Spec(fam, fam, "gauge", False)
    for raw, fam in LEGACY_GAUGES.items():
        samples[raw] = _Spec(fam, fam, "gauge", True)
    return samples, created


SAMPLE_SPECS, CREATED_SPECS = _build_specs()


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One stored sample (a row of ``metric_samples``).

    Attributes:
        metric: canonical sample name, e.g. ``vllm:prefix_cache_hits_total``.
        labels: sorted-key JSON of every label but ``instance``/``job`` (``le`` included).
        instance: scrape target host:port, or the name given to a file.
        model: label ``model_name`` (None when absent).
        engine: label ``engine`` (data-parallel rank as a string; None when absent).
        ts_unix_s: scrape time (or the sample's own timestamp), or the counter's created time
            for a created-zero sample; Unix seconds.
        value: sample value (tokens for the token counters; fraction for kv_cache_usage_perc).
        raw_metric: the name as exposed (differs from ``metric`` for legacy names).
        legacy: exposed under a legacy (vLLM < 0.11) name.
        created_zero: a 0 placed at the counter's ``_created`` time.
    """

    metric: str
    labels: str
    instance: str
    model: str | None
    engine: str | None
    ts_unix_s: float
    value: float
    raw_metric: str
    legacy: bool = False
    created_zero: bool = False

    def row(self, source_id: str) -> tuple:
        """The sample as a ``metric_samples`` row (column order of
        :data:`prefixscope.store.queries.metrics.METRIC_SAMPLE_COLUMNS`)."""
        return (self.metric, self.labels, self.instance, self.model, self.engine, self.ts_unix_s,
                self.value, self.raw_metric, self.legacy, self.created_zero, source_id)


@dataclass(frozen=True, slots=True)
class ExpositionRead:
    """The parse of one exposition (one scrape): kept samples, quarantined lines, notes.

    Attributes:
        location: URL or file path as given.
        instance: instance name the samples carry.
        ts_unix_s: scrape time, Unix seconds.
        samples: kept samples, created-zero samples included, in line order.
        problems: malformed or unusable lines (file:line, field, reason).
        notes: user-visible notes (legacy names, V0 gauge, nothing kept).
        lines: number of lines in the exposition.
    """

    location: str
    instance: str
    ts_unix_s: float
    samples: tuple[MetricSample, ...]
    problems: tuple[Quarantined, ...]
    notes: tuple[str, ...]
    lines: int

    @property
    def legacy(self) -> bool:
        """True when any kept sample came from a legacy (vLLM < 0.11) name."""
        return any(s.legacy for s in self.samples)

    @property
    def note(self) -> str | None:
        """The notes joined with ``; `` (None when there are none)."""
        return "; ".join(self.notes) or None


@dataclass(frozen=True, slots=True)
class RawScrape:
    """The text of one source and when it was taken.

    Attributes:
        location: URL or file path as given.
        kind: ``metrics-url`` or ``metrics-file``.
        text: the exposition text.
        ts_unix_s: scrape start time (URL), or the file's mtime or the given time.
        default_instance: host:port of the URL, or the file's folder name (:func:`file_instance`).
    """

    location: str
    kind: str
    text: str
    ts_unix_s: float
    default_instance: str


def is_url(source: str) -> bool:
    """True for ``http://`` and ``https://`` sources."""
    return source.startswith(("http://", "https://"))


def instance_for_url(url: str) -> str:
    """``host:port`` of a URL (port 80/443 by scheme when absent), as Prometheus' ``instance``.

    Raises:
        SourceUnavailable: the URL cannot be parsed (``http://[::1``, a port past 65535).
    """
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise SourceUnavailable(f"cannot read the URL {url}: {exc}") from None
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{host}:{port}"


def _decode(data: bytes) -> str:
    """An exposition's bytes as text; bytes that are not UTF-8 stay lone surrogates
    (``surrogateescape``) so :func:`parse_exposition` quarantines their line with the byte
    (``not UTF-8 text (byte N)``), never a U+FFFD stored in a label."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", "surrogateescape")


def read_source(source: str, *, at_unix_s: float | None = None, timeout_s: float = 10.0,
                client=None) -> RawScrape:
    """Read one exposition: GET a URL (httpx) or read a file.

    Args:
        source: ``http(s)://.../metrics`` or a file path.
        at_unix_s: time to stamp the samples with (default: scrape start for a URL, the file's
            modification time for a file).
        timeout_s: HTTP timeout, seconds.
        client: an ``httpx.Client`` to reuse (a scrape loop keeps one).

    Returns:
        A :class:`RawScrape`.

    Raises:
        SourceUnavailable: the URL did not answer 200, or the file cannot be read (the message
            names the source and why).
    """
    if is_url(source):
        import httpx

        ts = time.time() if at_unix_s is None else at_unix_s
        try:
            if client is not None:
                resp = client.get(source, headers={"Accept": _ACCEPT}, timeout=timeout_s)
            else:
                resp = httpx.get(source, headers={"Accept": _ACCEPT}, timeout=timeout_s)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL is no HTTPError
            raise SourceUnavailable(f"cannot scrape {source}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise SourceUnavailable(f"cannot scrape {source}: HTTP {resp.status_code}")
        if len(resp.content) > MAX_EXPOSITION_BYTES:
            raise SourceUnavailable(f"cannot scrape {source}: the page is larger than "
                                    f"{MAX_EXPOSITION_BYTES >> 20} MiB")
        if looks_binary(resp.content[:BINARY_SAMPLE_BYTES]):
            raise SourceUnavailable(f"cannot scrape {source}: {BINARY_REASON}")
        return RawScrape(source, "metrics-url", _decode(resp.content), ts,
                         instance_for_url(source))
    path = Path(source)
    from prefixscope.ingest.jsonl_driver import open_source_file  # refuses FIFOs, devices, binary

    with open_source_file(source) as fh:
        try:
            data = fh.read(MAX_EXPOSITION_BYTES + 1)
            ts = os.fstat(fh.fileno()).st_mtime if at_unix_s is None else at_unix_s
        except OSError as exc:
            raise SourceUnavailable(f"cannot read {source}: {exc.strerror or exc}") from exc
    if len(data) > MAX_EXPOSITION_BYTES:
        raise SourceUnavailable(f"cannot read {source}: larger than {MAX_EXPOSITION_BYTES >> 20} "
                                "MiB (a vLLM /metrics page is about 100 KiB)")
    return RawScrape(source, "metrics-file", _decode(data), ts,
                     file_instance(path))


def file_instance(path: str | os.PathLike[str]) -> str:
    """The default instance of a saved exposition file: the name of the folder that holds it
    (``scrapes/scrape_3.prom`` -> ``scrapes``; a file in the working directory takes that
    directory's name).

    Saved scrapes of one server are one series (docs/metrics.md rule 1): a counter's increase
    between two files is measured, and a restart between them is seen through the counters'
    ``_created`` values. The file name never names the instance (it did until issue 11: each
    file became its own series and every file's created-zero counted its whole value again).
    """
    return Path(path).resolve().parent.name or "saved"


@dataclass(frozen=True, slots=True)
class Lifetime:
    """One process seen in saved scrapes: its counters' created time and the scrapes of it.

    Attributes:
        instance: instance the scrapes are stored under.
        engine: ``engine`` label (one lifetime per engine of a data-parallel server).
        created_unix_s: ``vllm:prefix_cache_queries_created`` of the process (Unix seconds).
        first_unix_s, last_unix_s: earliest and latest scrape of this process.
        locations: the files (or URLs) that showed it.
    """

    instance: str
    engine: str | None
    created_unix_s: float
    first_unix_s: float
    last_unix_s: float
    locations: tuple[str, ...]


def process_lifetimes(reads: Sequence["ExpositionRead"]) -> list[Lifetime]:
    """The processes behind a set of parsed scrapes, from the queries counter's ``_created``.

    Scrapes of one process carry the same created time; a restart gives a later one. Scrapes
    without ``_created`` series are left out (their process cannot be told).

    Returns:
        One :class:`Lifetime` per (instance, engine, created time), ordered by instance, engine,
        created time.
    """
    acc: dict[tuple[str, str | None, float], list] = {}
    for read in reads:
        for smp in read.samples:
            if smp.created_zero and smp.metric == QUERIES_METRIC:
                key = (smp.instance, smp.engine, round(smp.ts_unix_s, 3))
                entry = acc.setdefault(key, [read.ts_unix_s, read.ts_unix_s, []])
                entry[0] = min(entry[0], read.ts_unix_s)
                entry[1] = max(entry[1], read.ts_unix_s)
                if read.location not in entry[2]:
                    entry[2].append(read.location)
    return [Lifetime(i, e, c, lo, hi, tuple(locs))
            for (i, e, c), (lo, hi, locs) in sorted(acc.items(), key=lambda kv: (
                kv[0][0], kv[0][1] or "", kv[0][2]))]


def process_overlaps(reads: Sequence["ExpositionRead"]) -> list[str]:
    """Warnings for scrapes stored under one instance that cannot come from one server.

    One server runs one process per engine at a time: a process created before the last scrape
    of an earlier one (``created_2 < last_scrape_1``) means two processes were running at once,
    so the files are scrapes of several servers under one instance name (their increases would
    be summed as one series). Also warns when two different scrapes of one instance carry the
    same scrape time (``--at`` stamps every file with one time): the later would be skipped as
    already stored.

    Returns:
        One message per problem (empty when the scrapes are consistent with one server).
    """
    warnings: list[str] = []
    lifetimes = process_lifetimes(reads)
    for a, b in zip(lifetimes, lifetimes[1:]):
        if (a.instance, a.engine) != (b.instance, b.engine):
            continue
        if b.created_unix_s < a.last_unix_s:
            warnings.append(
                f"instance {a.instance}: {a.locations[-1]} and {b.locations[0]} look like two "
                f"processes running at once (counters created at {a.created_unix_s:.3f} and "
                f"{b.created_unix_s:.3f}, the first still scraped at {a.last_unix_s:.3f}); "
                "scrapes of different servers need their own --instance (one command per server)")
    seen: dict[tuple[str, float], str] = {}
    for read in reads:
        k = (read.instance, read.ts_unix_s)
        if k in seen and seen[k] != read.location:
            warnings.append(
                f"instance {read.instance}: {seen[k]} and {read.location} have the same scrape "
                "time; only the first is stored for each series (give each file its own time: "
                "its modification time, or one command per file with --at)")
        seen.setdefault(k, read.location)
    return warnings


def encode_labels(labels: dict[str, str], *, drop: Iterable[str] = ()) -> str:
    """Labels as stored: sorted-key compact JSON without ``instance``, ``job`` and ``drop``."""
    dropped = _DROPPED_LABELS.union(drop)
    return json.dumps({k: labels[k] for k in sorted(labels) if k not in dropped},
                      separators=(",", ":"), ensure_ascii=False)


#: Labels of ``vllm:cache_config_info`` stored as they are: fields of vLLM's ``CacheConfig``
#: (``vllm/config/cache.py``, 0.32/0.33; every label the bundled captures show) and the vLLM
#: labels. Any other label on it is screened like a label of any kept family.
CACHE_CONFIG_LABELS = frozenset({
    "_block_size_resolved", "block_size", "cache_dtype", "cache_hit_alignment_tokens",
    "calculate_kv_scales", "cpu_offload_gb", "effective_attention_block_size",
    "enable_mamba_shared_prefix_checkpoint", "enable_prefix_caching", "gpu_memory_utilization",
    "hash_block_size", "is_attention_free", "kv_cache_dtype_skip_layers", "kv_cache_layout",
    "kv_cache_max_concurrency", "kv_cache_memory_bytes", "kv_cache_size_tokens",
    "kv_offloading_backend", "kv_offloading_size", "kv_sharing_fast_prefill", "mamba_block_size",
    "mamba_cache_dtype", "mamba_cache_mode", "mamba_page_size_padded", "mamba_ssm_cache_dtype",
    "num_cpu_blocks", "num_gpu_blocks", "num_gpu_blocks_override",
    "prefix_cache_retention_interval", "prefix_caching_hash_algo", "prefix_match_unit",
    "replayssm_buffer_len", "sliding_window", "skip_page_size_padded", "swa_bounded_replay",
    "swap_space", "swap_space_bytes", "use_kda_recoverssm", "use_replayssm",
    "user_specified_block_size",
}) | ALLOWED_LABELS

REFUSED_LABEL = ("a label that is not a vLLM label may hold a tenant id; configure an HMAC key "
                 "(PREFIXSCOPE_HMAC_KEY_FILE) to keep such labels as digests")
#: Largest exposition read, bytes (a vLLM /metrics page is about 100 KiB).
MAX_EXPOSITION_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class SampleVerdict:
    """What :func:`normalise_sample` decided for one exposed sample.

    Attributes:
        spec: the kept family spec (None with ``created`` or when refused / not kept).
        labels: the labels to store (screened: digested where needed).
        ts_unix_s: sample time, seconds. value: sample value.
        created: for a ``<family>_created`` sample: ``(family, labels without le)``.
        field: with ``reason``, the sample is refused: the field at fault (a name of ours).
        reason: why it is refused (never the value), or None when kept or not ours.
    """

    spec: _Spec | None = None
    labels: dict[str, str] | None = None
    ts_unix_s: float = 0.0
    value: float = 0.0
    created: tuple[str, str] | None = None
    field: str | None = None
    reason: str | None = None


_NOT_OURS = SampleVerdict()


def normalise_sample(name: str, labels: dict[str, str], value: float | int,
                     ts_unix_s: float | int, *,
                     label_key: bytes | None, family_type: str | None = None) -> SampleVerdict:
    """The one normalisation of an exposed sample, shared by scrapes and files
    (:func:`fetch_samples`) and the Prometheus API (``ingest/prometheus_api.py``).

    Rules (``docs/ingest.md#bounds``):

    1. Only kept families count (:data:`SAMPLE_SPECS`, :data:`CREATED_SPECS`); others are
       ignored (``spec`` None, no reason).
    2. Labels outside :data:`ALLOWED_LABELS` (for ``vllm:cache_config_info``: outside
       :data:`CACHE_CONFIG_LABELS`) are stored as ``hmac:<digest>`` under ``label_key``; without
       a key the sample is refused (the label is never named: its name is input too).
    3. Label values are at most :data:`~prefixscope.core.bounds.MAX_ID_CHARS` characters; the
       sample time must lie in 1970-01-01 to 2100-01-01 UTC.
    4. Counters and histograms: finite and >= 0; ``kv_cache_usage_perc``: a fraction in
       [0, 1]; other gauges: finite; ``_created``: a time in the range of rule 3.
    5. A declared ``# TYPE`` (``family_type``: counter, gauge or histogram) must be the kind
       vLLM exposes the family as.

    ``value`` and ``ts_unix_s`` may be ints of any size (the text parser and JSON give
    ``10**400`` as an int): past the DOUBLE range a counter is "over 2^53" (or "negative"), a
    time is outside the range of rule 3, never an ``OverflowError``.

    Returns:
        A :class:`SampleVerdict`; ``field`` names the sample (a kept name, never input text).
    """
    cspec = CREATED_SPECS.get(name)
    spec = SAMPLE_SPECS.get(name)
    if cspec is None and spec is None:
        return _NOT_OURS
    if any(len(v) > MAX_ID_CHARS for v in labels.values()):
        return SampleVerdict(field=name, reason=f"a label value longer than {MAX_ID_CHARS} "
                                                "characters")
    allowed = CACHE_CONFIG_LABELS if name == CACHE_CONFIG_METRIC else ALLOWED_LABELS
    extra = sorted(k for k in labels if k not in allowed)
    if extra:
        if label_key is None:
            return SampleVerdict(field=name, reason=REFUSED_LABEL)
        from prefixscope.ingest.privacy import digest_tenant

        labels = dict(labels)
        for k in extra:
            labels[k] = "hmac:" + digest_tenant(labels[k], label_key) if labels[k] else ""
    if name != CACHE_CONFIG_METRIC:
        for k in _CLOSED_NAMES.intersection(labels):
            v = labels[k]
            if closed_label_value(k, v) != v:
                labels = {**labels, k: OTHER_LABEL_VALUE}  # a tenant name is never stored here
    if not time_ok(ts_unix_s):
        return SampleVerdict(field=name, reason="sample " + TIME_RANGE)
    ts_unix_s = float(ts_unix_s)
    try:
        value = float(value)
    except OverflowError:  # an integer past the DOUBLE range (10**400): bound it by its sign
        import sys

        value = sys.float_info.max if value > 0 else -sys.float_info.max
        if spec is not None and spec.kind == "gauge":
            return SampleVerdict(field=name, reason="gauge value is beyond the DOUBLE range")
    if cspec is not None:
        if not time_ok(value) or value == 0:
            return SampleVerdict(field=name, reason="created time is not a time from 1970-01-01 "
                                                    "to 2100-01-01 UTC")
        return SampleVerdict(labels=labels, ts_unix_s=ts_unix_s, value=value,
                             created=(cspec[0], encode_labels(labels, drop=("le",))))
    assert spec is not None
    declared = family_type if family_type in ("counter", "gauge", "histogram") else None
    if declared is not None and declared != spec.kind and not name.endswith("_created"):
        return SampleVerdict(field=name, reason=f"declared a {declared} by # TYPE; vLLM exposes "
                                                f"it as a {spec.kind}")
    if not math.isfinite(value):
        return SampleVerdict(field=name, reason=f"{spec.kind} value is not a finite number")
    if spec.kind in ("counter", "histogram") and value < 0:
        return SampleVerdict(field=name, reason=f"{spec.kind} value is negative")
    if spec.kind in ("counter", "histogram") and value > MAX_COUNTER_VALUE:
        return SampleVerdict(field=name, reason=f"{spec.kind} value is {COUNTER_OVER}")
    if spec.metric == "vllm:kv_cache_usage_perc" and not 0 <= value <= 1:
        return SampleVerdict(field=name, reason="a fraction outside 0 to 1")
    return SampleVerdict(spec=spec, labels=labels, ts_unix_s=ts_unix_s, value=value)


#: Default ``label_key`` of the ingest functions: read the configured key (or its absence) once
#: when the call starts, with :func:`configured_label_key`.
CONFIGURED_KEY = "configured"


def configured_label_key(config_path: str | None = None) -> bytes | None:
    """The server-side HMAC key used to digest labels outside :data:`ALLOWED_LABELS`, or None
    when no key is configured (such samples are then quarantined).

    Read once per command (the ingest functions call it when they start, never per scrape):
    ``$PREFIXSCOPE_HMAC_KEY_FILE``, then ``[identity] hmac_key_file`` of the settings, then the
    hex string in ``$PREFIXSCOPE_HMAC_KEY`` (``prefixscope.core.identity.load_hmac_key``).

    Args:
        config_path: settings file (default ``$PREFIXSCOPE_CONFIG`` or ``./prefixscope.toml``).

    Raises:
        ConfigError: a key is configured but cannot be used: the file is missing, unreadable,
            shorter than 32 bytes or inside the repository, or ``$PREFIXSCOPE_HMAC_KEY`` is not
            hex; or the settings file is invalid. Raised before anything is read or stored.
    """
    import os

    from prefixscope.core.config import load_settings
    from prefixscope.core.identity import load_hmac_key

    key_file = load_settings(config_path).identity.hmac_key_file  # includes the env variable
    if not key_file and not os.environ.get("PREFIXSCOPE_HMAC_KEY"):
        return None
    return load_hmac_key(config_path=key_file)


def _label_key(label_key: bytes | None | str) -> bytes | None:
    return configured_label_key() if label_key == CONFIGURED_KEY else label_key  # type: ignore[return-value]


_KNOWN_NAMES = frozenset(SAMPLE_SPECS) | frozenset(CREATED_SPECS) | frozenset(
    {spec.family for spec in SAMPLE_SPECS.values()}) | frozenset(
    {fam + "_total" for fam in (*COUNTER_FAMILIES, *LEGACY_COUNTERS)})


def known_name(name: str) -> str | None:
    """``name`` when it is a metric or family name prefixscope keeps, else None: a quarantine
    entry names fields from this known set only, never text of the input."""
    return name if name in _KNOWN_NAMES else None


def _lead_name(line: str) -> str:
    """The text before a sample line's labels or value (may be empty)."""
    head = line.strip().split("{", 1)[0].split(None, 1)
    return head[0] if head else ""


_EXEMPLAR = re.compile(r"\s#\s*\{[^{}]*\}\s*\S+(\s+\S+)?\s*$")


def _line_ok(line: str) -> bool:
    """True when prometheus_client reads the line on its own (a comment, a sample)."""
    try:
        for _ in text_string_to_metric_families(line + "\n"):
            pass
    except Exception:  # noqa: BLE001 - the parser raises several types; their text is unused
        return False
    return True


def parse_exposition(lines: list[str], location: str, problems: list[Quarantined]
                     ) -> Iterator[tuple[int, Any, str | None]]:
    """Parse exposition lines (text format 0.0.4) as one stream with prometheus_client's
    ``text_string_to_metric_families``, so each family keeps its ``# TYPE``.

    Before parsing: a UTF-8 byte-order mark is dropped, an OpenMetrics exemplar (``# {...} v
    [ts]`` after a sample) is cut off (it is not a sample), and a line longer than
    :data:`~prefixscope.core.bounds.MAX_LINE_BYTES` is quarantined, as is a line with bytes
    that are not UTF-8 (``not UTF-8 text (byte N)``, N 0-based within the line, as the JSONL
    readers say). When the stream does not
    parse, each line is tried alone only to find the lines to quarantine (the parser's
    exception text is never read), and the stream without them is parsed again.

    Args:
        lines: the exposition split at ``\n``.
        location: for quarantine entries appended to ``problems``.

    Yields:
        ``(1-based line, prometheus_client Sample, family type or None)`` in line order.
    """
    clean = list(lines)
    if clean and clean[0].startswith("\ufeff"):
        clean[0] = clean[0][1:]
    sample_lines: list[int] = []
    try:
        "\n".join(clean).encode("utf-8")
        not_utf8 = False
    except UnicodeEncodeError:  # undecodable bytes (lone surrogates of _decode)
        not_utf8 = True
    for i, raw in enumerate(clean):
        line = raw.strip()
        if not_utf8:
            try:
                raw.encode("utf-8")
            except UnicodeEncodeError as exc:
                at = len(raw[:exc.start].encode("utf-8", "surrogateescape"))
                problems.append(Quarantined(location, i + 1, f"not UTF-8 text (byte {at})",
                                            known_name(_lead_name(line))))
                clean[i] = ""
                continue
        if len(raw) > MAX_LINE_BYTES:  # characters >= bytes / 4: a cheap first test
            if len(raw.encode("utf-8", "replace")) > MAX_LINE_BYTES:
                problems.append(Quarantined(location, i + 1, LINE_TOO_LONG, None))
                clean[i] = ""
                continue
        if not line:
            continue
        if not line.startswith("#"):
            if " #" in line:
                clean[i] = line = _EXEMPLAR.sub("", line)
            sample_lines.append(i)
    try:
        families = list(text_string_to_metric_families("\n".join(clean) + "\n"))
    except Exception:  # noqa: BLE001 - some line is malformed: find it
        families = None
    if families is None:
        for i, raw in enumerate(clean):
            line = raw.strip()
            if not line or _line_ok(line):
                continue
            parts = line.split(None, 3)
            comment = line.startswith("#")
            kind = parts[1] if comment and len(parts) > 1 else None
            reason = (f"malformed # {kind} line" if kind in ("TYPE", "HELP") else
                      "malformed sample line (not Prometheus text format 0.0.4)")
            name = (parts[2] if len(parts) > 2 else "") if comment else _lead_name(line)
            problems.append(Quarantined(location, i + 1, reason, known_name(name)))
            clean[i] = ""
        sample_lines = [i for i in sample_lines if clean[i].strip()]
        try:
            families = list(text_string_to_metric_families("\n".join(clean) + "\n"))
        except Exception:  # noqa: BLE001 - lines fine alone but not together: read them alone
            families = None
    if families is not None:
        flat = [(s, f.type) for f in families for s in f.samples]
        if len(flat) == len(sample_lines):  # one sample per sample line, in line order
            for i, (sample, ftype) in zip(sample_lines, flat):
                yield i + 1, sample, ftype
            return
    for i in sample_lines:  # the last resort: every line on its own, without its # TYPE
        try:
            fams = list(text_string_to_metric_families(clean[i].strip() + "\n"))
        except Exception:  # noqa: BLE001
            problems.append(Quarantined(location, i + 1, "malformed sample line (not Prometheus "
                                        "text format 0.0.4)",
                                        known_name(_lead_name(clean[i]))))
            continue
        for f in fams:
            for sample in f.samples:
                yield i + 1, sample, None


def _timestamp(t) -> float | int:
    """A prometheus_client ``Timestamp`` (or number) as Unix seconds; whole seconds past the
    DOUBLE range stay an int (:func:`normalise_sample` quarantines the time)."""
    sec = getattr(t, "sec", None)
    if sec is None:
        return t
    try:
        return float(t)
    except OverflowError:
        return sec


def fetch_samples(text: str, *, location: str, instance: str, ts_unix_s: float,
                  label_key: bytes | None = None) -> ExpositionRead:
    """Parse an exposition into the samples a hit-rate board needs (pure: no I/O).

    Labels outside :data:`ALLOWED_LABELS` are stored as ``hmac:<digest>`` under ``label_key``;
    without a key such a sample is quarantined (never stored with its raw value).

    The text is parsed as one stream by prometheus_client (:func:`parse_exposition`: each
    family keeps its ``# TYPE``); lines the parser cannot read are quarantined and the others
    kept. Each sample then goes through :func:`normalise_sample` (labels, time and value
    bounds, the declared type); a series repeated with a different value is quarantined at its
    repeat (the first is kept).

    Args:
        text: Prometheus text format 0.0.4 (OpenMetrics text mostly parses too).
        location: URL or file path, for quarantine entries.
        instance: the instance name to store.
        ts_unix_s: scrape time, Unix seconds (a sample's own timestamp overrides it).

    Returns:
        An :class:`ExpositionRead` with the kept samples (canonical names; created-zero
        samples added) and the problems.
    """
    problems: list[Quarantined] = []
    kept: list[tuple[_Spec, dict[str, str], float, float, str, int]] = []
    created: dict[tuple[str, str], float] = {}
    saw_v0 = False
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for lineno, sample, ftype in parse_exposition(lines, location, problems):
        name = sample.name
        ts = _timestamp(sample.timestamp) if sample.timestamp is not None else ts_unix_s
        v = normalise_sample(name, dict(sample.labels), sample.value, ts,
                             label_key=label_key, family_type=ftype)
        if v.reason is not None:
            problems.append(Quarantined(location, lineno, v.reason, v.field))
        elif v.created is not None:
            created[v.created] = v.value
        elif v.spec is not None:
            if name in V0_HIT_RATE_GAUGES:
                saw_v0 = True
            kept.append((v.spec, v.labels, v.ts_unix_s, v.value, name, lineno))

    by_key: dict[tuple[str, str, float], MetricSample] = {}
    zeros: dict[tuple[str, str], MetricSample] = {}
    line_of: dict[tuple[str, str, float], int] = {}
    for spec, labels, ts, value, name, lineno in kept:
        labels_json = encode_labels(labels)
        s = MetricSample(spec.metric, labels_json, instance, labels.get("model_name"),
                         labels.get("engine"), ts, value, name, spec.legacy, False)
        key = (spec.metric, labels_json, ts)
        prior = by_key.get(key)
        if prior is not None and prior.legacy == spec.legacy:
            if prior.value != value:  # the same series twice: which one is right is unknown
                problems.append(Quarantined(
                    location, lineno, f"repeats the series of line {line_of[key]} with a "
                    "different value (the first is kept)", name))
            continue
        if prior is not None and not prior.legacy:
            continue  # a canonical name beats its legacy alias in the same scrape
        by_key[key] = s
        line_of[key] = lineno
        if spec.kind in ("counter", "histogram"):
            c = created.get((spec.family, encode_labels(labels, drop=("le",))))
            if c is not None and c < ts and (spec.metric, labels_json) not in zeros:
                zeros[(spec.metric, labels_json)] = MetricSample(
                    spec.metric, labels_json, instance, s.model, s.engine, c, 0.0, name,
                    spec.legacy, True)
    samples = tuple(zeros.values()) + tuple(by_key.values())
    notes = read_notes(samples, saw_v0=saw_v0, nothing=NOTHING_NOTE)
    problems.sort(key=lambda q: q.line)
    return ExpositionRead(location, instance, ts_unix_s, samples, tuple(problems), tuple(notes),
                          len(lines))


def save_samples(con: duckdb.DuckDBPyConnection, read: ExpositionRead, *, kind: str,
                 started_unix_s: float | None = None, run_id: str = "") -> IngestSummary:
    """Write one parsed exposition in one transaction: samples, quarantine, source and run.

    ``run_id`` tags the samples of a replay run (``''`` = production traffic), so production
    analytics can leave replays out (``metric_samples.run_id``).

    Safe to run twice: the primary key (metric, labels, instance, ts_unix_s) makes a repeated
    scrape add no rows (they count as duplicates).

    Returns:
        The :class:`~ingest.bookkeeping.IngestSummary` (``rows_read`` counts kept samples,
        created-zero samples included).

    Raises:
        Whatever the store raises (``duckdb.Error``), after ROLLBACK: none of the scrape's
        samples, quarantine entries, source or run record are kept
        (:func:`prefixscope.store.queries.ingest.ingest_transaction`).
    """
    from prefixscope.store.queries.metrics import insert_metric_samples

    started = time.time() if started_unix_s is None else started_unix_s
    source_id = source_id_for(kind, read.location)
    ingest_run_id = new_ingest_run_id()
    with ingest_transaction(con):
        added = insert_metric_samples(con, [s.row(source_id) for s in read.samples],
                                      run_id=run_id)
        record_quarantine(con, source_id=source_id, ingest_run_id=ingest_run_id,
                          entries=list(read.problems))
        summary = IngestSummary(read.location, kind, len(read.samples), added,
                                len(read.samples) - added, len(read.problems), read.note)
        upsert_source(con, source_id=source_id, kind=kind, location=read.location,
                      rows_added=added, note=read.note)
        status = "ok" if not read.problems else ("partial" if read.samples else "failed")
        record_run(con, source_id=source_id, kind=kind, started_unix_s=started, summary=summary,
                   status=status, ingest_run_id=ingest_run_id)
    return summary


def without_zeros_before(read: ExpositionRead, since_unix_s: float) -> ExpositionRead:
    """``read`` without the created-zero samples placed before ``since_unix_s``.

    A replay run's counters are its own before/after delta, whatever the server did before
    (docs/metrics.md#run-counters): its first scrape is a baseline, not "everything since the
    server started". A created time inside the run (a restart during it) keeps its zero.
    """
    import dataclasses

    kept = tuple(s for s in read.samples if not (s.created_zero and s.ts_unix_s < since_unix_s))
    return dataclasses.replace(read, samples=kept)


def ingest_exposition(con: duckdb.DuckDBPyConnection, source: str, *, instance: str | None = None,
                      at_unix_s: float | None = None, run_id: str = "",
                      label_key: bytes | None | str = CONFIGURED_KEY,
                      since_unix_s: float | None = None) -> IngestSummary:
    """Read, parse and store one exposition (file or URL) on an open read-write connection.

    Args:
        con: read-write connection, not inside a transaction.
        source: ``/metrics`` URL or exposition file path.
        instance: instance name (default: the URL's host:port or the file name stem).
        at_unix_s: time to stamp the scrape with (default: now for a URL, mtime for a file).
        run_id: the replay run these samples belong to (``''`` = production traffic).
        label_key: HMAC key for labels outside :data:`ALLOWED_LABELS` (None: quarantine
            them); default: :func:`configured_label_key`. A caller ingesting many files
            passes the key it read once.
        since_unix_s: the start of a replay run: created-zero samples before it are not
            stored (:func:`without_zeros_before`); None keeps them all.

    Returns:
        The :class:`~ingest.bookkeeping.IngestSummary` of the scrape.

    Raises:
        SourceUnavailable: the source cannot be read at all. ConfigError: from
        :func:`configured_label_key`.
    """
    key = _label_key(label_key)
    raw = read_source(source, at_unix_s=at_unix_s)
    read = fetch_samples(raw.text, label_key=key, location=source,
                         instance=instance or raw.default_instance,
                         ts_unix_s=raw.ts_unix_s)
    if since_unix_s is not None:
        read = without_zeros_before(read, since_unix_s)
    return save_samples(con, read, kind=raw.kind, run_id=run_id)


def nothing_error(outcomes: Sequence[ScrapeOutcome], errors: Sequence[str]) -> NothingIngested:
    """The error for "no source gave a kept sample", listing each source's reason: its
    quarantined lines (how many and the first, ``file:line: field: reason``) when it had any,
    else its note (e.g. :data:`NOTHING_NOTE`)."""
    reasons = list(errors) + [_nothing_reason(o) for o in outcomes if o.summary.rows_read == 0]
    return NothingIngested("nothing could be read: " + "; ".join(reasons))


def _nothing_reason(outcome: ScrapeOutcome) -> str:
    from prefixscope.core.errors import problem_text

    s = outcome.summary
    if s.rows_quarantined and outcome.problems:
        q = outcome.problems[0]
        return (f"{s.source}: every line quarantined ({s.rows_quarantined:,}; the first: "
                f"{problem_text(q.location, q.line, q.reason, q.field)})")
    return f"{s.source}: {s.note or 'nothing kept'}"


def ingest_sources(db_path: str, sources: Sequence[str], *, instance: str | None = None,
                   at_unix_s: float | None = None,
                   label_key: bytes | None | str = CONFIGURED_KEY,
                   on_warning: Callable[[str], None] | None = None,
                   raise_when_nothing: bool = True,
                   ) -> tuple[list[ScrapeOutcome], list[str]]:
    """One scrape of every source, each stored in its own short write transaction.

    ``label_key`` as in :func:`ingest_exposition`, read once before the first source. Every
    source is read and parsed first; :func:`process_overlaps` messages go to ``on_warning``
    (the samples are stored all the same), then each scrape is stored.
    ``raise_when_nothing=False`` returns even when nothing was kept (the CLI prints every
    source's quarantined lines first, then raises :func:`nothing_error` itself).

    Returns:
        ``(outcomes, errors)``: one :class:`ScrapeOutcome` per readable source in the given
        order, and one message per source that could not be read.

    Raises:
        NothingIngested: no source gave a single kept sample (the message lists each reason).
        ConfigError: a configured HMAC key cannot be read (before any source is read).
    """
    from prefixscope.store import db as store_db

    key = _label_key(label_key)
    outcomes: list[ScrapeOutcome] = []
    errors: list[str] = []
    reads: list[tuple[ExpositionRead, str]] = []
    for source in sources:
        try:
            raw = read_source(source, at_unix_s=at_unix_s)
        except SourceUnavailable as exc:
            errors.append(str(exc))
            continue
        reads.append((fetch_samples(raw.text, label_key=key, location=source,
                                    instance=instance or raw.default_instance,
                                    ts_unix_s=raw.ts_unix_s), raw.kind))
    for message in process_overlaps([r for r, _ in reads]):
        if on_warning is not None:
            on_warning(message)
    for read, kind in reads:
        with store_db.writer(db_path) as con:
            outcomes.append(ScrapeOutcome(save_samples(con, read, kind=kind), read.problems))
    if raise_when_nothing and not any(o.summary.rows_read > 0 for o in outcomes):
        raise nothing_error(outcomes, errors)
    return outcomes, errors


@dataclass
class ScrapeLoopResult:
    """What a scrape loop did, in bounded memory (the loop runs as a daemon for months).

    Attributes:
        outcomes: the last :data:`KEEP_OUTCOMES` stored scrapes (older ones are only counted).
        errors: the last :data:`KEEP_ERRORS` failure messages.
        rounds: rounds run. scrapes: scrapes stored. failures: failures seen (all rounds).
        skipped_rounds: rounds whose store was skipped because the database stayed locked.
        rows_read, rows_added, rows_quarantined: totals over every stored scrape.
    """

    outcomes: deque[ScrapeOutcome] = field(default_factory=lambda: deque(maxlen=KEEP_OUTCOMES))
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=KEEP_ERRORS))
    rounds: int = 0
    scrapes: int = 0
    failures: int = 0
    skipped_rounds: int = 0
    rows_read: int = 0
    rows_added: int = 0
    rows_quarantined: int = 0

    def add(self, outcome: ScrapeOutcome) -> None:
        """Count one stored scrape (kept among the last :data:`KEEP_OUTCOMES`)."""
        self.outcomes.append(outcome)
        self.scrapes += 1
        self.rows_read += outcome.summary.rows_read
        self.rows_added += outcome.summary.rows_added
        self.rows_quarantined += outcome.summary.rows_quarantined

    def fail(self, message: str) -> None:
        """Count one failure (its message kept among the last :data:`KEEP_ERRORS`)."""
        self.errors.append(message)
        self.failures += 1


#: Stored scrapes a :class:`ScrapeLoopResult` keeps (about 1 KiB each, problems included).
KEEP_OUTCOMES = 1000
#: Failure messages a :class:`ScrapeLoopResult` keeps.
KEEP_ERRORS = 100


def scrape_loop(db_path: str, sources: Sequence[str], *, every_s: float,
                instance: str | None = None, max_scrapes: int | None = None,
                stop: threading.Event | None = None,
                on_scrape: Callable[[ScrapeOutcome], None] | None = None,
                on_error: Callable[[str], None] | None = None,
                timeout_s: float | None = None,
                label_key: bytes | None | str = CONFIGURED_KEY,
                lock_timeout_s: float | None = None) -> ScrapeLoopResult:
    """Scrape every source every ``every_s`` seconds until stopped.

    Each round reads every source over HTTP first, then stores each scrape in its own short
    write transaction (the database lock is held for milliseconds; see ``store/db.py``). Rounds
    start at ``t0 + k * every_s``; a round that overruns skips the missed starts. A source that
    fails in a round is reported through ``on_error`` and retried next round.

    Args:
        db_path: DuckDB file.
        sources: URLs (files work too, each round re-reads them).
        every_s: seconds between round starts (> 0).
        instance: instance name for every source (default: host:port per URL).
        max_scrapes: stop after this many rounds (None: until ``stop`` or KeyboardInterrupt).
        stop: an event that ends the loop (set by a SIGTERM handler in the CLI).
        on_scrape, on_error: callbacks per stored scrape / per failure.
        timeout_s: HTTP timeout (default ``min(10, every_s)``).
        label_key: as in :func:`ingest_exposition`; read once before the first round, so a
            key file is not re-read every scrape (a key rotated on disk needs a restart).
        lock_timeout_s: how long a round waits for the database lock before it skips its
            store (reported through ``on_error``, counted in ``skipped_rounds``); default
            ``every_s`` (at least 1 s, at most 30 s), so a long write elsewhere costs rounds,
            never the loop.

    Returns:
        A :class:`ScrapeLoopResult`.

    Raises:
        ConfigError: a configured HMAC key cannot be read (before the first scrape).
    """
    import httpx

    from prefixscope.store import db as store_db

    if every_s <= 0:
        raise ValueError("every_s must be > 0")
    key = _label_key(label_key)
    stop = stop or threading.Event()
    result = ScrapeLoopResult()
    lock_s = min(DEFAULT_LOCK_TIMEOUT_S, max(1.0, every_s)) if lock_timeout_s is None \
        else lock_timeout_s
    t0 = time.monotonic()
    k = 0
    with httpx.Client() as client:
        try:
            while not stop.is_set():
                for source in sources:
                    try:
                        raw = read_source(source, client=client,
                                          timeout_s=timeout_s or min(10.0, every_s))
                    except SourceUnavailable as exc:
                        result.fail(str(exc))
                        if on_error:
                            on_error(str(exc))
                        continue
                    read = fetch_samples(raw.text, label_key=key, location=source,
                                         instance=instance or raw.default_instance,
                                         ts_unix_s=raw.ts_unix_s)
                    try:
                        with store_db.writer(db_path, lock_timeout_s=lock_s) as con:
                            outcome = ScrapeOutcome(save_samples(con, read, kind=raw.kind),
                                                    read.problems)
                    except StoreLocked as exc:
                        # another writer holds the file: this round's scrape is dropped, the
                        # next round scrapes again (counters are cumulative: nothing is lost)
                        message = f"{source}: round skipped: {exc}"
                        result.fail(message)
                        result.skipped_rounds += 1
                        if on_error:
                            on_error(message)
                        continue
                    result.add(outcome)
                    if on_scrape:
                        on_scrape(outcome)
                result.rounds += 1
                if max_scrapes is not None and result.rounds >= max_scrapes:
                    break
                k = max(k + 1, int((time.monotonic() - t0) / every_s) + 1)
                stop.wait(max(0.0, t0 + k * every_s - time.monotonic()))
        except KeyboardInterrupt:
            pass
    return result


def read_notes(samples: tuple[MetricSample, ...], *, saw_v0: bool, nothing: str) -> list[str]:
    """The notes of one read (a scrape, a file or a Prometheus range), one rule for all:
    :data:`LEGACY_NOTE` when a series came under a pre-0.10 vLLM name, :data:`V0_GAUGE_NOTE`
    when the v0 hit-rate gauge was seen (read, never used as a hit rate), ``nothing`` when no
    prefix-cache series was read."""
    notes: list[str] = []
    if any(s.legacy for s in samples):
        notes.append(LEGACY_NOTE)
    if saw_v0:
        notes.append(V0_GAUGE_NOTE)
    if not samples:
        notes.append(nothing)
    return notes
