"""A week of production-like traffic made by replaying real conversations (the demo's story).

Pure computation and file writing (no DuckDB, no HTTP): :func:`build_week` replays captured
conversations through the exact cache model (:func:`prefixscope.replay.sim.simulate`, one cache
per instance) at realistic rates and writes what a production deployment gives prefixscope:

- ``usage/<instance>.jsonl``: the prefixscope usage log (``docs/ingest.md``), one line per
  request with ``usage.prompt_tokens_details.cached_tokens`` from the cache model and
  ``ttft_ms`` / ``latency_ms`` from the latency model below;
- ``prometheus/<instance>.json``: a saved Prometheus ``/api/v1/query_range`` response (matrix)
  of the instance's vLLM series, scraped every :data:`SCRAPE_EVERY_S` seconds: the counters
  ``vllm:prefix_cache_queries_total`` / ``_hits_total``, ``vllm:prompt_tokens_total``,
  ``vllm:request_success_total``, ``vllm:num_preemptions_total``, the gauges
  ``vllm:kv_cache_usage_perc``, ``vllm:num_requests_running`` / ``_waiting``, and the TTFT
  histogram ``vllm:time_to_first_token_seconds`` (vLLM 0.32's buckets) every
  :data:`HISTOGRAM_EVERY_S` s, ``<family>_created`` series as Prometheus stores them;
- ``chatlog-<instance>-<day>.jsonl``: the chat requests (``chat`` trace format: OpenAI
  ``messages``) of the first :data:`CHAT_LOG_HOURS` hours after the release on one instance,
  the input of ``prefixscope replay sim`` (and of ``prefixscope diagnose``).

The traffic (all times UTC, seeded, so a build is reproducible for a given ``end``):

1. Two models on three instances: :data:`INSTANCES`. ``coder-7b`` (a coding assistant, on
   ``gpu-a1`` and ``gpu-a2``) replays the 70 real aider chats of
   ``data/captures/aider/chat-requests.jsonl``: each session is one chat, after aider's system
   prompt (``prefixscope.replay.chat_captures.AIDER_STYLE_SYSTEM_PROMPT`` with the day's date)
   and a per-session repository-summary exchange (as aider sends its repo map), with think
   times between inputs. ``agent-32b`` (a coding agent, on ``gpu-b1``) replays real Claude
   Code conversations (``data/traces/kv-cache-tester``, :data:`AGENT_TRACES`) with their own
   inter-request times; their system prompt and tool blocks are shared by every session.
2. Sessions arrive as a Poisson process whose rate follows the hour of day (peak 14-18 UTC),
   the same curve every day: no calendar weekend dip, so the release day (day 5) carries a
   normal day's traffic whatever weekday the demo is built on, and its miss cost steps up.
3. The release: from ``release_s`` (day 5 of the week, 07:00 UTC on ``gpu-a1``, 09:30 on
   ``gpu-a2``) the coder's system prompt starts with ``Current time: YYYY-MM-DD HH:MM UTC``:
   its first block changes every minute, so vLLM's chained block hashes share nothing across
   minutes and the hit rate falls below 50%.

Latency model (what the counters and ``ttft_ms`` cannot get from the cache model, which has no
clock): one prefill lane per instance, first come first served; a request's prefill takes
``prefill_base_s + uncached prompt tokens / prefill_tokens_per_s``; TTFT = wait + prefill;
decoding takes ``tpot_s`` per output token. ``num_requests_running`` counts requests between
prefill start and finish, ``num_requests_waiting`` those queued for the lane,
``kv_cache_usage_perc`` the running requests' uncached prompt and output blocks plus the largest
cached prefix among them over the pool (capped at 1), and a request whose start would take the
pool over ``num_gpu_blocks`` counts one preemption.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from prefixscope.core.paths import data_file
from prefixscope.replay.chat_captures import AIDER_STYLE_SYSTEM_PROMPT
from prefixscope.replay.sim import simulate
from prefixscope.replay.types import SimConfig, TraceRequest

DAY_S = 86400.0
SCRAPE_EVERY_S = 15.0
#: The TTFT histogram's 25 series are kept at 1-minute resolution (a downsampled recording,
#: to keep the demo build under two minutes); the counters and gauges are every 15 s.
HISTOGRAM_EVERY_S = 60.0
#: vLLM 0.32 ``vllm:time_to_first_token_seconds`` buckets (``vllm/v1/metrics/loggers.py``).
TTFT_BUCKETS_S: tuple[float, ...] = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                     0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                                     640.0, 2560.0)
CHAT_LOG_HOURS = 2.0
AIDER_CHATS = data_file("captures", "aider", "chat-requests.jsonl")
AGENT_DIR = data_file("traces", "kv-cache-tester")
#: The smaller Claude Code conversations of the bundled selection (mean prompt under 45k tokens).
AGENT_TRACES: tuple[str, ...] = ("trace_0002", "trace_0021", "trace_0187", "trace_0228",
                                 "trace_0472", "trace_0556")
CODER_MODEL = "coder-7b"
AGENT_MODEL = "agent-32b"
#: The line the release puts at the top of the coder's system prompt (minute resolution).
TIMESTAMP_LINE = "Current time: {stamp} UTC\n"


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One vLLM instance of the demo deployment.

    Attributes:
        name, model: instance name (Prometheus ``instance``) and served model name.
        block_size: tokens per KV block; num_gpu_blocks: the pool (vLLM ``num_gpu_blocks``).
        sessions_per_hour_peak: session arrival rate at the daily peak (every day).
        prefill_tokens_per_s, prefill_base_s, tpot_s: the latency model (module docstring).
        release_hour_utc: hour (fractional) of day 5 at which the release reaches this
            instance, or None when the release does not touch it.
    """

    name: str
    model: str
    block_size: int
    num_gpu_blocks: int
    sessions_per_hour_peak: float
    prefill_tokens_per_s: float
    prefill_base_s: float
    tpot_s: float
    release_hour_utc: float | None = None


