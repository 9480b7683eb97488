"""Block hashing identical to vLLM's prefix cache (vLLM 0.32 and 0.33).

Rules (vLLM ``vllm/v1/core/kv_cache_utils.py``: ``hash_block_tokens``,
``resolve_none_hash_seed``, ``init_none_hash``, ``generate_block_hash_extra_keys``,
``get_request_block_hasher``; ``vllm/utils/hashing.py``; read in 0.32.0 and 0.33.0):

1. A prompt is cut into blocks of ``block_size`` tokens; only *full* blocks get a hash.
2. Block i's hash is ``H_i = h(serialize((H_{i-1}, tuple(tokens of block i), extra_keys_i)))``
   with ``H_{-1} = NONE_HASH``; ``extra_keys_i`` is None when the block has none. ``H_i`` is the
   raw digest (32 bytes for the SHA-256 variants, 16 for xxh3-128), so it names the whole prefix.
3. Serialisation: pickle at the highest protocol (5) for ``sha256`` and ``xxhash``; canonical
   CBOR (cbor2) for ``sha256_cbor`` and ``xxhash_cbor``.
4. ``NONE_HASH = h(serialize(seed))``. The seed is PYTHONHASHSEED when set (here: the ``seed``
   argument); otherwise ``"vllm-none-hash"`` for the SHA-256 variants and, for the xxhash
   variants, a random 32-byte hex string drawn once per process (``os.urandom(32).hex()``), as
   vLLM does on purpose. Hit counts never depend on the seed; hash *values* do.
5. Extra keys, in this order: ``("lora", name, path)`` on every block of a LoRA request, then
   ``("cache_salt", salt)`` on the first block only (when the salt is non-empty). Multimodal and
   prompt-embedding keys are not modelled (see docs/replay.md).

The ``fast`` algorithm is not vLLM's: it keys each block by the bytes ``parent || tokens``, where
``parent`` is the 64-bit hash of the parent block's key (8 bytes) and ``tokens`` the block's token
ids packed as 64-bit ints; the dict compares keys in full, so equal keys mean equal tokens after
an equal-hashing parent (a false hit needs a 64-bit collision between two different prefixes
*and* identical next tokens). Hit counts are identical to vLLM's; the values are not vLLM hashes.
Trace readers may instead give their own chained block keys (``TraceRequest.block_keys``), used
as they are.

Speed (``sha256`` and ``xxhash``, the pickle-based algorithms): the bytes ``pickle.dumps((parent,
tokens, None), protocol=5)`` have a fixed layout when the tokens are ints in ``[-2**31, 2**31)``
and the block has no extra keys (see :func:`pickle_block_layout`), so a request's token opcodes
are encoded once, vectorised (:func:`pickle_int_opcodes`), and each block is hashed as ``head +
parent + body`` by copying a hash object already fed the head for that body size: byte for byte
what ``pickle.dumps`` writes (checked against it by a property test), without a ``pickle.dumps``
call or a hash set-up per block. Anything else (salted or LoRA blocks, larger ids, blocks over
8,192 tokens, fewer than 4 blocks at once) goes through ``pickle.dumps``. Token ids must be
Python ints, as in vLLM's ``Request.prompt_token_ids`` (the trace readers check it).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
from array import array
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import cbor2
import numpy as np

from prefixscope.core.errors import SimulationError
from prefixscope.replay.native import NATIVE

#: vLLM's fixed seed for the SHA-256 variants when PYTHONHASHSEED is unset (0.32 and 0.33).
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"

#: Hash algorithms with vLLM-identical values (``--prefix-caching-hash-algo``).
VLLM_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
#: All algorithms the simulator accepts: vLLM's plus ``fast`` (same hits, not vLLM's values).
ALGOS = (*VLLM_ALGOS, "fast")

_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL  # 5 on CPython 3.8+, as in vLLM
_RANDOM_XXHASH_SEED: str | None = None  # drawn once per process, like vLLM's engine core


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=_PICKLE_PROTOCOL)).digest()


def _xxh3_128() -> Callable[[bytes], Any]:
    import xxhash

    return xxhash.xxh3_128


def _sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash(obj: Any) -> bytes:
    import xxhash

    return xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=_PICKLE_PROTOCOL))


def _xxhash_cbor(obj: Any) -> bytes:
    import xxhash

    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


_HASH_FNS: dict[str, Callable[[Any], bytes]] = {
    "sha256": _sha256,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
}


def check_algo(algo: str) -> str:
    """Return ``algo`` if the simulator knows it, else raise :class:`SimulationError`."""
    if algo not in ALGOS:
        raise SimulationError(
            f"unknown hash algorithm {algo!r}: expected one of {', '.join(ALGOS)}"
        )
    return algo


def hash_function(algo: str) -> Callable[[Any], bytes]:
    """vLLM's hash function ``algo`` (``vllm/utils/hashing.py``): object -> raw digest bytes.

    Raises:
        SimulationError: ``algo`` is not one of :data:`VLLM_ALGOS`.
    """
    try:
        return _HASH_FNS[algo]
    except KeyError:
        raise SimulationError(
            f"hash algorithm {algo!r} has no vLLM hash values: expected one of "
            f"{', '.join(VLLM_ALGOS)}"
        ) from None


def resolve_none_hash_seed(algo: str, seed: str | None = None) -> str:
    """The seed string NONE_HASH is derived from (vLLM ``resolve_none_hash_seed``, 0.32/0.33).

    Args:
        algo: one of :data:`VLLM_ALGOS`.
        seed: the server's PYTHONHASHSEED, or None when it was unset. The environment of *this*
            process is deliberately not read: it says nothing about the server's.

    Returns:
        ``seed`` if given; else ``"vllm-none-hash"`` for the SHA-256 variants; else (xxhash
        variants) a random 64-character hex string, the same for the whole process.
    """
    global _RANDOM_XXHASH_SEED
    hash_function(algo)
    if seed is not None:
        return seed
    if algo.startswith("xxhash"):
        if _RANDOM_XXHASH_SEED is None:
            _RANDOM_XXHASH_SEED = os.urandom(32).hex()
        return _RANDOM_XXHASH_SEED
    return DEFAULT_NONE_HASH_SEED


def none_hash(algo: str = "sha256", seed: str | None = None) -> bytes:
    """NONE_HASH, the parent of every chain's first block: ``h(serialize(seed string))``.

    Golden value (sha256, seed unset): ``066b1e89...d71198`` (docs/replay.md).
    """
    return hash_function(algo)(resolve_none_hash_seed(algo, seed))


def block_extra_keys(
    block_index: int,
    *,
    cache_salt: str | None = None,
    lora_name: str | None = None,
    lora_path: str | None = None,
) -> tuple[tuple[str, ...], ...] | None:
    """Extra keys of block ``block_index`` (vLLM ``generate_block_hash_extra_keys``, 0.32/0.33).

    Order: LoRA ``("lora", name, path)`` on every block, then ``("cache_salt", salt)`` on block 0
    only when the salt is non-empty. Returns None when the block has no extra keys.
    """
    keys: list[tuple[str, ...]] = []
    if lora_name is not None:
        keys.append(("lora", lora_name, lora_path))  # type: ignore[arg-type]
    if block_index == 0 and cache_salt:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


def hash_block_tokens(
    hash_fn: Callable[[Any], bytes],
    parent_block_hash: bytes,
    block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> bytes:
    """One chain step: ``hash_fn((parent, tuple(tokens), extra_keys))`` (vLLM ``hash_block_tokens``).

    ``parent_block_hash`` must already be NONE_HASH for a chain's first block.
    """
    return hash_fn((parent_block_hash, tuple(block_token_ids), extra_keys))


def block_hashes(
    token_ids: Sequence[int],
    *,
    block_size: int,
    algo: str = "sha256",
    seed: str | None = None,
    cache_salt: str | None = None,
    lora_name: str | None = None,
    lora_path: str | None = None,
) -> list[bytes]:
    """vLLM's block hashes of a prompt: one raw digest per *full* block, in chain order.

    Args:
        token_ids: the prompt's token ids (ints).
        block_size: tokens per block (> 0).
        algo: one of :data:`VLLM_ALGOS`.
        seed: the server's PYTHONHASHSEED (None: unset).
        cache_salt, lora_name, lora_path: the request's extra-key inputs.

    Returns:
        ``len(token_ids) // block_size`` digests (32 bytes for SHA-256, 16 for xxh3-128).

    Raises:
        SimulationError: unknown algorithm, block size < 1, or a token id that is not a
            Python int (a bool, a numpy integer, a float: pickle writes those otherwise than the
            ints of vLLM's ``Request.prompt_token_ids``, so their digests would match nothing).
    """
    for i, t in enumerate(token_ids):
        if type(t) is not int:
            raise SimulationError(
                f"token id at index {i} is a {type(t).__module__}.{type(t).__qualname__}, not "
                f"an int: vLLM hashes Python ints (convert with int() or .tolist())")
    hasher = BlockHasher(
        algo=algo, block_size=block_size, seed=seed, cache_salt=cache_salt,
        lora_name=lora_name, lora_path=lora_path,
    )
    out: list[Hashable] = []
    hasher.extend(out, token_ids)
    return out  # type: ignore[return-value]


# -- pickle layout of one block, for the vectorised sha256/xxhash path --------------------------
#
# pickle.dumps((parent, tokens, None), protocol=5), CPython's C pickler, for a ``parent`` of
# fewer than 256 bytes and ``len(tokens) == block_size`` ints in [-2**31, 2**31):
#
#   PROTO 5        b"\x80\x05"
#   FRAME n        b"\x95" + n as 8 bytes little-endian (n = bytes after this header)
#   SHORT_BINBYTES b"C" + len(parent) as 1 byte + parent; MEMOIZE b"\x94"
#   MARK           b"(" (only for 4 or more tokens)
#   per token      BININT1 b"K" + 1 byte (0 <= t < 256), BININT2 b"M" + 2 bytes LE (256 <= t <
#                  65536), BININT b"J" + 4 bytes LE signed (any other t in [-2**31, 2**31))
#   TUPLE          b"t" (4+ tokens) or TUPLE1/2/3 b"\x85"/b"\x86"/b"\x87"; MEMOIZE b"\x94"
#   NONE b"N", TUPLE3 b"\x87", MEMOIZE b"\x94", STOP b"."
#
# One frame only while the frame stays below the pickler's 64 KiB frame target (FRAME_SIZE_TARGET
# in Modules/_pickle.c); ints are never memoized. Blocks of at most _MAX_FAST_BLOCK_SIZE tokens
# (5 bytes each at most) stay far below it.
_MAX_FAST_BLOCK_SIZE = 8192
#: Blocks in one extend() call from which the vectorised encoder is worth its fixed cost.
_MIN_FAST_BLOCKS = 4
#: Token containers whose items are the Python ints pickle would see (numpy arrays are not).
_FAST_TYPES = (list, tuple, array)
_REC = None  # numpy record dtype (opcode byte, 4-byte value), built on first use
_OPS = _KEEP = None


def pickle_block_layout(block_size: int) -> tuple[bytes, bytes]:
    """The bytes around a block's token opcodes in ``pickle.dumps((parent, tokens, None), 5)``.

    Args:
        block_size: tokens per block, 1 .. 8192.

    Returns:
        ``(prefix, suffix)``: a block whose token opcodes are ``ops`` has the body
        ``prefix + ops + suffix`` and serialises to ``pickle_block_head(len(body), len(parent))
        + parent + body``.
    """
    assert 1 <= block_size <= _MAX_FAST_BLOCK_SIZE
    prefix = b"\x94(" if block_size >= 4 else b"\x94"  # MEMOIZE (the parent), MARK
    suffix = b"t" if block_size >= 4 else (b"\x85", b"\x86", b"\x87")[block_size - 1]
    return prefix, suffix + b"\x94N\x87\x94."


def pickle_block_head(body_size: int, parent_size: int) -> bytes:
    """The bytes before the parent: PROTO 5, FRAME (its 8-byte length), SHORT_BINBYTES header.

    Args:
        body_size: bytes after the parent (see :func:`pickle_block_layout`).
        parent_size: bytes of the parent digest (32 for SHA-256, 16 for xxh3-128), < 256.
    """
    assert 0 <= parent_size < 256
    return (b"\x80\x05\x95" + (2 + parent_size + body_size).to_bytes(8, "little") + b"C"
            + bytes((parent_size,)))


_TEMPLATES: dict[tuple[int, bytes, bytes, bool], tuple[Any, Any]] = {}


def _templates(nb: int, block_size: int, prefix: bytes, suffix: bytes,
               uniform: bool = False) -> tuple[Any, Any]:
    """Record and mask arrays of at least ``nb`` blocks with the constant bytes filled in:
    prefix and suffix in the records; prefix, suffix and opcode bytes kept in the mask. Cached
    per layout and grown by doubling (bounded by the longest request seen). ``uniform``: every
    opcode is BININT (``J``) in the records, the mask is not used."""
    key = (block_size, prefix, suffix, uniform)
    got = _TEMPLATES.get(key)
    if got is not None and len(got[0]) >= nb:
        return got
    size = max(nb, 2 * len(got[0]) if got else 64)
    fields = [("tok", _REC, (block_size,))]
    if prefix:
        fields.insert(0, ("pre", f"V{len(prefix)}"))
    if suffix:
        fields.append(("suf", f"V{len(suffix)}"))
    rec = np.zeros(size, fields)
    keep = np.zeros(size, fields)
    if prefix:
        rec["pre"] = np.void(prefix)
        keep["pre"] = np.void(b"\x01" * len(prefix))
    if suffix:
        rec["suf"] = np.void(suffix)
        keep["suf"] = np.void(b"\x01" * len(suffix))
    keep["tok"]["op"] = 1
    if uniform:
        rec["tok"]["op"] = 0x4A
    _TEMPLATES[key] = rec, keep
    return rec, keep


def pickle_int_opcodes(
    token_ids: Sequence[int], block_size: int, prefix: bytes = b"", suffix: bytes = b"",
) -> tuple[bytes, list[int]] | None:
    """Each block's token opcodes as pickle writes them, between ``prefix`` and ``suffix``.

    The bytes of token ``t`` are what protocol-5 pickling writes for the int ``t`` inside a
    tuple (``K``/``M``/``J`` plus 1/2/4 little-endian bytes). Computed for the whole sequence at
    once with numpy: one conversion of the ids to int32, no per-token Python work.

    Args:
        token_ids: the tokens; the first ``len(token_ids) // block_size`` blocks are encoded
            (a partial tail is ignored but must be ints in range too, else None).
        block_size: tokens per block.
        prefix, suffix: bytes written before and after each block's opcodes.

    Returns:
        ``(stream, ends)``: block ``i`` is ``stream[ends[i-1]:ends[i]]`` (from 0 for the first),
        that is ``prefix + opcodes of its tokens + suffix``; None when an id is not an int in
        ``[-2**31, 2**31)`` (the caller then uses ``pickle.dumps``).
    """
    enc = _encode_opcodes(token_ids, block_size, prefix, suffix)
    if enc is None:
        return None
    stream, ends, size = enc
    if size:  # the uniform tail: blocks of ``size`` bytes up to the end of the stream
        o = ends[-1] if ends else 0
        ends = [*ends, *range(o + size, len(stream) + 1, size)]
    return stream, ends


def pack_int32(token_ids: Sequence[int]) -> bytes | None:
    """The ids as little-endian int32 (4 bytes each), or None when one is not an int in
    ``[-2**31, 2**31)``. One to one on that range: equal bytes mean equal ids."""
    try:
        return struct.pack(f"<{len(token_ids)}i", *token_ids)
    except (struct.error, TypeError):
        return None


def _encode_opcodes(
    token_ids: Sequence[int] | None, block_size: int, prefix: bytes, suffix: bytes,
    raw: bytes | None = None, skip_blocks: int = 0,
) -> tuple[bytes, list[int], int] | None:
    """:func:`pickle_int_opcodes` in a compact form: ``(stream, ends, size)`` where ``ends``
    covers the first blocks only and every later block has ``size`` bytes (0: none later).

    The later blocks are the uniform tail: from the block after the last one holding a token in
    ``[0, 65536)``, every token is a BININT (``J`` + 4 bytes; hash-id traces, whose synthetic
    ids are mostly above 65535), so those blocks are written without the opcode-class mask:
    ``prefix + (J, 4 value bytes) * block_size + suffix`` each, the same bytes.

    ``raw``: the ids already packed by :func:`pack_int32` (``token_ids`` is then not read);
    ``skip_blocks``: leading full blocks left out (the stream starts at the next one).
    """
    global _REC, _OPS, _KEEP
    if raw is None:
        raw = pack_int32(token_ids)  # all of them: cheaper than slicing off the tail first
        if raw is None:
            return None
    nb = len(raw) // 4 // block_size - skip_blocks
    if nb <= 0:
        return b"", [], 0
    m = nb * block_size
    if _REC is None:
        _REC = np.dtype([("op", "u1"), ("v", "<u4")])  # packed: 5 bytes per token
        _OPS = np.array([0x4B, 0x4D, 0x4A], np.uint8)  # BININT1, BININT2, BININT
        _KEEP = np.array([0x01, 0x0101, 0x01010101], np.uint32)  # value bytes kept per class
    # Negatives are >= 2**31 as u4: BININT.
    u = np.frombuffer(raw, "<u4", m, 4 * block_size * skip_blocks).reshape(nb, block_size)
    # Blocks from k on hold BININT tokens only (k: after the last block with a smaller token).
    small = u.reshape(m) <= 0xFFFF
    k = (m - int(small[::-1].argmax()) - 1) // block_size + 1 if small.any() else 0
    size = 5 * block_size + len(prefix) + len(suffix) if k < nb else 0
    tail = b""
    if size:
        rec_t = _templates(nb - k, block_size, prefix, suffix, uniform=True)[0]
        rec = rec_t[:nb - k].view(np.uint8).copy().view(rec_t.dtype)
        rec["tok"]["v"] = u[k:]
        tail = rec.tobytes()
        if k == 0:
            return tail, [], size
        u = u[:k]
        nb = k
    c1 = (u > 0xFF).view(np.uint8)
    c2 = (u > 0xFFFF).view(np.uint8)
    cls = c1 + c2  # 0: BININT1, 1: BININT2, 2: BININT
    # One record per block: prefix, block_size (opcode, 4 value bytes), suffix; a mask of the
    # same layout keeps the bytes pickle writes. Both start as copies of cached templates.
    rec_t, keep_t = _templates(nb, block_size, prefix, suffix)
    rec = rec_t[:nb].view(np.uint8).copy().view(rec_t.dtype)  # plain byte copies
    keep = keep_t[:nb].view(np.uint8).copy().view(keep_t.dtype)
    tok, ktok = rec["tok"], keep["tok"]
    tok["op"] = _OPS.take(cls)
    tok["v"] = u
    ktok["v"] = _KEEP.take(cls)
    stream = rec.view(np.uint8)[keep.view(np.bool_)].tobytes()
    # Bytes per block: 2 per token, +1 per BININT2/BININT token, +1 more per BININT token.
    extra = cls + c2  # 0, 1 or 3 per token
    if block_size % 8 == 0 and block_size <= 64:
        # Eight tokens' bytes summed in one multiplication (each sum <= 24 fits a byte).
        w = ((extra.view(np.uint64) * np.uint64(0x0101010101010101)) >> np.uint64(56)).view(
            np.int64)
        ends = w[:, 0].copy()
        for k in range(1, block_size // 8):
            ends += w[:, k]
    else:  # float32 sums of small ints are exact: at most 3 * 8192 per block
        ends = (extra.astype(np.float32) @ np.ones(block_size, np.float32)).astype(np.int64)
    ends += 2 * block_size + len(prefix) + len(suffix)
    return (stream + tail if tail else stream), ends.cumsum().tolist(), size


def int_block_hash(digest: bytes) -> int:
    """The KV-events form of a digest: its low 8 bytes read big-endian, an unsigned 64-bit int.

    vLLM ``maybe_convert_block_hash`` with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`` (default).
    """
    return int.from_bytes(digest, "big") & 0xFFFF_FFFF_FFFF_FFFF


class PrefixMemo:
    """Digests of recent prompts, reused for a later prompt's leading blocks (exact).

    A block's digest depends only on the hasher (algorithm, seed, extra keys: one ``tag`` per
    :class:`BlockHasher`) and the tokens from the start of the prompt to the end of the block,
    so a prompt whose first ``j`` blocks of int32 ids are byte-equal to an earlier prompt's has
    the same first ``j`` digests: multi-turn conversations resend their history, and only the
    new blocks need hashing. Candidates are found through checkpoint blocks (every
    ``checkpoint``-th block, keyed by position and token bytes) and then compared token by
    token from the start (numpy), so a reused digest always has an equal prefix behind it.

    Args:
        max_blocks: the remembered prompts (their int32 bytes and digest lists) cover at most
            this many blocks (at most about 40 MB at the default: 64 bytes of ids, a list slot
            and a 32-byte digest object per block, fewer when the digests are also the
            cache's keys); the oldest are forgotten first. Only speed depends on it.
        checkpoint: blocks between two checkpoints (32 blocks of 16 tokens: one Mooncake id).
    """

    __slots__ = ("max_blocks", "checkpoint", "_index", "_records", "_blocks", "_tags")

    def __init__(self, max_blocks: int = 1 << 18, checkpoint: int = 32) -> None:
        self.max_blocks = max_blocks
        self.checkpoint = checkpoint
        self._index: dict[tuple[int, int, bytes], tuple[bytes, list[bytes]]] = {}
        self._records: deque[tuple[int, int, tuple[bytes, list[bytes]]]] = deque()
        self._blocks = 0
        self._tags = 0

    def new_tag(self) -> int:
        """A namespace for one hasher's digests."""
        self._tags += 1
        return self._tags

    def lookup(self, tag: int, raw: bytes, block_size: int) -> list[bytes]:
        """The digests of the longest run of leading full blocks of ``raw`` (int32 ids, see
        :func:`pack_int32`) equal to a remembered prompt's under ``tag``; may be empty."""
        nb = len(raw) // (4 * block_size)
        c, w, index = self.checkpoint, 4 * block_size, self._index
        best: list[bytes] = []
        a = None
        j = c - 1
        while j < nb:
            rec = index.get((tag, j, raw[j * w:(j + 1) * w]))
            if rec is None:
                break
            if a is None:
                a = np.frombuffer(raw, np.uint32)
            b = np.frombuffer(rec[0], np.uint32)
            m = min(len(a), len(b))
            differ = a[:m] != b[:m]
            same = int(differ.argmax()) if differ.any() else m  # equal leading tokens
            got = min(same // block_size, len(rec[1]))
            if got <= j:
                break
            if got > len(best):
                best = rec[1][:got]
            j = got + (c - 1 - got) % c  # the next checkpoint at or after block ``got``
        return best

    def remember(self, tag: int, raw: bytes, digests: list[bytes], block_size: int) -> None:
        """Remember a prompt (``raw``: its int32 ids) and the digests of its full blocks."""
        nb = len(digests)
        c = self.checkpoint
        if nb < c:
            return
        w, index = 4 * block_size, self._index
        rec = (raw, digests[:nb])
        for j in range(c - 1, nb, c):
            index[(tag, j, raw[j * w:(j + 1) * w])] = rec
        self._records.append((tag, block_size, rec))
        self._blocks += nb
        while self._blocks > self.max_blocks:
            old_tag, old_bs, old = self._records.popleft()
            self._blocks -= len(old[1])
            ow = 4 * old_bs
            r = old[0]
            for j in range(c - 1, len(old[1]), c):
                key = (old_tag, j, r[j * ow:(j + 1) * ow])
                if index.get(key) is old:
                    del index[key]


class BlockHasher:
    """Computes a request's block keys incrementally, as vLLM's request block hasher does.

    vLLM hashes all full prompt blocks when a request arrives and each block that fills with
    generated tokens later (``get_request_block_hasher``). :meth:`extend` appends the keys of the
    blocks that became full to a request's key list.

    Keys are raw digests for the vLLM algorithms and ``parent || packed tokens`` bytes for
    ``fast`` (tuples when an id does not fit 64 bits).
    """

    __slots__ = ("algo", "block_size", "extra_first", "extra_rest", "_fn", "_root", "_fast",
                 "_layout", "_started", "_memo", "_tag", "_native")

    def __init__(
        self,
        *,
        algo: str = "sha256",
        block_size: int,
        seed: str | None = None,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lora_path: str | None = None,
        memo: PrefixMemo | None = None,
    ) -> None:
        check_algo(algo)
        if block_size < 1:
            raise SimulationError(f"block_size must be >= 1, got {block_size}")
        self._memo = self._tag = None
        self.algo = algo
        self.block_size = block_size
        self.extra_first = block_extra_keys(
            0, cache_salt=cache_salt, lora_name=lora_name, lora_path=lora_path
        )
        self.extra_rest = block_extra_keys(
            1, cache_salt=cache_salt, lora_name=lora_name, lora_path=lora_path
        )
        self._fast = algo == "fast"
        if self._fast:
            self._fn = None
            # The root names the extra keys (salt on the first block, LoRA on all): chaining
            # carries them into every later key, which gives the same equalities as vLLM's.
            self._root = hash(("prefixscope-fast-root", self.extra_first, self.extra_rest))
        else:
            self._fn = hash_function(algo)
            self._root = none_hash(algo, seed)
        # The vectorised pickle path (module docstring): pickle-based algorithms, no extra keys
        # after the first block (a salt on the first block only still allows it from block 1).
        self._layout = self._started = None
        if algo in ("sha256", "xxhash") and self.extra_rest is None and (
                block_size <= _MAX_FAST_BLOCK_SIZE):
            self._layout = pickle_block_layout(block_size)
            # Body size -> a hash object already fed the block head for that size (on demand).
            self._started: dict[int, Any] = {}
            if memo is not None and self.extra_first is None:
                self._memo, self._tag = memo, memo.new_tag()
        # The compiled chain (prefixscope.replay.native): sha256 blocks without extra keys,
        # pickled and hashed in C, one call per request (no PrefixMemo needed: hashing a block
        # there costs less than looking it up).
        self._native = NATIVE is not None and algo == "sha256" and self._layout is not None

    def extend(self, keys: list[Hashable], token_ids: Sequence[int], offset: int = 0) -> None:
        """Append to ``keys`` the keys of every full block not yet in ``keys``.

        Args:
            keys: the request's key list so far (block i at index i); extended in place.
            token_ids: the request's tokens (prompt then output) from position ``offset`` on;
                ``offset`` must not exceed ``len(keys) * block_size``.
            offset: absolute position of ``token_ids[0]``.
        """
        bs = self.block_size
        n = offset + len(token_ids)
        start = len(keys) * bs
        if start + bs > n:
            return
        assert offset <= start, (offset, start)
        if type(token_ids) not in _FAST_TYPES:
            # A lazy token sequence (the hash-id readers' ExpandedTokens) as one list, computed
            # in bulk rather than token by token.
            as_list = getattr(token_ids, "as_token_list", None)
            if as_list is not None:
                token_ids = as_list()
        stop = n - n % bs  # end of the last full block
        lo, hi = start - offset, stop - offset
        if (self._native and (start > 0 or self.extra_first is None)
                and type(token_ids) in (list, tuple)
                and self._chain_native(keys, token_ids, lo, (hi - lo) // bs)):
            return
        if (self._layout is not None and hi - lo >= _MIN_FAST_BLOCKS * bs
                and (start > 0 or self.extra_first is None) and type(token_ids) in _FAST_TYPES):
            # From the first unkeyed block to the end: the partial tail is ignored.
            if start == 0 and self._memo is not None:
                # A whole prompt: its leading blocks equal to an earlier prompt's reuse its
                # digests (PrefixMemo), the rest is hashed and the prompt remembered.
                raw = pack_int32(token_ids)
                if raw is not None:
                    memo = self._memo
                    keys += memo.lookup(self._tag, raw, bs)
                    self._chain_from_opcodes(keys, *_encode_opcodes(
                        None, bs, *self._layout, raw=raw, skip_blocks=len(keys)))
                    memo.remember(self._tag, raw, keys, bs)
                    return
            else:
                enc = _encode_opcodes(token_ids if lo == 0 else token_ids[lo:], bs,
                                      *self._layout)
                if enc is not None:
                    self._chain_from_opcodes(keys, *enc)
                    return
        # Slices of a tuple are tuples: one copy per block below.
        tt = tuple(token_ids) if lo == 0 and hi == len(token_ids) else tuple(token_ids[lo:hi])
        if self._fast:
            parent = hash(keys[-1]) if keys else self._root
            append = keys.append
            try:
                packed = array("q", tt).tobytes()
            except OverflowError:  # ids beyond 64 bits: tuple keys (slower, same equalities)
                for i in range(0, len(tt), bs):
                    key = (parent, tt[i:i + bs])
                    append(key)
                    parent = hash(key)
                return
            step = 8 * bs
            for i in range(0, len(packed), step):
                key = parent.to_bytes(8, "little", signed=True) + packed[i:i + step]
                append(key)
                parent = hash(key)
            return
        fn = self._fn
        parent = keys[-1] if keys else self._root
        extra_rest = self.extra_rest
        append = keys.append
        i = 0
        if start == 0:
            parent = fn((parent, tt[0:bs], self.extra_first))
            append(parent)
            i = bs
        if i >= len(tt):
            return
        if self._native and self._chain_native(keys, tt, i, (len(tt) - i) // bs):
            return  # a salted first block (above), then the rest in C
        if self._layout is not None and len(tt) - i >= _MIN_FAST_BLOCKS * bs:
            # A salted first block (above), then the rest through the vectorised path.
            enc = _encode_opcodes(tt[i:], bs, *self._layout)
            if enc is not None:
                self._chain_from_opcodes(keys, *enc)
                return
        if self._layout is not None:
            # pickle.dumps per block, except that a block equal to the previous one (the
            # placeholder tokens of generated output, ids beyond int32) reuses its serialised
            # body: head + parent + body is the same pickle (ints are never memoized; the head
            # depends only on the body's size), hashed from a hash object fed that head.
            dumps, started, skip = pickle.dumps, self._started, 13 + len(parent)
            prev_t = body = None
            for j in range(i, len(tt), bs):
                t = tt[j:j + bs]
                if t == prev_t:
                    h = started.get(len(body)) or self._start(len(body))
                    h = h.copy()
                    h.update(parent)
                    h.update(body)
                    parent = h.digest()
                else:
                    raw = dumps((parent, t, None), 5)
                    parent = self._digest(raw)
                    # Reused only when it is one frame (its length is the rest of the pickle).
                    one = int.from_bytes(raw[3:11], "little") == len(raw) - 11
                    body, prev_t = (raw[skip:], t) if one else (None, None)
                append(parent)
            return
        if fn is _sha256:
            dumps, sha = pickle.dumps, hashlib.sha256
            for j in range(i, len(tt), bs):
                parent = sha(dumps((parent, tt[j:j + bs], extra_rest), 5)).digest()
                append(parent)
            return
        for j in range(i, len(tt), bs):
            parent = fn((parent, tt[j:j + bs], extra_rest))
            append(parent)

    def _chain_native(self, keys: list[Hashable], tokens: list | tuple, start: int,
                      num_blocks: int) -> bool:
        """Append the digests of ``num_blocks`` blocks of ``tokens`` from ``start`` in C
        (parent ``keys[-1]``, NONE_HASH when ``keys`` is empty); False with ``keys`` unchanged
        when the extension declines them (see ``replay/_native.c``)."""
        return NATIVE.sha256_pickle_chain(keys, tokens, start, num_blocks, self.block_size,
                                          keys[-1] if keys else self._root,
                                          *self._layout) >= 0

    def _chain_from_opcodes(self, keys: list[Hashable], stream: bytes, ends: list[int],
                            size: int = 0) -> None:
        """Append the chained digests of the blocks whose bodies are in ``stream`` (block ``i``
        spans ``ends[i-1]:ends[i]``, then blocks of ``size`` bytes to the end of the stream: see
        :func:`_encode_opcodes` with this layout's prefix and suffix); the parent of the first
        is ``keys[-1]`` (NONE_HASH when ``keys`` is empty), and no block has extra keys.

        Each digest is ``hash(head + parent + body)``, which is ``hash(pickle.dumps((parent,
        tokens, None), protocol=5))`` (:func:`pickle_block_layout`); the head is fed once to a
        hash object per body size, copied for each block.
        """
        parent = keys[-1] if keys else self._root
        append = keys.append
        started = self._started
        o0 = 0
        for o1 in ends:
            try:
                h = started[o1 - o0].copy()
            except KeyError:
                h = self._start(o1 - o0).copy()
            h.update(parent)
            h.update(stream[o0:o1])
            parent = h.digest()
            append(parent)
            o0 = o1
        if size:
            copy = (started.get(size) or self._start(size)).copy
            for o in range(o0, len(stream), size):
                h = copy()
                h.update(parent)
                h.update(stream[o:o + size])
                parent = h.digest()
                append(parent)

    def _digest(self, data: bytes) -> bytes:
        """The digest of already serialised bytes (SHA-256 or xxh3-128, this hasher's)."""
        if self.algo == "sha256":
            return hashlib.sha256(data).digest()
        import xxhash

        return xxhash.xxh3_128_digest(data)

    def _start(self, body_size: int) -> Any:
        """A hash object fed the head of a block whose body has ``body_size`` bytes (cached)."""
        new = hashlib.sha256 if self.algo == "sha256" else _xxh3_128()
        h = self._started[body_size] = new(pickle_block_head(body_size, len(self._root)))
        return h
