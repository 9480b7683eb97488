"""A step-time model for the step scheduler, fitted to a live run's per-request timestamps.

The step model (``replay/scheduler.py``) advances its clock by one step duration per engine
step. A constant (``step_time_s``) cannot follow a loaded engine whose steps take longer when
they carry a prefill or more decodes, and which requests run together (blocks pinned, a
parent's output block not full yet, freed blocks still cached) depends on that clock. This
module fits

    step_s = a + b * P + c * D

(``a`` = ``ConcurrencyConfig.step_time_s``, ``b`` = ``step_token_s`` per prefill token
scheduled in the step, ``c`` = ``step_decode_s`` per request decoding in the step) by least
squares from what a client records for every request: send time, first token (TTFT) and end of
the answer, prompt, cached and completion tokens (``replay live``'s ``requests.jsonl``).

One equation per request *i* with at least 2 output tokens: its decode lasted from the first
token ``F_i`` to the end ``E_i`` and took exactly ``out_i - 1`` engine steps (one token per step,
no speculative decoding; vLLM 0.32 ``Scheduler.update_from_output``), so

    E_i - F_i = a * (out_i - 1) + b * P_i + c * D_i

with ``P_i`` = the prefill tokens computed in those steps (``prompt_j - cached_j`` of every other
request whose first token falls in ``(F_i, E_i]``: its prefill ran in the step that produced its
first token; prompts longer than the step budget are split, the sum is the same) and ``D_i`` =
the decodes run in them (``out_i - 1`` of its own, plus for every other request decoding in the
overlap its share ``(out_i - 1) * overlap / (E_i - F_i)``, at most ``out_j - 1``: requests running
together share steps). The solution is constrained to ``a, b, c >= 0`` (every subset of the
three is solved and the best non-negative one kept).

Memory: one small tuple per request and an interval sweep; meant for one live run (thousands
of requests), not a 10 M-request log.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prefixscope.core.errors import UsageError


BUNCHED_FRACTION = 0.3  # decode intervals below this share of the median s/step are dropped


@dataclass(frozen=True, slots=True)
class RequestTiming:
    """One request as a client saw it (seconds on one clock, e.g. Unix time).

    Attributes:
        request_id: any id (for messages).
        sent_s: when the request was sent.
        first_token_s: when its first generated token arrived (send + TTFT).
        finished_s: when its answer ended (send + latency).
        prompt_tokens: ``usage.prompt_tokens``.
        cached_tokens: ``usage.prompt_tokens_details.cached_tokens`` (0 when not reported).
        output_tokens: ``usage.completion_tokens``.
    """

    request_id: str
    sent_s: float
    first_token_s: float
    finished_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class StepTimeFit:
    """Fitted step-time coefficients (see the module docstring).

    Attributes:
        step_time_s: ``a``, seconds per step (``ConcurrencyConfig.step_time_s``,
            ``replay sim --step-time``).
        step_token_s: ``b``, seconds per prefill token (``--step-token-time``).
        step_decode_s: ``c``, seconds per decoding request (``--step-decode-time``).
        requests: requests with timings given.
        equations: requests used (at least 2 output tokens, not bunched).
        rms_residual_s: root mean square of ``E_i - F_i`` minus its fitted value, seconds.
        mean_decode_s: mean of ``E_i - F_i`` over the equations, seconds (scale of the residual).
    """

    step_time_s: float
    step_token_s: float
    step_decode_s: float
    requests: int
    equations: int
    rms_residual_s: float
    mean_decode_s: float

    def as_dict(self) -> dict[str, float | int]:
        """The fit as a JSON-ready dict (the ``replay fit-steps --json`` fields)."""
        return {"step_time_s": self.step_time_s, "step_token_s": self.step_token_s,
                "step_decode_s": self.step_decode_s, "requests": self.requests,
                "equations": self.equations, "rms_residual_s": self.rms_residual_s,
                "mean_decode_s": self.mean_decode_s}

    def sim_flags(self) -> str:
        """The ``replay sim`` options that use this fit."""
        return (f"--step-time {self.step_time_s:.6g} --step-token-time {self.step_token_s:.6g} "
                f"--step-decode-time {self.step_decode_s:.6g}")


def _equations(timings: Sequence[RequestTiming]) -> tuple[list[tuple[float, float, float]],
                                                          list[float]]:
    rows: list[tuple[float, float, float]] = []
    ys: list[float] = []
    by_first = sorted(timings, key=lambda t: t.first_token_s)
    firsts = [t.first_token_s for t in by_first]
    for t in timings:
        steps = t.output_tokens - 1
        dur = t.finished_s - t.first_token_s
        if steps < 1 or dur <= 0:
            continue
        lo, hi = t.first_token_s, t.finished_s
        prefill = 0.0
        decodes = float(steps)
        # requests whose first token (end of their prefill step) falls inside (lo, hi]
        k = bisect.bisect_right(firsts, lo)
        while k < len(by_first) and firsts[k] <= hi:
            o = by_first[k]
            if o is not t:
                prefill += max(0, o.prompt_tokens - o.cached_tokens)
            k += 1
        # requests decoding during the interval: every one whose decode overlaps it
        k = bisect.bisect_left(firsts, hi)
        for o in by_first[:k]:
            if o is t or o.output_tokens < 2:
                continue
            overlap = min(hi, o.finished_s) - max(lo, o.first_token_s)
            if overlap > 0:
                decodes += min(o.output_tokens - 1, steps * overlap / dur)
        rows.append((float(steps), prefill, decodes))
        ys.append(dur)
    if rows:
        per_step = sorted(y / r[0] for r, y in zip(rows, ys))
        floor = BUNCHED_FRACTION * per_step[len(per_step) // 2]
        kept = [(r, y) for r, y in zip(rows, ys) if y / r[0] >= floor]
        rows, ys = [r for r, _ in kept], [y for _, y in kept]
    return rows, ys


def _lstsq(rows: list[tuple[float, ...]], ys: list[float], cols: tuple[int, ...]
           ) -> tuple[list[float], float] | None:
    """Least squares over the chosen columns by the normal equations (at most 3 unknowns)."""
    n = len(cols)
    ata = [[sum(r[cols[i]] * r[cols[j]] for r in rows) for j in range(n)] for i in range(n)]
    atb = [sum(r[cols[i]] * y for r, y in zip(rows, ys)) for i in range(n)]
    # Gaussian elimination with partial pivoting
    m = [row[:] + [b] for row, b in zip(ata, atb)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    x = [m[i][n] / m[i][i] for i in range(n)]
    full = [0.0, 0.0, 0.0]
    for i, c in enumerate(cols):
        full[c] = x[i]
    sse = sum((y - sum(full[j] * r[j] for j in range(3))) ** 2 for r, y in zip(rows, ys))
    return full, sse


def fit_step_time(timings: Iterable[RequestTiming]) -> StepTimeFit:
    """Fit ``step_s = a + b * prefill tokens + c * decodes`` to per-request timestamps.

    Args:
        timings: the requests of one run (one client clock); failed requests left out.

    Returns:
        The non-negative least-squares coefficients and the residual.

    Raises:
        UsageError: fewer than 3 requests with 2 or more output tokens and a positive decode
            time (nothing to fit).
    """
    ts = list(timings)
    rows, ys = _equations(ts)
    if len(rows) < 3:
        raise UsageError(f"{len(rows)} requests with 2+ output tokens and timings: need 3 to "
                         "fit a step time (replay live with streaming records TTFT)")
    best: tuple[list[float], float] | None = None
    for k in (3, 2, 1):
        for cols in itertools.combinations(range(3), k):
            got = _lstsq(rows, ys, cols)
            if got is None or any(v < 0 for v in got[0]):
                continue
            if best is None or got[1] < best[1] - 1e-15:
                best = got
    assert best is not None  # one column alone with positive data is non-negative
    (a, b, c), sse = best
    return StepTimeFit(step_time_s=a, step_token_s=b, step_decode_s=c, requests=len(ts),
                       equations=len(rows), rms_residual_s=math.sqrt(sse / len(rows)),
                       mean_decode_s=sum(ys) / len(ys))


def timings_from_usage_jsonl(path: str | Path) -> list[RequestTiming]:
    """Read the timings of a ``replay live`` run's ``requests.jsonl`` (``ts_unix_s``,
    ``ttft_ms``, ``latency_ms``, ``usage``); failed lines and lines without TTFT are skipped.

    Raises:
        UsageError: a line is not JSON (``file:line: reason``).
    """
    p = Path(path)
    out: list[RequestTiming] = []
    with p.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError:
                raise UsageError(f"{p}:{n}: not a JSON line") from None
            u = d.get("usage") if isinstance(d, dict) else None
            if not isinstance(u, dict) or d.get("ttft_ms") is None or \
                    d.get("latency_ms") is None or d.get("ts_unix_s") is None:
                continue
            details = u.get("prompt_tokens_details") or {}
            sent = float(d["ts_unix_s"])
            out.append(RequestTiming(
                request_id=str(d.get("trace_request_id") or d.get("request_id") or n),
                sent_s=sent, first_token_s=sent + float(d["ttft_ms"]) / 1000,
                finished_s=sent + float(d["latency_ms"]) / 1000,
                prompt_tokens=int(u.get("prompt_tokens") or 0),
                cached_tokens=int(details.get("cached_tokens") or 0),
                output_tokens=int(u.get("completion_tokens") or 0)))
    return out


def timings_from_live(results: Iterable[object]) -> list[RequestTiming]:
    """The timings of :class:`prefixscope.replay.live.LiveResult` objects (failed or
    non-streamed ones skipped)."""
    out = []
    for r in results:
        if getattr(r, "error", None) is not None or getattr(r, "ttft_ms", None) is None \
                or getattr(r, "latency_ms", None) is None:
            continue
        sent = r.sent_unix_s  # type: ignore[attr-defined]
        out.append(RequestTiming(
            request_id=r.request_id, sent_s=sent,  # type: ignore[attr-defined]
            first_token_s=sent + r.ttft_ms / 1000,  # type: ignore[attr-defined]
            finished_s=sent + r.latency_ms / 1000,  # type: ignore[attr-defined]
            prompt_tokens=r.prompt_tokens or 0,  # type: ignore[attr-defined]
            cached_tokens=r.cached_tokens or 0,  # type: ignore[attr-defined]
            output_tokens=r.completion_tokens or 0))  # type: ignore[attr-defined]
    return out
