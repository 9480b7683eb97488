"""Trace readers: files of recorded traffic -> lazily yielded :class:`~replay.types.TraceRequest`.

Formats (``format=``; ``auto`` guesses from the first record; any file may be
gzip-compressed, ``.gz``):

``mooncake``
    Mooncake FAST'25 / Alibaba Qwen-Bailian JSONL, one request per line:
    ``{"timestamp", "input_length", "output_length", "hash_ids"}``; one id per
    ``hash_id_block_size`` tokens (512 Mooncake, 16 Bailian). ``timestamp`` is milliseconds
    (seconds when the line has ``chat_id``, as in Bailian). Arrival = timestamp minus the first
    line's. Each id expands to tokens determined by the id alone (``replay/trace_hashids.py``).
``kv-cache-tester``
    WEKA/kv-cache-tester conversation JSON (a file, or a directory of ``*.json``): 64-token ids
    local to the conversation; sub-agent requests are their own requests with arrival = the
    sub-agent entry's ``t`` + their own ``t`` and attrs ``subagent``. Conversations of a
    directory (``*.json`` and ``*.json.gz``) are replayed one after the other (sorted by file name), each starting
    :data:`CONVERSATION_GAP_S` after the previous one's last arrival.
``token-ids``
    JSONL ``{"prompt_token_ids": [...], "output_tokens": n, "t": s, "cache_salt": ...}``
    (optional ``request_id``, ``model``, ``lora_name``, ``lora_path``, ``output_token_ids``,
    ``finished_s`` (the recorded end of the answer, for ``--clock observed``),
    ``prompt_logprobs``/``skip_reading``, ``conversation`` and ``instance`` (attrs, for
    ``replay fleet``'s session and recorded routers); ``prompt`` as a token-id list is accepted too).
``chat``
    JSONL of OpenAI chat-completions request bodies (``messages``, ``tools``, ``model``,
    ``max_tokens``...), bare or wrapped as ``request_body``/``body``/``request`` (so the
    pydantic-ai capture lines read as they are), with optional ``t`` (seconds from the trace
    start), ``request_id``, ``conversation``, ``instance``, ``output_tokens``, ``response_text`` (the recorded
    reply: its tokens plus the template's end-of-turn token become ``output_token_ids``, so the
    decode blocks are cached as vLLM would cache them). Anthropic ``/v1/messages``
    bodies are converted to the OpenAI shape first. A layout (``replay/layouts.py``) is applied,
    then the chat template of ``tokenizer_dir`` renders it and the tokenizer counts the tokens
    (``replay/tokenization.py``).

``output_tokens="trace"`` keeps each request's output length; ``"0"`` sets it to 0 (then no
decode blocks are simulated). A malformed record is reported in ``problems`` with file, line and
field and skipped, or raises :class:`~prefixscope.core.errors.ParseError` when ``strict``. Reading is
lazy: requests are produced as the simulator pulls them (kv-cache-tester reads one conversation
file at a time).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prefixscope.core.bounds import (
    BINARY_REASON,
    BINARY_SAMPLE_BYTES,
    ID_TOO_LONG,
    MAX_ID_CHARS,
    MAX_TRACE_LINE_BYTES,
    TOO_DEEP,
    id_ok,
    json_too_deep,
    looks_binary,
)
from prefixscope.core.errors import ConfigError, SourceUnavailable, UsageError
from prefixscope.replay.trace_common import (  # noqa: F401  (TraceProblem, TraceReadResult re-exported)
    GZIP_ERRORS,
    TraceProblem,
    TraceReadResult,
    _Bad,
    _int_field,
    _num_field,
    _Reader,
    open_binary,
    open_text,
)
from prefixscope.replay.trace_hashid_readers import (  # noqa: F401  (constants re-exported)
    CONVERSATION_GAP_S,
    KV_CACHE_TESTER_BLOCK_SIZE,
    read_kv_cache_tester,
    read_mooncake,
)
from prefixscope.replay.types import TraceRequest

#: Largest token id (vLLM's token ids are 32-bit integers).
MAX_TOKEN_ID = 2**31 - 1

FORMATS = ("auto", "mooncake", "kv-cache-tester", "token-ids", "chat")
OUTPUT_TOKENS_CHOICES = ("trace", "0")


# --------------------------------------------------------------------------------------------
# token-id JSONL
# --------------------------------------------------------------------------------------------


def _opt_str(obj: Mapping[str, Any], name: str) -> str | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _Bad(f"$.{name}", "must be a non-empty string")
    if not id_ok(value):
        raise _Bad(f"$.{name}", ID_TOO_LONG)
    return value


def _routing_attrs(obj: Mapping[str, Any]) -> dict[str, str]:
    """``conversation`` and ``instance`` of a token-ids or chat record, as attrs (fleet replay's
    session and recorded routers). ``conversation``: any value, as text (the chat reader's rule);
    ``instance``: a non-empty string or an integer, at most the id length."""
    out = {}
    if obj.get("conversation") is not None:  # as the chat reader always took it
        out["conversation"] = str(obj["conversation"])
    for name in ("instance",):
        value = obj.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
            raise _Bad(f"$.{name}", "must be a non-empty string or an integer")
        if isinstance(value, int) and abs(value) >= 10**MAX_ID_CHARS:
            raise _Bad(f"$.{name}", ID_TOO_LONG)
        text = str(value)
        if not id_ok(text):
            raise _Bad(f"$.{name}", ID_TOO_LONG)
        out[name] = text
    return out


def _request_id(obj: Mapping[str, Any]) -> str | None:
    """The record's ``request_id`` as text (a string or an integer of at most
    :data:`~prefixscope.core.bounds.MAX_ID_CHARS` characters), None when absent."""
    rid = obj.get("request_id")
    if rid is None:
        return None
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise _Bad("$.request_id", "must be a non-empty string or an integer")
    if isinstance(rid, int) and abs(rid) >= 10**MAX_ID_CHARS:  # str() of a huge int is slow
        raise _Bad("$.request_id", ID_TOO_LONG)
    text = str(rid)
    if not id_ok(text):
        raise _Bad("$.request_id", ID_TOO_LONG)
    return text


def _cache_salt(obj: Mapping[str, Any], path: str = "$") -> str | None:
    """vLLM's ``validate_cache_salt`` rule (0.33 ``vllm/entrypoints/generate/base/protocol.py``):
    absent/null, or 1-128 characters without ``@``, ``/``, ``\\`` or NUL."""
    salt = obj.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not 0 < len(salt) <= 128 or any(c in salt for c in "@/\\\0"):
        raise _Bad(f"{path}.cache_salt", "vLLM rejects it (1-128 characters, no @ / \\ or NUL)")
    return salt


def _arrival(obj: Mapping[str, Any], previous: float) -> float:
    for name in ("t", "arrival_s"):
        if name in obj:
            t = _num_field(obj, name)
            if t < 0:
                raise _Bad(f"$.{name}", "must be >= 0 (seconds from the trace start)")
            return t
    return previous


def _read_token_ids(r: _Reader) -> Iterator[TraceRequest]:
    stem = r.stem
    previous = 0.0
    for lineno, obj in r.jsonl():
        if r.done():
            return
        try:
            ids = obj.get("prompt_token_ids", obj.get("prompt"))
            name = "prompt_token_ids" if "prompt_token_ids" in obj else "prompt"
            if not isinstance(ids, list) or not ids or not set(map(type, ids)) <= {int} \
                    or min(ids) < 0 or max(ids) > MAX_TOKEN_ID:
                raise _Bad(f"$.{name}", "missing, empty or not a list of token ids "
                                        "(integers from 0 to 2^31 - 1)")
            out = _int_field(obj, "output_tokens", minimum=0) if "output_tokens" in obj else 0
            out_ids = obj.get("output_token_ids")
            if out_ids is not None and not (isinstance(out_ids, list) and set(
                    map(type, out_ids)) <= {int} and (not out_ids or (
                        min(out_ids) >= 0 and max(out_ids) <= MAX_TOKEN_ID))):
                # The prompt's rule: a generated token is a vocabulary id too.
                raise _Bad("$.output_token_ids", "not a list of token ids (integers from 0 to "
                                                 "2^31 - 1)")
            if out_ids is not None and "output_tokens" not in obj:
                out = len(out_ids)
            arrival = _arrival(obj, previous)
            finished = None
            if obj.get("finished_s") is not None:
                finished = _num_field(obj, "finished_s")
                if finished < arrival:
                    raise _Bad("$.finished_s", "must be >= the arrival time (seconds from the "
                                               "trace start)")
            salt = _cache_salt(obj)
            model = _opt_str(obj, "model")
            lora_name = _opt_str(obj, "lora_name")
            lora_path = _opt_str(obj, "lora_path")
            skip = bool(obj.get("skip_reading")) or obj.get("prompt_logprobs") is not None
            rid = _request_id(obj)
            tags = _routing_attrs(obj)
        except _Bad as exc:
            r.bad(r.location, lineno, exc)
            continue
        previous = arrival
        r.stats["requests"] += 1
        yield TraceRequest(
            request_id=rid if rid is not None else f"{stem}:{lineno}",
            arrival_s=arrival,
            num_prompt_tokens=len(ids),
            prompt_token_ids=ids,
            output_tokens=out if r.keep_output else 0,
            output_token_ids=out_ids if r.keep_output else None,
            model=model,
            cache_salt=salt,
            lora_name=lora_name,
            lora_path=lora_path,
            skip_reading=skip,
            source=f"{r.location}:{lineno}",
            attrs={"trace": stem, **tags},
            finished_s=finished,
        )


# --------------------------------------------------------------------------------------------
# chat-completions request JSONL
# --------------------------------------------------------------------------------------------


class ChatEncoder:
    """How :func:`chat_records` turns text into token ids: the chat tokenizer's ``encode`` and
    its chat template, as ``replay sim`` replays (the default). A diagnosis passes one whose
    :meth:`render` also returns the rendered prompt's offset map
    (``prefixscope.replay.diagnose_replay``); the ids must be the same."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (a reply, no template)."""
        return self.tok.encode(text)

    def render(self, body: Mapping[str, Any]) -> tuple[list[int], Any]:
        """(prompt token ids of the chat body ``body``, what :func:`chat_records` yields beside
        the request: None here).

        Raises:
            ConfigError: the chat template refused the request. ValueError, or ``_Bad`` with
                the field: a malformed request (named file:line by the reader).
        """
        return self.tok.encode_chat(body["messages"], tools=body.get("tools")), None