INSTANCES: tuple[InstanceSpec, ...] = (
    InstanceSpec("gpu-a1", CODER_MODEL, 16, 12_000, 122.0, 9_000.0, 0.025, 0.012, 7.0),
    InstanceSpec("gpu-a2", CODER_MODEL, 16, 12_000, 97.0, 9_000.0, 0.025, 0.012, 9.5),
    InstanceSpec("gpu-b1", AGENT_MODEL, 64, 16_000, 4.0, 6_000.0, 0.08, 0.030, None),
)


@dataclass
class InstanceWeek:
    """What :func:`build_week` produced for one instance (totals for the build report)."""

    spec: InstanceSpec
    usage_path: Path
    prometheus_path: Path
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    preemptions: int = 0
    chat_log: Path | None = None
    release_unix_s: float | None = None


@dataclass
class WeekResult:
    """The files of a built week and its time span (Unix seconds)."""

    out_dir: Path
    start_unix_s: float
    end_unix_s: float
    instances: list[InstanceWeek] = field(default_factory=list)

    @property
    def release_day(self) -> str:
        """The UTC day (``YYYY-MM-DD``) of the release."""
        return _day(self.start_unix_s + 4 * DAY_S)


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d")


def week_span(end_unix_s: float) -> tuple[float, float]:
    """``(start, end)`` of the week ending at ``end_unix_s``: day 7 is the UTC day the end
    falls in (the day before when the end is a UTC midnight, so a week ending at midnight is
    seven full days), start is that day's midnight six days before, day 5 two days before."""
    day7 = math.ceil(end_unix_s / DAY_S) * DAY_S - DAY_S
    return day7 - 6 * DAY_S, float(end_unix_s)


def full_week_end(now_unix_s: float) -> float:
    """The end of the demo's week for a build at ``now_unix_s``: the last UTC midnight at or
    before it, so the week is the seven full UTC days before the build's day and every figure
    of it is the same whatever the hour of the build (a week ending at the build time had a
    day 7 of 30 minutes for a build at 00:30, of 24 hours at 23:59)."""
    return math.floor(float(now_unix_s) / DAY_S) * DAY_S


