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

from prefixscope.core.identity import RENDER_FIELDS, render_options

#: Bytes kept per block hash.
BLOCK_HASH_BYTES = 8

#: How each of :data:`~prefixscope.core.identity.RENDER_FIELDS` (the one list of fields that
#: can change the tokens) reaches vLLM's ``POST /tokenize`` for a chat request
#: (``TokenizeChatRequest``, vLLM 0.32): passed as they are ...
TOKENIZE_CHAT_DIRECT = ("chat_template", "chat_template_kwargs", "add_generation_prompt",
                        "continue_final_message", "add_special_tokens", "mm_processor_kwargs",
                        "media_io_kwargs")
#: ... or given to the template inside ``chat_template_kwargs``, as the chat route does
#: (``ChatCompletionRequest.build_chat_params``: ``documents`` and ``reasoning_effort`` join
#: the template's keyword arguments, ``reasoning_effort`` also sets ``enable_thinking``
#: unless the request set it).
TOKENIZE_CHAT_KWARGS = ("documents", "reasoning_effort")
#: For a completions request: ``TokenizeCompletionRequest`` takes ``add_special_tokens``.
TOKENIZE_COMPLETIONS_DIRECT = ("add_special_tokens",)
#: The fields a chat ``/tokenize`` body carries besides ``model``.
CHAT_FIELDS = ("messages", "tools") + TOKENIZE_CHAT_DIRECT
# every other render field (truncate_prompt_tokens, response_format, a tool_choice beside
# tools, prompt_embeds...) cannot be said to /tokenize: such a request gets no token ids and
# its candidate tokens stay an upper bound, never a wrong "exact"
assert set(TOKENIZE_CHAT_DIRECT + TOKENIZE_CHAT_KWARGS) <= set(RENDER_FIELDS)


def tokenize_request(endpoint: str, body: dict) -> dict | list[int] | None:
    """The ``/tokenize`` body for a request body, its token ids already (a completions prompt
    given as ids), or None: endpoint not covered (``messages``, a list of prompts), or the
    request sets a render field ``/tokenize`` cannot take (the tokens would not be the ones
    the request is served with)."""
    model = body.get("model")
    opts = render_options(body)
    if endpoint == "chat":
        if not body.get("tools"):
            opts.pop("tool_choice", None)  # vLLM renders tool_choice only beside tools
        if any(k not in TOKENIZE_CHAT_DIRECT and k not in TOKENIZE_CHAT_KWARGS for k in opts):
            return None
        req = {"model": model}
        req.update({k: body[k] for k in ("messages", "tools") if body.get(k) is not None})
        req.update({k: v for k, v in opts.items() if k in TOKENIZE_CHAT_DIRECT})
        extra = {k: opts[k] for k in TOKENIZE_CHAT_KWARGS if k in opts}
        if extra:
            kwargs = req.get("chat_template_kwargs") or {}
            if not isinstance(kwargs, dict):
                return None  # vLLM refuses the request itself
            kwargs = dict(kwargs)
            if "reasoning_effort" in extra and "enable_thinking" not in kwargs:
                extra["enable_thinking"] = extra["reasoning_effort"] != "none"
            kwargs.update(extra)
            req["chat_template_kwargs"] = kwargs
        return req
    if endpoint == "completions":
        if any(k not in TOKENIZE_COMPLETIONS_DIRECT for k in opts):
            return None
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list):  # token ids: add_special_tokens adds nothing to ids
            return [int(t) for t in prompt]
        req = {"model": model, "prompt": prompt}
        req.update(opts)
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