def _read_chat(r: _Reader, *, tokenizer_dir: str | os.PathLike[str] | None,
               layout: Any) -> Iterator[TraceRequest]:
    for tr, _ in chat_records(r, tokenizer_dir=tokenizer_dir, layout=layout):
        yield tr


def chat_records(r: _Reader, *, tokenizer_dir: str | os.PathLike[str] | None, layout: Any,
                 encoder: Callable[[Any], ChatEncoder] = ChatEncoder
                 ) -> Iterator[tuple[TraceRequest, Any]]:
    """The chat-completions requests of ``r`` (one JSON object a line) as
    ``(TraceRequest, extra)``: the body after ``layout`` (None: as recorded) rendered by
    ``encoder(tokenizer)`` (:class:`ChatEncoder`: vLLM's chat template through the tokenizer of
    ``tokenizer_dir``, None = the bundled one); ``extra`` is the encoder's second value (None
    for the default). Malformed lines are recorded in ``r.problems`` as ``file:line: field:
    reason`` and skipped (``r.strict``: the first one raises).
    """
    from prefixscope.replay.chat_requests import chat_body, output_tokens_of
    from prefixscope.replay.tokenization import load_chat_tokenizer

    tok = load_chat_tokenizer(tokenizer_dir)
    enc = encoder(tok)
    end_of_turn = tok.end_of_turn
    stem = r.stem
    previous = 0.0
    for lineno, obj in r.jsonl():
        if r.done():
            return
        try:
            body = chat_body(obj)
            if layout is not None:
                body = layout.apply(body)
            arrival = _arrival(obj, previous)
            salt = _cache_salt(body) or _cache_salt(obj)
            out = output_tokens_of(obj, body)
            out_ids = None
            response_text = obj.get("response_text")
            if response_text is not None:
                if not isinstance(response_text, str):
                    raise _Bad("$.response_text", "not a string")
                # The reply as the model would emit it, ending with the template's end-of-turn.
                out_ids = enc.encode(response_text + end_of_turn)
                if "output_tokens" not in obj:
                    out = len(out_ids)
            try:
                ids, extra = enc.render(body)
            except ConfigError as exc:  # the chat template refused this request
                raise _Bad("$.messages", "cannot be rendered: " + str(exc).split(": ", 1)[-1]) \
                    from exc
            if not ids:
                raise _Bad("$.messages", "renders to an empty prompt")
            rid = _request_id(obj)
            model = body.get("model")
            if isinstance(model, str) and not id_ok(model):
                raise _Bad("$.model", ID_TOO_LONG)
            tags = _routing_attrs(obj)
        except _Bad as exc:
            r.bad(r.location, lineno, exc)
            continue
        except ValueError as exc:  # chat_body's own validation
            r.bad(r.location, lineno, _Bad(getattr(exc, "field", None),
                                           str(exc) or type(exc).__name__))
            continue
        previous = arrival
        attrs = {"trace": stem, **tags}
        if layout is not None:
            attrs["layout"] = layout.name
        logprobs = body.get("prompt_logprobs") is not None or (
            bool(body.get("echo")) and body.get("logprobs") not in (None, False))
        r.stats["requests"] += 1
        yield TraceRequest(
            request_id=rid if rid is not None else f"{stem}:{lineno}",
            arrival_s=arrival,
            num_prompt_tokens=len(ids),
            prompt_token_ids=ids,
            output_tokens=out if r.keep_output else 0,
            output_token_ids=out_ids if r.keep_output else None,
            model=model if isinstance(model, str) else None,
            cache_salt=salt,
            skip_reading=logprobs,
            source=f"{r.location}:{lineno}",
            attrs=attrs,
        ), extra


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------