def rate_factor(ts_unix_s: float) -> float:
    """Traffic level at a time, 0..1: a daily curve (trough 03 UTC, peak 14-18 UTC), the same
    every day (no weekend dip: the release day must carry a normal day's traffic)."""
    dt = datetime.fromtimestamp(ts_unix_s, tz=timezone.utc)
    hour = dt.hour + dt.minute / 60.0
    daily = 0.08 + 0.92 * max(0.0, math.sin(math.pi * (hour - 5.0) / 16.0)) ** 1.5 \
        if 5.0 <= hour <= 21.0 else 0.08
    return daily


def session_starts(rng: random.Random, start_s: float, end_s: float,
                   peak_per_hour: float) -> list[float]:
    """Session start times (Unix s, ascending): a Poisson process thinned by :func:`rate_factor`."""
    lam = peak_per_hour / 3600.0
    out: list[float] = []
    t = start_s
    while True:
        t += rng.expovariate(lam)
        if t >= end_s:
            return out
        if rng.random() < rate_factor(t):
            out.append(t)


# --------------------------------------------------------------------------------------------
# coder sessions: real aider chats
# --------------------------------------------------------------------------------------------

class _CoderTokens:
    """Token ids of coder requests, built from cached pieces: the rendered system prompt (per
    day and timestamp), the session's repository exchange, and the rest of the chat."""

    def __init__(self, chats: list[list[dict]]) -> None:
        from prefixscope.replay.tokenization import load_chat_tokenizer

        self.tok = load_chat_tokenizer()
        self.chats = chats
        self._sys: dict[str, tuple[str, list[int]]] = {}
        self._rest: dict[tuple[int, int], list[int]] = {}
        self._out: dict[tuple[int, int], int] = {}
        self._repo: dict[tuple[str, ...], list[int]] = {}

    @staticmethod
    def system_text(day: str, stamp: str | None) -> str:
        text = AIDER_STYLE_SYSTEM_PROMPT.format(date=day)
        return TIMESTAMP_LINE.format(stamp=stamp) + text if stamp else text

    @staticmethod
    def repo_exchange(session: str, rng: random.Random) -> list[dict]:
        org = rng.choice(("acme", "globex", "initech", "umbrella", "hooli", "stark"))
        repo = rng.choice(("payments", "web", "infra", "mobile", "search", "billing", "auth"))
        sha = hashlib.sha1(f"{session}".encode()).hexdigest()[:10]
        files = ", ".join(rng.sample(("src/app.py", "src/models.py", "tests/test_api.py",
                                      "setup.cfg", "README.md", "src/cli.py", "docs/usage.md"), 3))
        return [{"role": "user", "content": f"Repository {org}/{repo} at {sha}. Files: {files}."},
                {"role": "assistant", "content": "Ok, I will only edit those files after asking."}]

    def prompt(self, chat: int, turn: int, day: str, stamp: str | None,
               repo: list[dict]) -> tuple[list[int], list[dict]]:
        system = {"role": "system", "content": self.system_text(day, stamp)}
        key = f"{day}|{stamp}"
        if key not in self._sys:
            text = self.tok.render([system], add_generation_prompt=False)
            self._sys[key] = (text, self.tok.encode(text))
        sys_text, sys_ids = self._sys[key]
        # the session's repository exchange renders the same after any system prompt (the
        # template renders message by message, as the ``_rest`` cache below also relies on):
        # rendered and encoded once per session, not once per request
        rkey = tuple(m["content"] for m in repo)
        if rkey not in self._repo:
            repo_text = self.tok.render([system, *repo],
                                        add_generation_prompt=False)[len(sys_text):]
            self._repo[rkey] = self.tok.encode(repo_text)
        msgs = self.chats[chat][1:1 + 2 * turn + 1]  # user, assistant, ..., user (this input)
        if (chat, turn) not in self._rest:
            base = [system, *repo]
            head = self.tok.render(base, add_generation_prompt=False)
            full = self.tok.render(base + msgs)
            self._rest[(chat, turn)] = self.tok.encode(full[len(head):])
        ids = sys_ids + self._repo[rkey] + self._rest[(chat, turn)]
        return ids, [system, *repo, *msgs]

    def output_tokens(self, chat: int, turn: int, reply: str) -> int:
        if (chat, turn) not in self._out:
            self._out[(chat, turn)] = max(1, len(self.tok.encode(reply)))
        return self._out[(chat, turn)]


