"""Tight-cache concurrency fidelity, recorded once and re-simulated offline (docs/fidelity.md).

    .venv/bin/python benchmarks/fidelity_tight_cache.py record OUT_DIR
    .venv/bin/python benchmarks/fidelity_tight_cache.py analyse OUT_DIR [STEP_S] [OLD_SCHEDULER.py]

``record`` starts the real vLLM CPU server of ``tests/vllm_support.py`` with 96 blocks, sends two
tracks of traffic (seed 9: the traffic of ``tests/test_vllm_tight_cache.py``; seed 23: an
independent one, 130 first turns + 20 follow-ups) twice each at 4 in flight and pickles the
results with the engine's arrival order (``seed<N>.pkl``; they hold token ids: keep them out of
the repository). ``analyse`` prints, per run, the share of requests the step model predicts
exactly given the engine's order and the client's send times (step time STEP_S, default 0.02),
and the misses ``(request, vLLM, model, vLLM unstable, follow-up)``; with a scheduler file (e.g.
``git show REV:replay/scheduler.py > old.py``) it uses that version's ``run_concurrent`` for an
A/B on the same captures.
"""

import dataclasses
import importlib.util
import json
import pickle
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TIGHT = dict(max_model_len=1024, num_gpu_blocks_override=96)
SHORT = dict(max_prompt_tokens=900, max_system_chars=1600, max_doc_chars=900)
TRACKS = ((9, 130, 21, "e"), (23, 130, 20, "g"))


def record(out: Path) -> None:
    from prefixscope.replay.live_run import run_live
    from tests.vllm_support import (ServerConfig, build_traffic, engine_arrival_order,
                                    live_config, start_server)

    out.mkdir(parents=True, exist_ok=True)
    server = start_server(ServerConfig(**TIGHT), log_dir=out / "logs")
    try:
        for seed, n, f, prefix in TRACKS:
            reqs = build_traffic(n, seed=seed, salted=True, followups=f, id_prefix=prefix,
                                 **SHORT)
            runs = []
            for k in range(2):
                server.reset_prefix_cache()
                offset = server.log_path.stat().st_size
                summary, results = run_live(reqs, live_config(server, concurrency=4),
                                            out / f"s{seed}-run{k}")
                time.sleep(0.5)
                log = server.log_path.read_bytes()[offset:].decode(errors="replace")
                by_resp = {r.response_id: r.request_id for r in results}
                order = [by_resp[x] for x in engine_arrival_order(log) if x in by_resp]
                runs.append((summary, results, order))
                print(seed, k, summary.cached_tokens, flush=True)
            with open(out / f"seed{seed}.pkl", "wb") as fh:
                pickle.dump({"reqs": reqs, "runs": runs,
                             "num_gpu_blocks": server.num_gpu_blocks()}, fh)
    finally:
        server.stop()


def analyse(out: Path, step: float, old: str | None) -> None:
    import prefixscope.replay.sim as simmod
    from prefixscope.replay.live_outputs import results_as_trace
    from prefixscope.replay.types import ConcurrencyConfig, SimConfig

    if old:
        spec = importlib.util.spec_from_file_location("old_scheduler", old)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        simmod.run_concurrent = mod.run_concurrent
    for seed, *_ in TRACKS:
        path = out / f"seed{seed}.pkl"
        if not path.exists():
            continue
        with open(path, "rb") as fh:
            d = pickle.load(fh)
        per_run = [{r.request_id: r.cached_tokens for r in res} for _, res, _ in d["runs"]]
        unstable = {i for i in per_run[0] if any(p[i] != per_run[0][i] for p in per_run[1:])}
        cc = ConcurrencyConfig(max_num_seqs=4, max_num_batched_tokens=2048,
                               enable_chunked_prefill=True, step_time_s=step)
        for _summary, results, order in d["runs"]:
            live = {r.request_id: r for r in results}
            t0 = min(r.sent_unix_s for r in results)
            trace, arrival = [], 0.0
            for t in results_as_trace(results, order=order):
                arrival = max(arrival, live[t.request_id].sent_unix_s - t0)
                trace.append(dataclasses.replace(t, arrival_s=arrival))
            cfg = SimConfig(block_size=32, num_gpu_blocks=d["num_gpu_blocks"], concurrency=cc)
            sim = {r.request_id: r for r in simmod.simulate(trace, cfg)}
            misses = [(i, live[i].cached_tokens, sim[i].cached_tokens, i in unstable,
                       "follows" in live[i].attrs) for i in order
                      if sim[i].cached_tokens != live[i].cached_tokens]
            print(json.dumps({"seed": seed, "step_s": step, "requests": len(results),
                              "agreement": round(1 - len(misses) / len(results), 4),
                              "vllm_cached": sum(r.cached_tokens for r in results),
                              "model_cached": sum(s.cached_tokens for s in sim.values()),
                              "vllm_unstable": len(unstable), "misses": misses}))


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "record":
        record(out)
    else:
        analyse(out, float(sys.argv[3]) if len(sys.argv) > 3 else 0.02,
                sys.argv[4] if len(sys.argv) > 4 else None)
