"""Exact candidate tokens: the token ids of a prompt from the upstream's ``/tokenize``.

vLLM serves a prompt's cached tokens in whole blocks: the longest run of leading full blocks
whose chained hashes are in its cache, and never the last prompt token (a prompt fully cached
recomputes its last block's final token: ``vllm/v1/core/kv_cache_manager.py``
``get_computed_blocks``, ``max_cache_hit_length = num_tokens - 1``). With the token ids of the
candidate writer's prompt and of this one, the tokens the candidate's blocks can supply are
therefore exact (:func:`shared_tokens`), as long as vLLM has not evicted them; without token ids
the gateway only knows the writer's prompt length, an upper bound.

The token ids come from the upstream's ``POST /tokenize`` (vLLM renders the chat template, the
tools and the special tokens exactly as it will for the request): one more upstream call per
request, so the gateway makes it only with ``tokenize = "upstream"`` (any mode),
concurrently with the forwarded request (it adds no latency to the answer), for
``/v1/chat/completions`` and ``/v1/completions``; ``/v1/messages`` stays an upper bound (vLLM's
``/tokenize`` takes OpenAI chat messages; its Anthropic route converts the request first, and
``/v1/messages/count_tokens`` gives a count, not ids: ``docs/gateway.md``). Only
8-byte digests of each block's chain are kept (never token ids or text).
"""

from __future__ import annotations

import hashlib
from array import array

#: Bytes kept per block hash.
BLOCK_HASH_BYTES = 8

#: The fields of a chat request that change what ``/tokenize`` renders.
CHAT_FIELDS = ("messages", "tools", "chat_template", "chat_template_kwargs",
               "add_generation_prompt", "continue_final_message", "add_special_tokens",
               "mm_processor_kwargs")


def tokenize_request(endpoint: str, body: dict) -> dict | list[int] | None:
    """The ``/tokenize`` body for a request body, its token ids already (a completions prompt
    given as ids), or None (endpoint not covered: ``messages``, or a list of prompts)."""
    model = body.get("model")
    if endpoint == "chat":
        req = {"model": model}
        req.update({k: body[k] for k in CHAT_FIELDS if k in body and body[k] is not None})
        return req
    if endpoint == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list):
            return [int(t) for t in prompt]
        req = {"model": model, "prompt": prompt}
        if body.get("add_special_tokens") is not None:
            req["add_special_tokens"] = body["add_special_tokens"]
        return req
    return None


def block_chain(tokens: list[int], block_size: int) -> bytes:
    """8-byte digests of the chained hashes of the full blocks of ``tokens`` (block i's hash
    covers blocks 0..i, as vLLM's block hashes do), concatenated."""
    out = bytearray()
    prev = b""
    for i in range(len(tokens) // block_size):
        h = hashlib.sha256(prev + array("q", tokens[i * block_size:(i + 1) * block_size])
                           .tobytes()).digest()
        prev = h
        out += h[:BLOCK_HASH_BYTES]
    return bytes(out)


def shared_tokens(candidate: bytes, prompt: bytes, prompt_tokens: int, block_size: int) -> int:
    """Tokens the candidate's blocks can supply to this prompt: the leading equal block hashes
    of the two chains (:func:`block_chain`) times ``block_size``, then
    ``(min(shared, prompt_tokens - 1) // block_size) * block_size`` (the vLLM rule above)."""
    n = 0
    step = BLOCK_HASH_BYTES
    limit = min(len(candidate), len(prompt))
    while n + step <= limit and candidate[n:n + step] == prompt[n:n + step]:
        n += step
    shared = (n // step) * block_size
    if prompt_tokens <= 0:
        return 0
    return (min(shared, prompt_tokens - 1) // block_size) * block_size