def _aider_chats() -> list[tuple[list[dict], list[str]]]:
    """The aider chats: ``(messages of the last request + its reply, replies per turn)``."""
    by_conv: dict[str, list[dict]] = {}
    for line in AIDER_CHATS.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        by_conv.setdefault(rec["conversation"], []).append(rec)
    chats = []
    for recs in by_conv.values():
        last = recs[-1]
        msgs = [dict(m) for m in last["messages"]]
        replies = [r.get("response_text") or "" for r in recs]
        msgs.append({"role": "assistant", "content": replies[-1]})
        chats.append((msgs, replies))
    return chats


def _coder_requests(spec: InstanceSpec, rng: random.Random, start_s: float, end_s: float,
                    release_s: float | None, tokens: _CoderTokens,
                    replies: list[list[str]], chat_log: list[dict]) -> list[TraceRequest]:
    reqs: list[TraceRequest] = []
    log_end = None if release_s is None else release_s + CHAT_LOG_HOURS * 3600.0
    for n, s0 in enumerate(session_starts(rng, start_s, end_s, spec.sessions_per_hour_peak)):
        chat = rng.randrange(len(tokens.chats))
        repo = tokens.repo_exchange(f"{spec.name}-{n}", rng)
        t = s0
        for turn in range(len(replies[chat])):
            if t >= end_s:
                break
            stamp = None
            if release_s is not None and t >= release_s:
                stamp = datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
            ids, messages = tokens.prompt(chat, turn, _day(t), stamp, repo)
            rid = f"{spec.name}-{n:06d}-{turn + 1:02d}"
            out = tokens.output_tokens(chat, turn, replies[chat][turn])
            reqs.append(TraceRequest(request_id=rid, arrival_s=t, num_prompt_tokens=len(ids),
                                     prompt_token_ids=ids, output_tokens=out, model=spec.model))
            if log_end is not None and release_s <= t < log_end:
                chat_log.append({"t": round(t - release_s, 3), "request_id": rid,
                                 "conversation": f"{spec.name}-{n:06d}", "model": spec.model,
                                 "messages": messages, "response_text": replies[chat][turn]})
            t += 20.0 + rng.lognormvariate(math.log(45.0), 0.6)
    return reqs


# --------------------------------------------------------------------------------------------
# agent sessions: real Claude Code conversations (kv-cache-tester traces)
# --------------------------------------------------------------------------------------------

def _agent_conversations(block_size: int) -> list[tuple[list[TraceRequest], int]]:
    """Each conversation's requests (arrival from its first request) and the number of leading
    blocks that hold the shared system prompt and tools."""
    from prefixscope.replay.traces import read_trace

    convs = []
    for name in AGENT_TRACES:
        path = AGENT_DIR / f"{name}.json.gz"
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            head = json.load(fh)
        shared = int(head.get("system_tokens", 0) + head.get("tool_tokens", 0)) // block_size
        read = read_trace(str(path), format="kv-cache-tester", block_size=block_size)
        reqs = sorted(read.requests, key=lambda r: r.arrival_s)
        if not reqs:
            continue
        t0 = reqs[0].arrival_s
        # long idle gaps (the user left) are cut to 10 minutes: a session is one sitting
        shifted, t, prev = [], 0.0, t0
        for r in reqs:
            t += min(r.arrival_s - prev, 600.0)
            prev = r.arrival_s
            shifted.append((t, r))
        convs.append(([_replace_arrival(r, t) for t, r in shifted], shared))
    return convs


