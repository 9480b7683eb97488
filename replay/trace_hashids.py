"""Hash-id traces: expanding per-block ids into token ids and fast block keys.

Mooncake/Bailian and kv-cache-tester traces give, per request, one integer id per block of
``S`` tokens (``S`` = 512 for Mooncake, 16 for Bailian, 64 for kv-cache-tester) instead of the
tokens themselves. To simulate any engine block size ``B`` the replay expands each id into ``S``
synthetic tokens that depend on the id alone (:class:`ExpandedTokens`), truncated to the
request's ``input_length``:

    token(position p) = canon[p // S] * S + (p % S)

so distinct ids have distinct first tokens, and two requests share a token prefix exactly as far
as they share a prefix of ids (at most into the first differing id's block, whose first token
already differs). Positions beyond the last id (kv-cache-tester has ids only for full 64-token
blocks) get negative tokens unique to the request: they never hit, as in the source trace.

``canon`` is the trace id made *chain-safe* (:class:`IdChain`): the published traces' ids are
chained (an id always has the same predecessor and position), which the reader checks; an id
seen again after a different predecessor or at another position gets a fresh alias, so a hit can
never be claimed for content that differs earlier in the prompt. Ids are namespaced (per
conversation for kv-cache-tester, whose ids are local to a conversation and its sub-agents).

Fast mode needs no tokens: the key of the engine block ending at position ``e`` (exclusive) is
the token at ``e - 1`` (:func:`block_keys_for`), divided by ``B`` when ``B`` divides ``S`` and
the token comes from an id (those tokens are then ``B - 1`` modulo ``B``: the quotient,
``canon * (S // B) + (e - 1) % S // B``, is the block's index in the id's expansion, a one-to-one
function of the token). Equal keys imply equal canon ids, hence equal prefixes up to that
position (chained semantics), for any ``B``, whether or not it divides ``S``. (The quotient
keeps the keys of consecutive blocks consecutive ints, which CPython's dict, hashing an int to
itself, stores in neighbouring slots: at a large cache the block map is mostly memory latency,
and keys spaced ``B`` apart land on one slot in ``B``.)

``vocab_size`` (optional) maps tokens into ``[5, vocab_size)`` with a fixed mixing function, for
replaying against a real model; distinctness then holds only with high probability (two
different 16-token blocks collide with probability about ``vocab_size ** -16``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

#: Aliases (chain violations) get ids from here up, far above any real id (and above the
#: per-conversation namespace offsets ``k << 32`` for up to 65,536 conversations).
ALIAS_BASE = 1 << 48
#: Request-unique tail tokens are negative: ``-1 - (serial << TAIL_BITS) - k`` for the k-th tail
#: token of the request with the given serial number, so they never equal an id-derived token.
TAIL_BITS = 20
#: Token ids below this are kept free for special tokens when mapping into a vocabulary.
FIRST_ORDINARY_TOKEN = 5

_MASK64 = (1 << 64) - 1


#: splitmix64's finaliser constants (the increment, then the two multipliers).
_MIX_ADD, _MIX_MUL1, _MIX_MUL2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix64(x: int) -> int:
    # splitmix64 finaliser: a fixed bijection on 64-bit integers.
    x = (x + _MIX_ADD) & _MASK64
    x = ((x ^ (x >> 30)) * _MIX_MUL1) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX_MUL2) & _MASK64
    return x ^ (x >> 31)


def _mix64_array(raw: np.ndarray) -> np.ndarray:
    """:func:`_mix64` of every element (int64 in, uint64 out): uint64 arithmetic wraps as
    ``& _MASK64`` does."""
    u = np.uint64
    with np.errstate(over="ignore"):
        x = raw.astype(u) + u(_MIX_ADD)
        x = (x ^ (x >> u(30))) * u(_MIX_MUL1)
        x = (x ^ (x >> u(27))) * u(_MIX_MUL2)
        return x ^ (x >> u(31))


class IdChain:
    """Makes a trace's block ids chain-safe within one namespace.

    Invariant: ``canonical(ids)[i] == canonical(ids')[i]`` implies ``ids[:i+1] == ids'[:i+1]``.
    Memory: one entry per distinct (id, predecessor, position) context, i.e. per unique block.
    """

    __slots__ = ("_context", "_alias", "_next_alias", "violations")

    def __init__(self, alias_start: int = ALIAS_BASE) -> None:
        self._context: dict[int, tuple[int, int]] = {}
        self._alias: dict[tuple[int, int, int], int] = {}
        self._next_alias = alias_start
        self.violations = 0

    def canonical(self, ids: Sequence[int], offset: int = 0) -> list[int]:
        """Chain-safe ids for one request's id list (same length). ``offset`` is added to every
        id first (namespacing)."""
        context = self._context
        xs = [raw + offset for raw in ids] if offset else list(ids)
        # Fast path (every id in its known context, or new): one setdefault per id. An entry it
        # adds for an id after a violation records a raw predecessor; the slow loop below then
        # aliases that id in this request, so a canonical id still always means one prefix.
        want = list(zip([-1, *xs[:-1]], range(len(xs))))
        if [context.setdefault(x, c) for x, c in zip(xs, want)] == want:
            return xs
        out: list[int] = []
        pred = -1
        for pos, x in enumerate(xs):
            seen = context.get(x)
            if seen is None:
                context[x] = (pred, pos)
                canon = x
            elif seen == (pred, pos):
                canon = x
            else:
                key = (pred, x, pos)
                canon = self._alias.get(key)
                if canon is None:
                    canon = self._next_alias
                    self._next_alias += 1
                    self._alias[key] = canon
                    self.violations += 1
            out.append(canon)
            pred = canon
        return out


class ExpandedTokens(Sequence[int]):
    """The synthetic prompt tokens of one hash-id request, computed on demand.

    Args:
        canon: chain-safe ids, one per ``ids_block_size`` tokens.
        ids_block_size: tokens per id (``S``).
        num_tokens: prompt length (tokens past ``len(canon) * S`` are request-unique).
        serial: the request's serial number in the trace (makes its tail tokens unique).
        vocab_size: map every token into ``[5, vocab_size)`` (None: raw values).
    """

    __slots__ = ("_canon", "_s", "_n", "_tail", "_vocab")

    def __init__(self, canon: Sequence[int], ids_block_size: int, num_tokens: int, *,
                 serial: int = 0, vocab_size: int | None = None) -> None:
        self._canon = canon
        self._s = ids_block_size
        self._n = num_tokens
        self._tail = -1 - (serial << TAIL_BITS)
        self._vocab = vocab_size

    def __len__(self) -> int:
        return self._n

    def _raw(self, p: int) -> int:
        i, j = divmod(p, self._s)
        if i < len(self._canon):
            return self._canon[i] * self._s + j
        return self._tail - (p - len(self._canon) * self._s)

    def _token(self, p: int) -> int:
        raw = self._raw(p)
        if self._vocab is None:
            return raw
        span = self._vocab - FIRST_ORDINARY_TOKEN
        return FIRST_ORDINARY_TOKEN + _mix64(raw) % span

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self._n)
            if step == 1 and stop - start > 64:
                return self.as_token_list(start, stop)
            return [self._token(p) for p in range(start, stop, step)]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError(index)
        return self._token(index)

    def __iter__(self) -> Iterator[int]:
        return iter(self.as_token_list())

    def as_token_list(self, start: int = 0, stop: int | None = None) -> list[int]:
        """Tokens ``start .. stop-1`` as a list of Python ints, computed with numpy (the
        per-token :meth:`_token` costs about 1 µs a token: 8 s for the 8.3 M tokens of 600
        Mooncake requests). The same values as ``[self._token(p) for p in range(start,
        stop)]`` (property test), which it falls back to when a raw token would leave int64.
        """
        n = self._n if stop is None else min(stop, self._n)
        if start >= n:
            return []
        s, canon = self._s, self._canon
        covered = len(canon) * s
        tail_end = self._tail - max(0, n - covered)
        if ((canon and (max(canon) + 1) * s >= 1 << 63) or min(canon, default=0) < 0
                or tail_end < -(1 << 63)):  # a raw token past int64: the per-token path
            return [self._token(p) for p in range(start, n)]
        parts = []
        if start < covered:
            hi = min(n, covered)
            c = np.asarray(canon[start // s:(hi - 1) // s + 1], dtype=np.int64)
            block = (c[:, None] * s + np.arange(s, dtype=np.int64)).ravel()
            off = start - (start // s) * s
            parts.append(block[off:off + hi - start])
        if n > covered:
            lo = max(start, covered)
            parts.append(self._tail - (np.arange(lo, n, dtype=np.int64) - covered))
        raw = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if self._vocab is None:
            return raw.tolist()
        span = np.uint64(self._vocab - FIRST_ORDINARY_TOKEN)
        return (_mix64_array(raw) % span + np.uint64(FIRST_ORDINARY_TOKEN)).tolist()


def block_keys_for(canon: Sequence[int], ids_block_size: int, num_tokens: int,
                   engine_block_size: int, *, serial: int = 0) -> list[int]:
    """Fast-mode keys, one per *full* engine block of the prompt (``num_tokens // B`` of them).

    The key of the block ending at position ``e`` is the raw synthetic token at ``e - 1``,
    floor-divided by ``engine_block_size`` when that divides ``ids_block_size`` and the token
    comes from an id (request-unique tail tokens are kept as they are; they are negative), see
    the module docstring: chained semantics, independent of any vocabulary mapping.
    """
    s = ids_block_size
    b = engine_block_size
    covered = len(canon) * s
    tail = -1 - (serial << TAIL_BITS)
    num_full = num_tokens // b
    if s % b == 0:
        # Common case (e.g. 512 or 64 per id, engine block 16): a flat comprehension.
        # The token c * s + j (j = b - 1 modulo b) divided by b: dense ints.
        per = s // b
        offs = range(per)
        keys = [c * per + j for c in canon for j in offs]
        if len(keys) >= num_full:
            del keys[num_full:]
            return keys
        start = len(keys) * b + b
        keys.extend(tail - (e - 1 - covered) for e in range(start, num_tokens + 1, b))
        return keys
    keys = []
    for e in range(engine_block_size, num_tokens + 1, engine_block_size):
        q = e - 1
        if q < covered:
            i, j = divmod(q, s)
            keys.append(canon[i] * s + j)
        else:
            keys.append(tail - (q - covered))
    return keys
