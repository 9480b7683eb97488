"""vLLM's KVCacheManager for one full-attention group: lookup, allocation, caching, free.

A port of the behaviours of ``vllm/v1/core/kv_cache_manager.py`` (``get_computed_blocks``,
``allocate_slots``, ``free``, ``reset_prefix_cache``) and ``FullAttentionManager`` in
``vllm/v1/core/single_type_kv_cache_manager.py`` (``find_longest_cache_hit``,
``get_num_blocks_to_allocate``, ``cache_blocks``), vLLM 0.32.0 (same rules in 0.33.0), without
speculative decoding, KV connectors, sliding windows or hybrid groups.

Rules (each asserted by a narrated test in ``tests/test_replay_core_manager.py``):

1. Lookup only when caching is on and the request does not skip reading (prompt logprobs).
   At most ``floor((num_tokens - 1) / block_size)`` blocks can hit (the last token is always
   recomputed); the walk stops at the first key not in the map; hits are whole blocks.
2. Allocation is all-or-nothing: it needs ``cdiv(tokens needing a slot, B) - blocks held - hit
   blocks`` new blocks plus the hit blocks that sit in the free queue (reference count 0),
   and fails (returns None, touching nothing) when the pool has fewer free blocks. With
   ``full_sequence_must_fit`` (vLLM's default ``scheduler_reserve_full_isl`` at admission) the
   whole current sequence must fit, not just the scheduled chunk.
3. Order on success: touch the hit blocks, pop new blocks from the free queue, then register the
   keys of every block full of *scheduled* tokens (at most ``request.num_tokens``): blocks are
   cached at scheduling time, before the forward pass.
4. Free visits the request's blocks in reverse (tail first), see :class:`~replay.block_pool.BlockPool`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import islice

from prefixscope.replay.block_pool import BlockPool
from prefixscope.replay.hashing import BlockHasher

#: Token id used for generated tokens when a trace has no output ids: -2**62, never a real id
#: nor one of the synthetic tail tokens of the hash-id readers, so no prompt can contain it and
#: placeholder decode blocks are never hit by a prompt.
PLACEHOLDER_OUTPUT_TOKEN = -(1 << 62)


class SimRequest:
    """A request's mutable state in the simulator (the part of vLLM's ``Request`` that matters).

    Attributes:
        request_id: unique id.
        num_prompt_tokens: prompt length in tokens.
        num_tokens: prompt plus generated tokens appended so far (vLLM ``Request.num_tokens``).
        num_computed_tokens: tokens whose KV is computed or scheduled.
        block_keys: one key per full block of the current tokens, in chain order (vLLM
            ``Request.block_hashes``).
        prompt: the prompt's token ids as given (not copied; None in block-key mode).
        outputs: generated token ids appended so far (token mode).
        max_tokens: tokens to generate (>= 1 in vLLM; 0 is treated as 1 for caching).
        num_output_tokens: generated so far.
        skip_reading: do not look up (prompt logprobs); still writes.
        num_preemptions: times preempted.
        cached_tokens: hit tokens at the first admission (-1 before it).
    """

    __slots__ = (
        "request_id", "num_prompt_tokens", "num_tokens", "num_computed_tokens", "block_keys",
        "prompt", "outputs", "max_tokens", "num_output_tokens", "skip_reading", "num_preemptions",
        "cached_tokens", "hasher", "output_token_ids", "trace", "admitted_s", "block_size",
    )

    def __init__(
        self,
        request_id: str,
        *,
        block_size: int,
        prompt_token_ids: Sequence[int] | None = None,
        prompt_block_keys: Sequence[Hashable] | None = None,
        num_prompt_tokens: int | None = None,
        hasher: BlockHasher | None = None,
        max_tokens: int = 1,
        output_token_ids: Sequence[int] | None = None,
        skip_reading: bool = False,
        trace: object = None,
        own_keys: bool = False,
    ) -> None:
        """Build the request and compute the keys of its full prompt blocks.

        Either ``prompt_token_ids`` with a ``hasher`` (vLLM hashing or ``fast``), or
        ``prompt_block_keys`` (one chained key per full block) with ``num_prompt_tokens``;
        ``own_keys`` hands over a list the request may keep and extend (no copy).
        """
        self.request_id = request_id
        self.block_size = block_size
        self.max_tokens = max_tokens
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.skip_reading = skip_reading
        self.num_preemptions = 0
        self.cached_tokens = -1
        self.output_token_ids = output_token_ids
        self.trace = trace
        self.admitted_s: float | None = None
        self.hasher = hasher
        self.outputs: list[int] = []
        if prompt_token_ids is not None:
            assert hasher is not None
            self.prompt = prompt_token_ids
            self.num_prompt_tokens = len(prompt_token_ids)
            self.block_keys: list[Hashable] = []
            hasher.extend(self.block_keys, prompt_token_ids)
        else:
            assert prompt_block_keys is not None and num_prompt_tokens is not None
            self.prompt = None
            self.num_prompt_tokens = num_prompt_tokens
            # A fresh list is required (decode keys are appended); reuse one made for us.
            self.block_keys = (prompt_block_keys if type(prompt_block_keys) is list
                               and own_keys else list(prompt_block_keys))
            assert len(self.block_keys) == num_prompt_tokens // block_size, (
                f"{request_id}: {len(self.block_keys)} block keys for "
                f"{num_prompt_tokens} tokens at block size {block_size}"
            )
        self.num_tokens = self.num_prompt_tokens

    def append_output_tokens(self, count: int) -> None:
        """Append ``count`` generated tokens and key every block they fill (vLLM
        ``Request.append_output_token_ids`` then the block hasher).

        Generated ids come from ``output_token_ids`` when known, else the placeholder id; in
        block-key mode every new full block gets a fresh key that nothing else can match.
        """
        if count <= 0:
            return
        start = self.num_output_tokens
        self.num_output_tokens += count
        self.num_tokens += count
        if self.prompt is not None:
            known = self.output_token_ids
            outputs = self.outputs
            if known is not None and start < len(known):
                outputs.extend(known[start:start + count])
                outputs.extend([PLACEHOLDER_OUTPUT_TOKEN] * (start + count - len(outputs)))
            else:
                outputs.extend([PLACEHOLDER_OUTPUT_TOKEN] * count)
            # Hash only the tokens after the last keyed block: the prompt's partial tail (if
            # any) and the outputs.
            bs = self.block_size
            first = len(self.block_keys) * bs
            if first + bs <= self.num_tokens:
                p = self.num_prompt_tokens
                if first < p:
                    window = [*self.prompt[first:], *outputs]
                else:
                    window = outputs[first - p:]
                self.hasher.extend(self.block_keys, window, offset=first)
        else:
            keys = self.block_keys
            for _ in range(self.num_tokens // self.block_size - len(keys)):
                keys.append(object())

    def release_tokens(self) -> None:
        """Drop the token list once the request finished (memory bounded by running requests)."""
        self.prompt = None
        self.outputs = []
        self.block_keys = []
        self.output_token_ids = None


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


class KVCacheManager:
    """vLLM's KV-cache manager for one full-attention group (see the module rules).

    Args:
        num_gpu_blocks: vLLM ``num_gpu_blocks`` including the null block, or None (unbounded).
        block_size: tokens per block.
        enable_caching: vLLM ``--enable-prefix-caching``.
        max_model_len: cap on token slots per request (None: no cap).
    """

    def __init__(
        self,
        *,
        num_gpu_blocks: int | None,
        block_size: int,
        enable_caching: bool = True,
        max_model_len: int | None = None,
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len if max_model_len is not None else 1 << 62
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching=enable_caching)
        self.req_to_blocks: dict[str, list[int]] = {}
        self.num_cached_block: dict[str, int] = {}

    # -- rule 1 ------------------------------------------------------------------------------
    def get_computed_blocks(self, request: SimRequest) -> tuple[list[int], int]:
        """Longest cached prefix: ``(hit block ids, hit tokens)`` (vLLM ``get_computed_blocks``)."""
        if not self.enable_caching or request.skip_reading:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        get = self.block_pool._first.get
        hits: list[int] = []
        append = hits.append
        for key in islice(request.block_keys, max_blocks):
            b = get(key)
            if b is None:
                break
            append(b)
        return hits, len(hits) * self.block_size

    # -- rule 2 ------------------------------------------------------------------------------
    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[int],
        num_evictable: int | None = None,
    ) -> int:
        """Blocks the pool must provide so the request has ``num_tokens`` slots (vLLM
        ``SingleTypeKVCacheManager.get_num_blocks_to_allocate``): new blocks plus hit blocks
        that are eviction candidates (they leave the free queue when touched);
        ``num_evictable`` is that count when the caller already has it."""
        num_required = cdiv(num_tokens, self.block_size)
        num_held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            return max(num_required - num_held, 0)
        num_new = max(num_required - len(new_computed_blocks) - num_held, 0)
        if num_evictable is None:
            ref = self.block_pool.ref_cnt
            num_evictable = sum(1 for b in new_computed_blocks if ref[b] == 0)
        return num_new + num_evictable

    def allocate_slots(
        self,
        request: SimRequest,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Sequence[int] | None = None,
        *,
        full_sequence_must_fit: bool = False,
    ) -> list[int] | None:
        """Give the request slots for ``num_new_tokens`` more tokens; None if the pool is short.

        vLLM ``KVCacheManager.allocate_slots`` (rules 2 and 3). Returns the newly allocated block
        ids (hit blocks are not included), or None with nothing changed.
        """
        new_computed = new_computed_blocks or ()
        rid = request.request_id
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local_computed, self.max_model_len)
        free = self.block_pool.get_num_free_blocks()
        evictable = None
        if new_computed:
            ref = self.block_pool.ref_cnt
            evictable = sum(1 for b in new_computed if ref[b] == 0)
        if full_sequence_must_fit:
            full_num_tokens = min(request.num_tokens, self.max_model_len)
            if self.get_num_blocks_to_allocate(rid, full_num_tokens, new_computed,
                                               evictable) > free:
                return None
        num_tokens_need_slot = min(total_computed + num_new_tokens, self.max_model_len)
        if self.get_num_blocks_to_allocate(rid, num_tokens_need_slot, new_computed,
                                           evictable) > free:
            return None
        req_blocks = self.req_to_blocks.get(rid)
        if req_blocks is None:
            req_blocks = self.req_to_blocks[rid] = []
        if new_computed_blocks and rid not in self.num_cached_block:
            assert self.enable_caching and not req_blocks
            self.block_pool.touch(new_computed_blocks)
            req_blocks.extend(new_computed_blocks)
            self.num_cached_block[rid] = len(req_blocks)
        num_new_blocks = cdiv(num_tokens_need_slot, self.block_size) - len(req_blocks)
        if not self.enable_caching:
            new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
            req_blocks.extend(new_blocks)
            return new_blocks
        # Rule 3: register every block full of scheduled tokens. Held blocks that became full
        # first, then the new ones in the same pass as their allocation (same result as vLLM's
        # allocate-then-cache, see BlockPool.get_new_blocks).
        num_full = min(total_computed + num_new_tokens, request.num_tokens) // self.block_size
        num_cached = self.num_cached_block.get(rid, 0)
        held = len(req_blocks)
        if num_cached < held and num_full > num_cached:
            self.block_pool.cache_full_blocks(req_blocks, request.block_keys, num_cached,
                                              min(num_full, held))
        if num_new_blocks > 0:
            new_blocks = self.block_pool.get_new_blocks(
                num_new_blocks, request.block_keys, held, max(0, num_full - held))
            req_blocks.extend(new_blocks)
        else:
            new_blocks = []
        if num_full > num_cached:
            self.num_cached_block[rid] = num_full
        return new_blocks

    # -- rule 3 ------------------------------------------------------------------------------
    def cache_blocks(self, request: SimRequest, num_tokens: int) -> None:
        """Register every block full of the first ``num_tokens`` tokens (vLLM ``cache_blocks``)."""
        rid = request.request_id
        num_cached = self.num_cached_block.get(rid, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(
            self.req_to_blocks[rid], request.block_keys, num_cached, num_full
        )
        self.num_cached_block[rid] = num_full

    # -- a request alone --------------------------------------------------------------------
    def run_alone(self, request: SimRequest) -> int | None:
        """Run ``request`` from admission to free on an idle cache, in one pass; hit tokens.

        The same state and counters as the step-by-step sequence of sequential replay (vLLM
        ``get_computed_blocks``, ``allocate_slots`` of the prompt with the whole sequence
        required to fit, ``max_tokens - 1`` fed-back tokens, ``free``) when nothing else holds a
        block: see :meth:`BlockPool.run_alone`. Sets ``cached_tokens``, ``num_computed_tokens``
        and the output count on the request.

        Returns:
            Hit tokens (a multiple of ``block_size``), or None with nothing changed when the
            fast path does not apply (caching off, unbounded pool, blocks in use, a sequence
            longer than the cache or than ``max_model_len``): the caller then runs the steps.
        """
        pool = self.block_pool
        if not self.enable_caching or pool._unbounded or self.req_to_blocks:
            return None
        bs = self.block_size
        p = request.num_prompt_tokens
        out = max(request.max_tokens, 1)
        num_tokens = p + out - 1  # token slots at the peak (the last sampled token is not fed)
        if (request.num_tokens != p or request.num_computed_tokens or p < 1
                or num_tokens > self.max_model_len or not pool.is_idle()
                or cdiv(num_tokens, bs) > pool.free_queue.num_free_blocks):
            return None
        if out > 1:
            request.append_output_tokens(out)  # keys do not depend on the cache state
        else:
            request.num_output_tokens = 1
        num_lookup = 0 if request.skip_reading else (p - 1) // bs
        hit_blocks = pool.run_alone(request.block_keys, num_lookup, cdiv(num_tokens, bs),
                                    num_tokens // bs)
        request.cached_tokens = hit_blocks * bs
        request.num_computed_tokens = num_tokens
        return hit_blocks * bs

    # -- rule 4 ------------------------------------------------------------------------------
    def free(self, request: SimRequest) -> None:
        """Return the request's blocks to the pool, tail first (vLLM ``KVCacheManager.free``)."""
        rid = request.request_id
        blocks = self.req_to_blocks.pop(rid, [])
        self.num_cached_block.pop(rid, None)
        self.block_pool.free_blocks(reversed(blocks))

    def reset_prefix_cache(self) -> bool:
        """Clear every cached key if no block is in use (vLLM ``reset_prefix_cache``)."""
        return self.block_pool.reset_prefix_cache()

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block ids in position order (vLLM ``get_block_ids``)."""
        return list(self.req_to_blocks.get(request_id, ()))

    @property
    def usage(self) -> float:
        """KV-cache usage fraction, vLLM ``kv_cache_usage_perc``."""
        return self.block_pool.usage
