"""Readers of hash-id traces: Mooncake FAST'25 / Qwen-Bailian JSONL and kv-cache-tester
conversation JSON (formats in ``replay/traces.py``; id expansion in ``replay/trace_hashids.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from prefixscope.core.errors import SourceUnavailable, invalid_json_reason
from prefixscope.core.bounds import TOO_DEEP
from prefixscope.replay.trace_common import (
    GZIP_ERRORS,
    LONG_NUMBER_JSON,
    MAX_DOC_BYTES,
    NON_FINITE_JSON,
    _NonFinite,
    _Bad,
    _id_list,
    _int_field,
    _no_constant,
    _num_field,
    NOT_UTF8_JSON,
    _Reader,
    read_document_text,
)
from prefixscope.replay.trace_hashids import ExpandedTokens, IdChain, block_keys_for
from prefixscope.replay.types import TraceRequest

#: Seconds between the last arrival of one kv-cache-tester conversation and the next one's start.
CONVERSATION_GAP_S = 1.0
#: kv-cache-tester's id block size (tokens per hash id).
KV_CACHE_TESTER_BLOCK_SIZE = 64
#: Namespace offset per kv-cache-tester conversation (ids are local to a conversation).
_NAMESPACE_BITS = 32


# --------------------------------------------------------------------------------------------
# Mooncake / Bailian
# --------------------------------------------------------------------------------------------


def read_mooncake(r: _Reader, *, hash_id_block_size: int, block_size: int,
                   vocab_size: int | None) -> Iterator[TraceRequest]:
    chain = IdChain()
    s = hash_id_block_size
    first_ts: float | None = None
    stem = r.stem
    serial = 0
    for lineno, obj in r.jsonl():
        if r.done():
            return
        try:
            n = _int_field(obj, "input_length", minimum=1)
            out = _int_field(obj, "output_length", minimum=0) if "output_length" in obj else 0
            ids = _id_list(obj, "hash_ids")
            if len(ids) * s < n:
                raise _Bad("$.hash_ids", f"{len(ids)} ids of {s} tokens cover fewer than "
                                         f"input_length={n} tokens (wrong --hash-id-block-size?)")
            ts = _num_field(obj, "timestamp")
            seconds = ts if "chat_id" in obj else ts / 1000.0
            if first_ts is None:
                first_ts = seconds
            arrival = seconds - first_ts
            if arrival < 0:
                raise _Bad("$.timestamp", "earlier than the first record's timestamp")
        except _Bad as exc:
            r.bad(r.location, lineno, exc)
            continue
        ids = ids[: -(-n // s)]  # ignore ids past the prompt
        before = chain.violations
        canon = chain.canonical(ids)
        r.stats["chain_violations"] += chain.violations - before
        attrs = {"trace": stem}
        if "chat_id" in obj:
            attrs["conversation"] = str(obj["chat_id"])
        serial += 1
        r.stats["requests"] += 1
        yield TraceRequest(
            request_id=f"{stem}:{lineno}",
            arrival_s=arrival,
            num_prompt_tokens=n,
            prompt_token_ids=ExpandedTokens(canon, s, n, serial=serial, vocab_size=vocab_size),
            block_keys=block_keys_for(canon, s, n, block_size, serial=serial),
            output_tokens=out if r.keep_output else 0,
            source=f"{r.location}:{lineno}",
            attrs=attrs,
        )


# --------------------------------------------------------------------------------------------
# kv-cache-tester
# --------------------------------------------------------------------------------------------


def _conversation_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted((p for p in path.iterdir()
                        if p.is_file() and p.name.endswith((".json", ".json.gz"))),
                       key=lambda p: p.name)
        if not files:
            raise SourceUnavailable(f"{path}: no *.json or *.json.gz conversation files")
        return files
    return [path]


def _flatten_conversation(r: _Reader, file: Path, doc: Mapping[str, Any]) \
        -> list[tuple[float, int, int, Mapping[str, Any], str | None]]:
    """(arrival, order, index, request object, sub-agent id) for every request of one file."""
    items: list[tuple[float, int, int, Mapping[str, Any], str | None]] = []
    reqs = doc.get("requests")
    if not isinstance(reqs, list):
        r.bad(str(file), 1, _Bad("$.requests", "missing or not a list"))
        return items
    order = 0
    for idx, req in enumerate(reqs):
        if not isinstance(req, dict):
            r.bad(str(file), idx + 1, _Bad(f"$.requests[{idx}]", "not an object"))
            continue
        if req.get("type") == "subagent":
            try:
                t0 = _num_field(req, "t", path=f"$.requests[{idx}]")
                sub = req.get("requests")
                if not isinstance(sub, list):
                    raise _Bad(f"$.requests[{idx}].requests", "missing or not a list")
            except _Bad as exc:
                r.bad(str(file), idx + 1, exc)
                continue
            agent = str(req.get("agent_id", f"agent-{idx}"))
            for sidx, sreq in enumerate(sub):
                path = f"$.requests[{idx}].requests[{sidx}]"
                try:
                    if not isinstance(sreq, dict):
                        raise _Bad(path, "not an object")
                    t = t0 + _num_field(sreq, "t", path=path)
                except _Bad as exc:
                    r.bad(str(file), idx + 1, exc)
                    continue
                items.append((t, order, idx, {**sreq, "_path": path}, agent))
                order += 1
            continue
        try:
            t = _num_field(req, "t", path=f"$.requests[{idx}]")
        except _Bad as exc:
            r.bad(str(file), idx + 1, exc)
            continue
        items.append((t, order, idx, {**req, "_path": f"$.requests[{idx}]"}, None))
        order += 1
    items.sort(key=lambda it: (it[0], it[1]))
    return items


def read_kv_cache_tester(r: _Reader, *, block_size: int,
                          vocab_size: int | None) -> Iterator[TraceRequest]:
    s = KV_CACHE_TESTER_BLOCK_SIZE
    chain = IdChain()
    start_s = 0.0
    serial = 0
    for k, file in enumerate(_conversation_files(r.path)):
        if r.done():
            return
        try:
            text, bad_line, bad_byte = read_document_text(file, MAX_DOC_BYTES)
            if text is None:
                r.bad(str(file), bad_line, _Bad(None, f"{NOT_UTF8_JSON} (byte {bad_byte})"))
                continue
            doc = json.loads(text, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            r.bad(str(file), exc.lineno, _Bad(None, invalid_json_reason(exc)))
            continue
        except RecursionError:
            r.bad(str(file), 1, _Bad(None, TOO_DEEP))
            continue
        except GZIP_ERRORS:
            r.bad(str(file), 1, _Bad(None, "gzip data is corrupt or cut short"))
            continue
        except _NonFinite:
            r.bad(str(file), 1, _Bad(None, NON_FINITE_JSON))
            continue
        except ValueError:  # an integer of more than 4,300 digits
            r.bad(str(file), 1, _Bad(None, LONG_NUMBER_JSON))
            continue
        except OSError as exc:
            raise SourceUnavailable(f"{file}: cannot read ({exc.strerror or exc})") from exc
        if not isinstance(doc, dict):
            r.bad(str(file), 1, _Bad("$", "not a JSON object"))
            continue
        if doc.get("block_size", s) != s:
            r.bad(str(file), 1, _Bad("$.block_size", f"expected {s}"))
            continue
        stem = file.name.split(".")[0]
        conversation = str(doc.get("id", stem))
        offset = k << _NAMESPACE_BITS
        last = 0.0
        for t, _order, idx, req, agent in _flatten_conversation(r, file, doc):
            if r.done():
                return
            path = req["_path"]
            try:
                n = _int_field(req, "in", minimum=1, path=path)
                out = _int_field(req, "out", minimum=0, path=path) if "out" in req else 0
                ids = _id_list(req, "hash_ids", path=path)
                if len(ids) * s > n:
                    raise _Bad(f"{path}.hash_ids", f"{len(ids)} ids of {s} tokens exceed in={n}")
            except _Bad as exc:
                r.bad(str(file), idx + 1, exc)
                continue
            before = chain.violations
            canon = chain.canonical(ids, offset)
            r.stats["chain_violations"] += chain.violations - before
            serial += 1
            r.stats["requests"] += 1
            last = max(last, t)
            attrs = {"trace": "kv-cache-tester", "conversation": conversation}
            if agent is not None:
                attrs["subagent"] = agent
            model = req.get("model")
            yield TraceRequest(
                request_id=f"{stem}:{path}",
                arrival_s=start_s + t,
                num_prompt_tokens=n,
                prompt_token_ids=ExpandedTokens(canon, s, n, serial=serial, vocab_size=vocab_size),
                block_keys=block_keys_for(canon, s, n, block_size, serial=serial),
                output_tokens=out if r.keep_output else 0,
                model=model if isinstance(model, str) else None,
                source=f"{file}:{idx + 1}",
                attrs=attrs,
            )
        start_s += last + CONVERSATION_GAP_S


