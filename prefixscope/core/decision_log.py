"""The decision-log record and the rules both gateways share (``docs/scopes.md#decision-log``).

The replay model (``replay/gateway.py``) and the live gateway (``gateway/``) write the same
record, so ``prefixscope ingest decisions`` reads both unchanged. Pure: no I/O.

Rules kept here so that there is one implementation:

1. :func:`candidate_tokens`: tokens a candidate object can supply to a request of ``n`` prompt
   tokens: ``floor(min(object tokens, n - 1) / B) * B`` (vLLM 0.33
   ``kv_cache_manager.get_computed_blocks``: at most ``floor((n - 1) / B)`` full blocks hit, the
   last prompt token is always recomputed).
2. :func:`lookup_key`: the registry lookup key, 16 bytes of SHA-256(namespace, material); a
   short key is never accepted on its own (``check_acceptance`` compares the full identity).
3. :data:`ERROR_CODES`: why a request ended without a usable upstream answer (closed set, never
   free text, so no value can leak into a table).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Error codes a decision record may carry (``error``; absent when the request completed).
ERROR_CODES = (
    "bad_request",        # body is not JSON, not an object, or misses required fields
    "unknown_model",      # no upstream serves the requested model
    "too_large",          # body above the configured limit
    "upstream_timeout",   # no answer (connect or read) within the timeouts
    "upstream_error",     # the upstream could not be reached or answered with a 5xx
    "upstream_dropped",   # the upstream closed a stream before its end
    "client_disconnected",  # the client went away before the answer was complete
    "upstream_status",    # the upstream answered 4xx (its body is passed through)
    "client_timeout",     # the client did not send its whole body within client_body_timeout_s
    "gateway_shutdown",   # the gateway stopped (SIGTERM) and its grace period ran out
    "internal_error",     # a bug in the gateway (a JSON 500 / an SSE error event, one log line)
)


#: Values of ``DecisionRecord.candidate_tokens_basis``.
CANDIDATE_TOKEN_BASES = ("exact", "upper_bound")


def candidate_tokens(num_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """Tokens a stored object of ``num_tokens`` can supply to a prompt of ``prompt_tokens``
    (rule 1); 0 when the prompt is empty or unknown (``prompt_tokens`` <= 0)."""
    if prompt_tokens <= 0 or block_size <= 0:
        return 0
    return (min(num_tokens, prompt_tokens - 1) // block_size) * block_size


def lookup_key(namespace: str, material: str) -> bytes:
    """Registry lookup key (rule 2): the first 16 bytes of SHA-256(namespace NUL material)."""
    return hashlib.sha256(f"{namespace}\x00{material}".encode()).digest()[:16]


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One line of the decision log (``docs/scopes.md#decision-log``). Never a raw id.

    Attributes:
        ts_unix_s: decision time (Unix seconds).
        decision: ``accept``, ``reject`` or ``miss`` (no candidate).
        reasons: mismatching fields in check order (the first is ``first_mismatch``).
        candidate_cached_tokens: tokens the candidate could supply (:func:`candidate_tokens`).
        accepted_cached_tokens: the same when accepted, else 0.
        expected, candidate: short identities (``CacheIdentity.short``); candidate None for a
            miss.
        error: one of :data:`ERROR_CODES` when the request failed, else None (not written).
        client_salt_replaced: the live gateway replaced a ``cache_salt`` the client sent
            (None: not applicable, not written).
        candidate_tokens_basis: how the live gateway got ``candidate_cached_tokens``:
            ``exact`` (from the token ids of both prompts, gateway ``tokenize = "upstream"``:
            the whole blocks the candidate's prompt shares with this one, at most
            prompt_tokens - 1, as vLLM counts them; a miss is 0 exactly) or ``upper_bound``
            (the candidate writer's prompt tokens, without token ids); None: not written.
        bypass: True when the live gateway's cache bypass (``/admin/bypass``) was on: the
            request went with a salt unique to it, so nothing was accepted for use
            (``accepted_cached_tokens`` 0; ``decision`` is still what the identity check
            found, ``candidate_cached_tokens`` what it would have reused); None: not written.
    """

    ts_unix_s: float
    request_id: str
    scope: str
    namespace_digest: str
    decision: str
    reasons: tuple[str, ...]
    candidate_cached_tokens: int
    accepted_cached_tokens: int
    salt_applied: bool
    expected: Mapping[str, Any]
    candidate: Mapping[str, Any] | None = None
    candidate_request_id: str | None = None
    run_id: str | None = None
    instance: str | None = None
    model: str | None = None
    error: str | None = None
    client_salt_replaced: bool | None = None
    candidate_tokens_basis: str | None = None
    bypass: bool | None = None

    def __post_init__(self) -> None:
        assert self.error is None or self.error in ERROR_CODES, self.error
        assert self.candidate_tokens_basis in (None, *CANDIDATE_TOKEN_BASES)

    @property
    def first_mismatch(self) -> str | None:
        """The first mismatching field, or None."""
        return self.reasons[0] if self.reasons else None

    def as_json(self) -> dict[str, Any]:
        """The JSON object of the decision log line."""
        out: dict[str, Any] = {
            "v": 1, "record": "decision", "ts_unix_s": round(self.ts_unix_s, 6),
            "request_id": self.request_id, "scope": self.scope,
            "namespace_digest": self.namespace_digest, "decision": self.decision,
            "first_mismatch": self.first_mismatch, "reasons": list(self.reasons),
            "candidate_cached_tokens": self.candidate_cached_tokens,
            "accepted_cached_tokens": self.accepted_cached_tokens,
            "salt_applied": self.salt_applied, "expected": dict(self.expected),
            "candidate": None if self.candidate is None else dict(self.candidate),
            "candidate_request_id": self.candidate_request_id,
        }
        for k in ("run_id", "instance", "model", "error", "client_salt_replaced",
                  "candidate_tokens_basis", "bypass"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out


def event_record(ts_unix_s: float, event: str, *, run_id: str | None = None,
                 namespace_digest: str | None = None,
                 new_value: str | int | None = None) -> dict[str, Any]:
    """A version-event line of the decision log (``docs/scopes.md#decision-log``)."""
    rec: dict[str, Any] = {"v": 1, "record": "event", "ts_unix_s": round(ts_unix_s, 6),
                           "event": event}
    if run_id is not None:
        rec["run_id"] = run_id
    if namespace_digest is not None:
        rec["namespace_digest"] = namespace_digest
    if new_value is not None:
        rec["new_value"] = new_value
    return rec
