"""The gateway's ``/metrics`` (prometheus_client, its own registry). No tenant label: scopes,
endpoints, decisions and reasons only; namespace digests only when
``metrics_namespace_labels`` > 0, for at most that many namespaces (the rest are ``other``).

Counters (``docs/gateway.md#metrics``): requests, prompt and cached tokens by scope, decisions
by decision and first mismatch, the three invariants (each must stay 0), upstream errors by
kind; histograms of TTFT and latency; gauges of permits in flight and the cache epoch.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from prefixscope.core.identity import SCOPES

INVARIANTS = ("cross_scope_acceptance", "wrong_version_acceptance", "old_generation_use")
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class GatewayMetrics:
    """The gateway's metric families on a private registry."""

    def __init__(self, namespace_labels: int = 0) -> None:
        r = self.registry = CollectorRegistry()
        self.namespace_labels = namespace_labels
        self._namespaces: set[str] = set()
        self._children: dict[tuple, object] = {}
        self.requests = Counter("prefixscope_gateway_requests", "Requests answered, by endpoint, "
                                "scope and status class", ["endpoint", "scope", "status"],
                                registry=r)
        self.prompt_tokens = Counter("prefixscope_gateway_prompt_tokens",
                                     "Prompt tokens the upstream reported (inclusive), by scope",
                                     ["scope"], registry=r)
        self.cached_tokens = Counter("prefixscope_gateway_cached_tokens",
                                     "Prompt tokens the upstream served from its prefix cache, "
                                     "by scope", ["scope"], registry=r)
        self.decisions = Counter("prefixscope_gateway_decisions", "Acceptance decisions by "
                                 "decision and first mismatching field ('none')",
                                 ["decision", "reason"], registry=r)
        self.invariants = Counter("prefixscope_gateway_invariant_violations",
                                  "Must stay 0: cross-scope acceptance, wrong-version acceptance, "
                                  "old-generation use", ["invariant"], registry=r)
        self.candidate_tokens = Counter("prefixscope_gateway_candidate_tokens",
                                        "Tokens the decisions' candidates could supply, by "
                                        "basis: exact (token ids, tokenize = upstream) or "
                                        "upper_bound (the writer's prompt length)", ["basis"],
                                        registry=r)
        self.upstream_errors = Counter("prefixscope_gateway_upstream_errors",
                                       "Upstream failures by kind", ["kind"], registry=r)
        self.client_errors = Counter("prefixscope_gateway_client_errors",
                                     "Requests refused before the upstream, by code", ["code"],
                                     registry=r)
        self.salt_replaced = Counter("prefixscope_gateway_client_salt_replaced",
                                     "Client-supplied cache_salt values replaced", registry=r)
        self.ttft = Histogram("prefixscope_gateway_ttft_seconds", "Time to first byte of the "
                              "answer (streams: first event)", ["endpoint"], buckets=_BUCKETS,
                              registry=r)
        self.latency = Histogram("prefixscope_gateway_latency_seconds", "Request latency through "
                                 "the gateway", ["endpoint"], buckets=_BUCKETS, registry=r)
        self.permits = Gauge("prefixscope_gateway_permits_in_flight",
                             "CacheUsePermits held by requests in flight", registry=r,
                             multiprocess_mode="livemostrecent")
        self.cache_epoch = Gauge("prefixscope_gateway_cache_epoch", "Current cache epoch",
                                 registry=r, multiprocess_mode="livemax")
        self.by_namespace = (Counter("prefixscope_gateway_namespace_cached_tokens",
                                     "Cached tokens by namespace digest (bounded)",
                                     ["namespace_digest"], registry=r)
                             if namespace_labels else None)
        for inv in INVARIANTS:
            self.invariants.labels(inv)
        for basis in ("exact", "upper_bound"):
            self.candidate_tokens.labels(basis)
        for s in SCOPES:
            self.prompt_tokens.labels(s)
            self.cached_tokens.labels(s)

    def child(self, family, *labels: str):
        """``family.labels(*labels)``, remembered: the hot path looks each label set up once
        (every label here has a bounded set of values: endpoints, scopes, status classes,
        decisions, reasons, bases)."""
        key = (id(family), labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = family.labels(*labels)
        return c

    def namespace(self, ns_digest: str, cached: int) -> None:
        """Count cached tokens for a namespace digest (bounded cardinality)."""
        if self.by_namespace is None:
            return
        if ns_digest not in self._namespaces and len(self._namespaces) < self.namespace_labels:
            self._namespaces.add(ns_digest)
        label = ns_digest if ns_digest in self._namespaces else "other"
        self.child(self.by_namespace, label).inc(cached)

    def exposition(self) -> bytes:
        """The text exposition of every family; with ``PROMETHEUS_MULTIPROC_DIR`` set (the
        gateway's ``workers`` > 1) the sum over every worker process (gauges: the most recent
        / the highest value of a live worker)."""
        d = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if d:
            from prometheus_client import multiprocess

            reg = CollectorRegistry()
            multiprocess.MultiProcessCollector(reg, path=d)
            return generate_latest(reg)
        return generate_latest(self.registry)