def _replace_arrival(r: TraceRequest, t: float) -> TraceRequest:
    return TraceRequest(request_id=r.request_id, arrival_s=t, num_prompt_tokens=r.num_prompt_tokens,
                        block_keys=r.block_keys, output_tokens=r.output_tokens, model=r.model,
                        attrs=r.attrs)


def _agent_requests(spec: InstanceSpec, rng: random.Random, start_s: float, end_s: float,
                    convs: list[tuple[list[TraceRequest], int]]) -> list[TraceRequest]:
    reqs: list[TraceRequest] = []
    for n, s0 in enumerate(session_starts(rng, start_s, end_s, spec.sessions_per_hour_peak)):
        conv, shared = convs[rng.randrange(len(convs))]
        for k, r in enumerate(conv):
            t = s0 + r.arrival_s
            if t >= end_s:
                break
            keys = r.block_keys or ()
            # the shared system prompt and tools keep global keys; the rest is the session's own
            new_keys = [("agent-system", i) if i < shared else (n, key)
                        for i, key in enumerate(keys)]
            reqs.append(TraceRequest(request_id=f"{spec.name}-{n:06d}-{k + 1:03d}", arrival_s=t,
                                     num_prompt_tokens=r.num_prompt_tokens, block_keys=new_keys,
                                     output_tokens=r.output_tokens, model=spec.model))
    return reqs


# --------------------------------------------------------------------------------------------
# latency model, counters and files
# --------------------------------------------------------------------------------------------

@dataclass
class _Timed:
    arrival: np.ndarray
    start: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    prompt: np.ndarray
    cached: np.ndarray
    output: np.ndarray
    ttft: np.ndarray
    preempted_at: np.ndarray


def _timing(spec: InstanceSpec, arrival: np.ndarray, prompt: np.ndarray, cached: np.ndarray,
            output: np.ndarray) -> _Timed:
    n = len(arrival)
    prefill = spec.prefill_base_s + (prompt - cached) / spec.prefill_tokens_per_s
    start = np.empty(n)
    free = -math.inf
    for i in range(n):  # one FIFO prefill lane
        s = arrival[i] if arrival[i] > free else free
        start[i] = s
        free = s + prefill[i]
    first = start + prefill
    finish = first + output * spec.tpot_s
    bs = spec.block_size
    own = np.ceil((prompt - cached + output) / bs)
    # blocks in use when each request starts: own blocks of the requests running then
    order_f = np.sort(finish)
    cum_own = np.concatenate([[0.0], np.cumsum(own)])
    fin_idx = np.argsort(finish)
    cum_own_f = np.concatenate([[0.0], np.cumsum(own[fin_idx])])
    started = np.searchsorted(start, start, side="right")  # start is non-decreasing
    done = np.searchsorted(order_f, start, side="right")
    in_use = cum_own[started] - cum_own_f[done] + np.ceil(cached / bs)
    preempted = start[in_use > spec.num_gpu_blocks]
    return _Timed(arrival, start, first, finish, prompt, cached, output, first - arrival, preempted)


def _cum_at(times: np.ndarray, values: np.ndarray | None, grid: np.ndarray) -> np.ndarray:
    order = np.argsort(times, kind="stable")
    t = times[order]
    c = np.concatenate([[0.0], np.cumsum(values[order] if values is not None
                                         else np.ones(len(t)))])
    return c[np.searchsorted(t, grid, side="right")]


def _series(name: str, labels: dict[str, str], grid: np.ndarray, values: np.ndarray) -> dict:
    return {"metric": {"__name__": name, **labels},
            "values": [[round(float(t), 3), repr(float(v))] for t, v in zip(grid, values)]}