def check_trace_file(p: Path) -> None:
    """Refuse what is not a trace file before reading it: a FIFO, a device, a socket
    (``prefixscope.core.bounds.open_regular``), or an uncompressed file whose first 8 KiB are
    mostly not text.

    Raises:
        SourceUnavailable: naming the file and why.
    """
    with open_binary(p) as fh:
        head = fh.read(BINARY_SAMPLE_BYTES)
    if p.suffix != ".gz" and looks_binary(head):
        raise SourceUnavailable(f"{p}: {BINARY_REASON}")


def detect_format(path: str | os.PathLike[str]) -> str:
    """Guess a trace's format from its first record (``kv-cache-tester`` for a directory or a
    ``.json`` file with ``requests``).

    Raises:
        SourceUnavailable: the path does not exist or is empty.
        UsageError: the first record matches no format (give ``--format``).
    """
    p = Path(path)
    if p.is_dir():
        return "kv-cache-tester"
    check_trace_file(p)
    try:
        with open_text(p) as fh:
            head = fh.read(1 << 16)
            first_line, line_no = "", 0
            if head.strip():
                # The first non-blank line, whole (a record may be longer than the sample),
                # read no further than the line bound.
                fh.seek(0)
                while not first_line.strip():
                    first_line = fh.readline(MAX_TRACE_LINE_BYTES + 1)
                    line_no += 1
                    if not first_line:
                        break
    except GZIP_ERRORS:
        raise SourceUnavailable(f"{p}: not a readable gzip file (corrupt or cut short)") from None
    stripped = head.lstrip()
    if not stripped:
        raise SourceUnavailable(f"{p}: empty file")
    fmt_hint = f"give --format ({', '.join(FORMATS[1:])})"
    if len(first_line) > MAX_TRACE_LINE_BYTES:
        raise UsageError(f"{p}:{line_no}: cannot tell the trace format: the first record is "
                         f"longer than {MAX_TRACE_LINE_BYTES:,} bytes (16 MiB, the trace line "
                         f"bound): {fmt_hint}")
    if json_too_deep(first_line):
        raise UsageError(f"{p}:{line_no}: cannot tell the trace format: the first record is "
                         f"{TOO_DEEP}: {fmt_hint}")
    try:
        obj = json.loads(first_line)
    except (json.JSONDecodeError, RecursionError):
        obj = None
    if obj is None and stripped.startswith("{") and '"requests"' in head:
        return "kv-cache-tester"
    if isinstance(obj, dict):
        if "hash_ids" in obj and "input_length" in obj:
            return "mooncake"
        if "requests" in obj and "block_size" in obj:
            return "kv-cache-tester"
        if "prompt_token_ids" in obj or isinstance(obj.get("prompt"), list):
            return "token-ids"
        for key in ("messages", "request_body", "body", "request"):
            if key in obj:
                return "chat"
    raise UsageError(f"{p}: cannot tell the trace format from its first record: give --format "
                     f"({', '.join(FORMATS[1:])})")


