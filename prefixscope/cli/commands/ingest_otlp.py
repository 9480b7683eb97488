"""``prefixscope ingest otlp``: OpenTelemetry GenAI spans, from the collector's file exporter or
received over OTLP/HTTP (``--listen``)."""

from __future__ import annotations

from typing import Annotated

import typer

from prefixscope.cli.common import (DB_DEFAULT, DbOption, JsonOption, err, out, print_json,
                                     print_request_files)
from prefixscope.core.formatting import count_noun
from prefixscope.core.errors import NothingIngested, UsageError


HmacKeyOption = Annotated[str | None, typer.Option(
    "--hmac-key-file", help="Server-side HMAC key: tenant/user ids become namespace digests "
    "(default: PREFIXSCOPE_HMAC_KEY_FILE, [identity] hmac_key_file, PREFIXSCOPE_HMAC_KEY). "
    "Without a key they are dropped, never stored.")]


def optional_hmac_key(hmac_key_file: str | None) -> bytes | None:
    """The configured HMAC key, or None when no key is configured anywhere (raw tenant ids
    are then dropped by the ingesters, never stored).

    Raises:
        ConfigError: a key is configured but cannot be read or is too short.
    """
    import os

    from prefixscope.core.config import load_settings
    from prefixscope.core.identity import load_hmac_key

    configured = load_settings().identity.hmac_key_file
    if not (hmac_key_file or configured or os.environ.get("PREFIXSCOPE_HMAC_KEY_FILE")
            or os.environ.get("PREFIXSCOPE_HMAC_KEY")):
        return None
    return load_hmac_key(hmac_key_file, config_path=configured)


def tenant_digester(hmac_key_file: str | None):
    """raw id -> TENANT namespace digest with the configured key, or None (no key)."""
    from prefixscope.ingest.privacy import digest_tenant

    key = optional_hmac_key(hmac_key_file)
    return None if key is None else (lambda raw: digest_tenant(raw, key))


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:4318")
    return host.strip("[]"), int(port)