def prometheus_matrix(spec: InstanceSpec, timed: _Timed, *, start_s: float, end_s: float,
                      created_s: float) -> dict:
    """The instance's series as a Prometheus ``query_range`` response body (matrix)."""
    grid = np.arange(math.ceil(start_s / SCRAPE_EVERY_S) * SCRAPE_EVERY_S, end_s, SCRAPE_EVERY_S)
    hgrid = grid[np.isclose(np.mod(grid, HISTOGRAM_EVERY_S), 0.0)]
    base = {"instance": spec.name, "job": "vllm", "engine": "0", "model_name": spec.model}
    out: list[dict] = []
    admitted = timed.start
    out.append(_series("vllm:prefix_cache_queries_total", base, grid,
                       _cum_at(admitted, timed.prompt, grid)))
    out.append(_series("vllm:prefix_cache_hits_total", base, grid,
                       _cum_at(admitted, timed.cached, grid)))
    out.append(_series("vllm:prompt_tokens_total", base, grid,
                       _cum_at(timed.first_token, timed.prompt, grid)))
    out.append(_series("vllm:request_success_total", {**base, "finished_reason": "stop"}, grid,
                       _cum_at(timed.finish, None, grid)))
    out.append(_series("vllm:num_preemptions_total", base, grid,
                       _cum_at(timed.preempted_at, None, grid)))
    running = _cum_at(timed.start, None, grid) - _cum_at(timed.finish, None, grid)
    waiting = _cum_at(timed.arrival, None, grid) - _cum_at(timed.start, None, grid)
    bs = spec.block_size
    own = np.ceil((timed.prompt - timed.cached + timed.output) / bs)
    blocks = _cum_at(timed.start, own, grid) - _cum_at(timed.finish, own, grid)
    blocks = blocks + np.where(running > 0, np.ceil(np.max(timed.cached, initial=0) / bs) * 0.5, 0)
    out.append(_series("vllm:num_requests_running", base, grid, running))
    out.append(_series("vllm:num_requests_waiting", base, grid, waiting))
    out.append(_series("vllm:kv_cache_usage_perc", base, grid,
                       np.minimum(1.0, blocks / spec.num_gpu_blocks)))
    for le in (*TTFT_BUCKETS_S, math.inf):
        mask = timed.ttft <= le
        out.append(_series("vllm:time_to_first_token_seconds_bucket",
                           {**base, "le": "+Inf" if le == math.inf else repr(le)}, hgrid,
                           _cum_at(timed.first_token[mask], None, hgrid)))
    out.append(_series("vllm:time_to_first_token_seconds_sum", base, hgrid,
                       _cum_at(timed.first_token, timed.ttft, hgrid)))
    out.append(_series("vllm:time_to_first_token_seconds_count", base, hgrid,
                       _cum_at(timed.first_token, None, hgrid)))
    for fam in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
                "vllm:num_preemptions", "vllm:time_to_first_token_seconds"):
        out.append({"metric": {"__name__": fam + "_created", **base},
                    "values": [[round(float(grid[0]), 3), repr(created_s)]]})
    out.append({"metric": {"__name__": "vllm:request_success_created", **base,
                           "finished_reason": "stop"},
                "values": [[round(float(grid[0]), 3), repr(created_s)]]})
    info = {**base, "block_size": str(bs), "num_gpu_blocks": str(spec.num_gpu_blocks),
            "prefix_caching_hash_algo": "sha256", "enable_prefix_caching": "True"}
    cgrid = grid[np.isclose(np.mod(grid, 900.0), 0.0)]
    out.append(_series("vllm:cache_config_info", info, cgrid, np.ones(len(cgrid))))
    return {"status": "success", "data": {"resultType": "matrix", "result": out}}


