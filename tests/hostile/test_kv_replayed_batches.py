"""``ingest kv-events FILE``: a batch repeated inside the file (a replayed batch, same seq and
time) is counted as repeated within the file, not as "already stored" (which reads like a
re-ingest on a fresh instance); ``--json`` adds ``rows_repeated_in_file``."""

from __future__ import annotations

import json

from tests.hostile.support import fresh_db, run_cli


def _batch(seq: int, ts: float, hashes: list[int]) -> str:
    return json.dumps({"source": "pub", "topic": "kv-events", "seq": seq, "payload": [ts, [
        {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
         "token_ids": [1] * (16 * len(hashes)), "block_size": 16}]]}) + "\n"


def test_replayed_batches_are_named_apart_from_already_stored(tmp_path):
    a, b = _batch(1, 1795961090.5, [11, 12, 13]), _batch(2, 1795961091.5, [14, 15])
    f = tmp_path / "kv.jsonl"
    f.write_text(a + b + a + a)  # batch 1 replayed twice: 6 repeated rows
    db = fresh_db(tmp_path)
    code, out, err = run_cli(["ingest", "kv-events", f, "--instance", "x", "--db", db])
    assert code == 0, err
    assert out.splitlines()[0] == (f"{f}: 5 event rows added, 6 repeated within the file "
                                   "(replayed batches), 0 already stored, 0 lines quarantined")
    g = tmp_path / "kv2.jsonl"  # the same capture under another name: now stored before
    g.write_text(a + b + a + a)
    code, out, err = run_cli(["ingest", "kv-events", g, "--instance", "x", "--db", db, "--json"])
    assert code == 0, err
    [doc] = json.loads(out)
    assert (doc["rows_added"], doc["rows_duplicate"], doc["rows_repeated_in_file"]) == (0, 11, 6)
    h = tmp_path / "kv3.jsonl"
    h.write_text(b)
    code, out, err = run_cli(["ingest", "kv-events", h, "--instance", "x", "--db", db])
    assert code == 0, err
    assert out.splitlines()[0] == (f"{h}: 0 event rows added, 2 already stored, "
                                   "0 lines quarantined")