def otlp_cmd(
    files: Annotated[list[str] | None, typer.Argument(
        help="Collector file-exporter output: OTLP/JSON, one trace request per line.")] = None,
    listen: Annotated[str | None, typer.Option(
        "--listen", help="Receive OTLP/HTTP on HOST:PORT (POST /v1/traces, protobuf or "
        "JSON) until Ctrl-C, e.g. 127.0.0.1:4318.")] = None,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", help="Run id of the stored rows (default '': production traffic).")] = None,
    instance: Annotated[str | None, typer.Option(
        "--instance", help="Instance for spans without server.address.")] = None,
    input_rule: Annotated[str, typer.Option(
        "--input-rule", help="semconv: gen_ai.usage.input_tokens includes cached tokens "
        "(corrected and flagged when it cannot); provider: Anthropic and Bedrock spans "
        "carry the API's exclusive count.")] = "semconv",
    hmac_key_file: HmacKeyOption = None,
    lock_timeout: Annotated[float, typer.Option(
        "--lock-timeout", help="--listen: seconds a request waits for the store's lock "
        "before answering 503 (the exporter retries).")] = 2.0,
    max_pending: Annotated[int, typer.Option(
        "--max-pending", min=1, help="--listen: requests that may wait for the store; one "
        "more is answered 429 (the exporter retries).")] = 8,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Store token usage from OpenTelemetry GenAI spans as requests.

    Reads gen_ai.usage.input_tokens / output_tokens and the cache attributes under every
    name in use (gen_ai.usage.cache_read.input_tokens, cache_write / cache_creation,
    OpenLLMetry, Sentry, Langfuse, OpenInference llm.token_count.*, Vercel ai.usage.*),
    gen_ai.request.model, gen_ai.response.id, the provider, server address and span
    durations (docs/ingest.md#otlp). Spans without usage are skipped. Tenant and user ids
    are stored only as HMAC namespace digests. With --listen, each request is answered
    after its spans are committed; a locked store answers 503 and the exporter retries.

    Examples:

      prefixscope ingest otlp --listen 127.0.0.1:4318

      prefixscope ingest otlp /var/lib/otelcol/traces.jsonl --json
    """
    from prefixscope.ingest.genai_spans import INPUT_RULES
    from prefixscope.ingest.otlp import SpanOptions

    if input_rule not in INPUT_RULES:
        raise UsageError(f"--input-rule must be one of {', '.join(INPUT_RULES)}")
    if bool(files) == bool(listen):
        raise UsageError("give FILE... (collector file exporter) or --listen HOST:PORT")
    opts = SpanOptions(run_id=run_id or "", instance=instance, input_rule=input_rule,
                       tenant_digester=tenant_digester(hmac_key_file))
    if listen:
        _listen(db, listen, opts, lock_timeout, as_json, max_pending)
        return
    _files(db, files or [], opts, as_json)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``ingest otlp``."""
    groups["ingest"].command("otlp")(otlp_cmd)


def _files(db: str, files: list[str], opts, as_json: bool) -> None:
    from prefixscope.ingest.otlp import ingest_otlp_file

    ingest_and_report(db, files, lambda con, f: ingest_otlp_file(con, f, opts), as_json,
                      nothing="every GenAI span was quarantined")


def ingest_and_report(db: str, files: list[str], ingest_one, as_json: bool, *,
                      nothing: str = "every record was quarantined") -> None:
    """Run ``ingest_one(con, file) -> TailResult`` for each file
    (:func:`prefixscope.ingest.files.ingest_files`) and print the summaries the way every
    ingest command does (``--json``: files, errors, quarantined). Raises NothingIngested when
    nothing was read and something failed."""
    from prefixscope.ingest.files import ingest_files

    def one(con, f):
        r = ingest_one(con, f)
        return r.summary, r.problems

    res = ingest_files(db, files, one)
    print_request_files(res, as_json=as_json)
    results, errors = res.outcomes, res.errors
    read = sum(r.summary.rows_read for r in results)
    if read == 0 and (errors or any(r.summary.rows_quarantined for r in results)):
        why = f"{len(errors)} file(s) could not be read (see above)" if errors else \
            f"{nothing} (see the reasons above)"
        raise NothingIngested(f"no request could be read: {why}")


def _listen(db: str, listen: str, opts, lock_timeout: float, as_json: bool,
            max_pending: int = 8) -> None:
    from prefixscope.ingest.otlp_http import OtlpReceiver

    host, port = _host_port(listen)
    try:
        receiver = OtlpReceiver(db, host=host, port=port, opts=opts, lock_timeout_s=lock_timeout,
                                max_pending=max_pending)
    except OSError as exc:
        raise UsageError(f"--listen {listen}: cannot listen: {exc.strerror or exc}") from None
    err.print(f"receiving OTLP/HTTP traces on {receiver.url} into {db} (Ctrl-C stops)",
              markup=False, highlight=False)

    def _stop(signum, frame):
        raise KeyboardInterrupt

    import signal

    previous = signal.signal(signal.SIGTERM, _stop)  # a service manager's stop: same close
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        receiver.shutdown()
        s = receiver.stats
        if as_json:
            print_json({"url": receiver.url, "requests": s.requests, "spans_added": s.spans_added,
                        "spans_duplicate": s.spans_duplicate, "spans_rejected": s.spans_rejected,
                        "answered_503": s.busy_503, "answered_429": s.busy_429,
                        "answered_400": s.bad_400, "answered_413": s.too_large_413,
                        "answered_431": s.headers_431,
                        "refused_connections": s.refused_connections,
                        "closed_slow": s.closed_slow})
        else:
            out.print(f"{receiver.url}: {count_noun(s.requests, 'export')} stored, "
                      f"{count_noun(s.spans_added, 'request')} added, {s.spans_duplicate:,} "
                      f"already stored, {s.spans_rejected:,} spans quarantined; answered 400 "
                      f"{s.bad_400:,}, 503 {s.busy_503:,} and 429 {s.busy_429:,} times",
                      markup=False, highlight=False)