def read_trace(path: str | os.PathLike[str], *, format: str = "auto",
               hash_id_block_size: int = 512, block_size: int = 16,
               tokenizer_dir: str | os.PathLike[str] | None = None,
               output_tokens: str = "trace", strict: bool = False, layout: Any = None,
               vocab_size: int | None = None, limit: int | None = None) -> TraceReadResult:
    """Open a trace and return its requests as a lazy iterator.

    Args:
        path: trace file (or a directory of kv-cache-tester conversation files).
        format: one of :data:`FORMATS`.
        hash_id_block_size: tokens per hash id for ``mooncake`` (512 Mooncake, 16 Bailian).
        block_size: the engine block size the ``block_keys`` (fast mode) are made for.
        tokenizer_dir: tokenizer for ``chat`` (default: the bundled ``data/tiny-tokenizer``).
        output_tokens: ``"trace"`` (simulate the trace's output lengths) or ``"0"``.
        strict: raise on the first malformed record instead of skipping it.
        layout: a :class:`prefixscope.replay.layouts.Layout` applied to ``chat`` requests before rendering.
        vocab_size: map hash-id tokens into a vocabulary (live replay); None keeps raw values.
        limit: stop after this many requests (a slice of a big trace).

    Returns:
        :class:`TraceReadResult`; its ``problems`` fill up as ``requests`` is consumed.

    Raises:
        SourceUnavailable: the path does not exist.
        UsageError: unknown format or option values; a layout given for a non-chat trace.
        ParseError: (when ``strict``) the first malformed record, with file, line and field.
        ConfigError: the tokenizer directory cannot be used (``chat``).
    """
    p = Path(path)
    if not p.exists():
        raise SourceUnavailable(f"{p}: no such file or directory")
    if not p.is_dir():
        check_trace_file(p)
    if format not in FORMATS:
        raise UsageError(f"unknown trace format {format!r}: use one of {', '.join(FORMATS)}")
    if output_tokens not in OUTPUT_TOKENS_CHOICES:
        raise UsageError(f"--output-tokens must be 'trace' or '0', not {output_tokens!r}")
    if block_size <= 0 or hash_id_block_size <= 0:
        raise UsageError("block sizes must be positive")
    if vocab_size is not None and vocab_size <= 16:
        raise UsageError("vocab_size must be > 16")
    if limit is not None and limit < 0:
        raise UsageError("limit must be >= 0")
    fmt = detect_format(p) if format == "auto" else format
    if layout is not None and fmt != "chat":
        raise UsageError(f"a layout applies to chat-request traces only, not {fmt}")
    if p.is_dir() and fmt != "kv-cache-tester":
        raise UsageError(f"{p} is a directory: only kv-cache-tester traces can be directories")
    r = _Reader(p, strict=strict, output_tokens=output_tokens, limit=limit)
    if fmt == "mooncake":
        it = read_mooncake(r, hash_id_block_size=hash_id_block_size, block_size=block_size,
                            vocab_size=vocab_size)
    elif fmt == "kv-cache-tester":
        it = read_kv_cache_tester(r, block_size=block_size, vocab_size=vocab_size)
    elif fmt == "token-ids":
        it = _read_token_ids(r)
    else:
        if tokenizer_dir is not None and not Path(tokenizer_dir).is_dir():
            raise ConfigError(f"--tokenizer {tokenizer_dir}: not a directory")
        it = _read_chat(r, tokenizer_dir=tokenizer_dir, layout=layout)
    return TraceReadResult(requests=it, problems=r.problems, format=fmt, stats=r.stats)