def _write_usage(path: Path, spec: InstanceSpec, ids: Sequence[str], timed: _Timed) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for i, rid in enumerate(ids):
            p, c, o = int(timed.prompt[i]), int(timed.cached[i]), int(timed.output[i])
            rec = {"ts_unix_s": round(float(timed.arrival[i]), 3), "request_id": rid,
                   "instance": spec.name, "model": spec.model, "endpoint": "chat",
                   "ttft_ms": round(float(timed.ttft[i]) * 1000.0, 1),
                   "latency_ms": round(float(timed.finish[i] - timed.arrival[i]) * 1000.0, 1),
                   "usage": {"prompt_tokens": p, "completion_tokens": o, "total_tokens": p + o,
                             "prompt_tokens_details": {"cached_tokens": c}}}
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")


def build_week(out_dir: str | os.PathLike[str], *, end_unix_s: float, seed: int = 20261201,
               instances: Sequence[InstanceSpec] = INSTANCES,
               progress: Callable[[InstanceWeek], None] | None = None) -> WeekResult:
    """Make the week's usage logs, Prometheus ranges and the release-day chat log in ``out_dir``.

    Args:
        out_dir: created if missing; files of an earlier build there are replaced.
        end_unix_s: the end of the week (the last scrape is before it), Unix seconds.
        seed: the random seed (session arrivals, chats picked, think times).
        instances: the deployment (default :data:`INSTANCES`).
        progress: called with each instance's :class:`InstanceWeek` once its files are written.

    Returns:
        A :class:`WeekResult` with each instance's files and totals.

    Raises:
        SourceUnavailable, ParseError: a bundled capture is missing or unreadable.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start_s, end_s = week_span(end_unix_s)
    result = WeekResult(out, start_s, end_s)
    chats = _aider_chats()
    coder_tokens = _CoderTokens([c[0] for c in chats])
    replies = [c[1] for c in chats]
    agent_convs: dict[int, list] = {}
    for k, spec in enumerate(instances):
        rng = random.Random(seed * 31 + k)
        release_s = (start_s + 4 * DAY_S + spec.release_hour_utc * 3600.0
                     if spec.release_hour_utc is not None else None)
        chat_log: list[dict] = []
        if spec.model == AGENT_MODEL:
            if spec.block_size not in agent_convs:
                agent_convs[spec.block_size] = _agent_conversations(spec.block_size)
            reqs = _agent_requests(spec, rng, start_s, end_s, agent_convs[spec.block_size])
        else:
            reqs = _coder_requests(spec, rng, start_s, end_s, release_s, coder_tokens, replies,
                                   chat_log)
        reqs.sort(key=lambda r: r.arrival_s)
        config = SimConfig(block_size=spec.block_size, num_gpu_blocks=spec.num_gpu_blocks,
                           hash_algo="fast", simulate_output=True)
        ids, arrival, prompt, cached, output = [], [], [], [], []
        for r in simulate(reqs, config):
            if r.rejected_reason is not None:
                continue
            ids.append(r.request_id)
            arrival.append(r.arrival_s)
            prompt.append(r.prompt_tokens)
            cached.append(r.cached_tokens)
            output.append(r.completion_tokens)
        timed = _timing(spec, np.asarray(arrival, float), np.asarray(prompt, float),
                        np.asarray(cached, float), np.asarray(output, float))
        iw = InstanceWeek(spec, out / "usage" / f"{spec.name}.jsonl",
                          out / "prometheus" / f"{spec.name}.json", requests=len(ids),
                          prompt_tokens=int(sum(prompt)), cached_tokens=int(sum(cached)),
                          preemptions=len(timed.preempted_at), release_unix_s=release_s)
        _write_usage(iw.usage_path, spec, ids, timed)
        iw.prometheus_path.parent.mkdir(parents=True, exist_ok=True)
        iw.prometheus_path.write_text(json.dumps(prometheus_matrix(
            spec, timed, start_s=start_s, end_s=end_s, created_s=start_s - 60.0),
            separators=(",", ":")), encoding="utf-8")
        if chat_log:
            iw.chat_log = out / f"chatlog-{spec.name}-{_day(release_s)}.jsonl"
            with open(iw.chat_log, "w", encoding="utf-8") as fh:
                for line in chat_log:
                    fh.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
        result.instances.append(iw)
        if progress is not None:
            progress(iw)
    return result
