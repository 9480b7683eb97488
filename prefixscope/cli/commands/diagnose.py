"""``prefixscope diagnose TRACE``: why the cache misses, where in the prompt, and the fix proved
by exact replay (``replay/diagnose.py``, ``replay/diagnose_fix.py``, docs/diagnose.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption, err, out, print_json
from prefixscope.cli.options import (AlgoOption, BlockSizeOption, CapacityBlocksOption,
                                     FormatOption, HashIdBlockSizeOption, IngestOption,
                                     LayoutOption, LimitOption, MaxModelLenOption,
                                     OutputTokensOption, PricesOption, SeedOption, StrictOption,
                                     TokenizerOption, TraceArg, sim_spec_from_options)
from prefixscope.core.errors import NothingIngested, UsageError


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _where(b: dict[str, Any]) -> str:
    seg = b.get("segment")
    if seg == "message":
        return f"message {b['message_index']} ({b['role']}), line {b['line']}"
    if seg == "tools":
        if b.get("kind") not in ("tool_schema", "tool_description", "tool_key_order"):
            return "tools"
        extra = f" {b['tool']}" if b.get("tool") else ""
        key = f", key {b['schema_key']}" if b.get("schema_key") else ""
        return f"tools{extra}{key}"
    if seg == "template":
        return f"template text before message {b['message_index']} ({b['role']})"
    if seg in ("tokens", "blocks"):
        return f"{seg}, block {b.get('block')}" if b.get("block") is not None else seg
    return "whole request"


def _cost(summary: Any, price: Any) -> dict[str, Any] | None:
    from prefixscope.replay.compare import run_cost

    if price is None or summary is None:
        return None
    return {k: float(v) for k, v in run_cost(summary, price).items()}


def diagnosis_doc(d: Any, *, price: Any = None, layout_path: str | None = None,
                  seconds: float = 0.0, ledger: Any = None) -> dict[str, Any]:
    """The ``--json`` document of a :class:`~prefixscope.replay.diagnose_fix.Diagnosis`
    (fields documented in docs/diagnose.md#json); ``ledger``: the trace's
    :class:`~prefixscope.replay.ledger.LedgerTotals` (the ``ledger`` field; None: omitted)."""
    from prefixscope.replay.diagnose_ledger import ledger_doc
    from prefixscope.replay.layouts import rewrites

    s = d.summary
    base_cost = _cost(s, price)
    what_if = None
    if d.what_if is not None:
        w = d.what_if
        wc = _cost(w, price)
        what_if = {
            "hit_rate": w.hit_rate, "cached_tokens": w.cached_tokens,
            "prompt_tokens": w.prompt_tokens,
            "cached_tokens_delta": w.cached_tokens - s.cached_tokens,
            "hit_rate_delta": None if w.hit_rate is None or s.hit_rate is None
            else w.hit_rate - s.hit_rate,
            "cost_with_cache": None if wc is None else wc["cost_with_cache"],
            "cost_delta": None if wc is None or base_cost is None
            else wc["cost_with_cache"] - base_cost["cost_with_cache"],
            "all_spans_matched_hit_rate": None if d.neutralised is None else d.neutralised.hit_rate,
            "prefill_saved_tokens": d.prefill_saved,
            "prompt_tokens_delta": w.prompt_tokens - s.prompt_tokens,
            "rewrites_prompt": rewrites(d.suggested_layout),
        }
    breakers = []
    for b in d.breakers:
        bd = b.as_dict()
        if bd["what_if"] is not None:
            cc = _cost(b.counterfactual, price)
            bd["what_if"]["cost_delta"] = None if cc is None or base_cost is None \
                else cc["cost_with_cache"] - base_cost["cost_with_cache"]
        breakers.append(bd)
    doc = {
        "trace": d.spec.trace, "format": d.base.format,
        "requests": s.requests, "counted_requests": s.counted_requests,
        "rejected_requests": s.rejected_requests,
        "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens, "hit_rate": s.hit_rate,
        "missed_tokens": s.prompt_tokens - s.cached_tokens,
        "block_size": s.block_size, "capacity_blocks": s.num_gpu_blocks, "hash_algo": s.hash_algo,
        "cold_requests": d.base.cold_requests, "short_requests": d.base.short_requests,
        "full_hit_requests": d.base.full_hit_requests,
        "levels": d.levels, "breakers": breakers,
        "suggested_layout": None if d.suggested_layout is None else {
            "path": layout_path, **d.suggested_layout.as_dict()},
        "what_if": what_if,
        "cost": None if base_cost is None else {
            **base_cost, "currency": price.currency, "shadow": price.shadow,
            "price_source": price.price_source, "priced_as": price.model},
        "skipped_records": len(d.base.problems),
        "problems": [str(p) for p in d.base.problems[:20]],
        "notes": d.notes, "replays": d.passes, "seconds": round(seconds, 3),
        "allow_rewrites": d.allow_rewrites,
        "ledger": None if ledger is None else ledger_doc(ledger, breakers[0] if breakers else None),
    }
    return doc


def _n(count: int, word: str) -> str:
    """``1 request``, ``2 requests`` (thousands separated)."""
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def _print(doc: dict[str, Any], *, no_text: bool) -> None:
    p = lambda s: out.print(s, markup=False, highlight=False)  # noqa: E731
    cap = "unbounded" if doc["capacity_blocks"] is None else f"{doc['capacity_blocks']:,} blocks"
    p(f"{_n(doc['requests'], 'request')}, {doc['prompt_tokens']:,} prompt tokens, "
      f"{doc['cached_tokens']:,} from cache ({_pct(doc['hit_rate'])}); exact model: block size "
      f"{doc['block_size']}, capacity {cap}, {doc['hash_algo']}")
    for note in doc["notes"]:  # a note (nothing shared, every request rejected) comes first
        p(note)
    if doc.get("ledger") is not None and doc["ledger"]["prompt_tokens"]:
        from prefixscope.replay.diagnose_ledger import waterfall_lines

        top = doc["breakers"][0] if doc["breakers"] else None
        for line in waterfall_lines(doc["ledger"], where=_where(top) if top else None):
            p(line)
    if not doc["breakers"]:
        if not doc["notes"]:
            p("no breakers: every request hit the longest prefix an earlier request had; "
              "what missed is content no earlier request had")
    else:
        p("breakers, by lost tokens (cached tokens gained when the span matches, exact replay):")
    for b in doc["breakers"]:
        lost = f"{b['lost_tokens']:,} lost" + ("" if b["lost_tokens_measured"] else " (at most)")
        share = "" if b["share"] is None else f", {_pct(b['share'])} of missed"
        p(f"  #{b['rank']} level {b['level']} {b['kind']:<17} {_where(b)}: {_n(b['requests'], 'request')}, "
          f"{_n(b['distinct_values'], 'value')}, {lost}{share}")
        p(f"     what: {b['what']}")
        if b.get("detail") and not no_text:
            p(f"     {b['detail']}")
        sug = b["suggestion"]
        if no_text:
            sug = sug.split(":")[0] if sug.startswith("not ") else sug.split(" (")[0]
        p(f"     fix: {sug}")
        cf = b.get("client_fix")
        if cf is not None and cf["measured"]:
            p(f"     client fix replayed: hit rate {_pct(cf['hit_rate'])}, "
              f"{cf['prefill_saved_tokens']:+,} prefill tokens saved")
    w = doc["what_if"]
    if w is not None:
        cost = ""
        if w["cost_delta"] is not None:
            cost = f"; cost with cache {w['cost_delta']:+,.4f} {doc['cost']['currency']}"
        label = "suggested layout (rewrites the prompt)" if w.get("rewrites_prompt") \
            else "suggested layout (moves content only)"
        p(f"{label}: saves {w['prefill_saved_tokens']:,} prefill tokens (prompt tokens computed, "
          f"{_pct(w['prefill_saved_tokens'] / max(1, doc['missed_tokens']))} of the missed); "
          f"hit rate {_pct(doc['hit_rate'])} -> {_pct(w['hit_rate'])} "
          f"({w['cached_tokens_delta']:+,} cached tokens{cost}), exact replay")
        if w.get("all_spans_matched_hit_rate") is not None and \
                w["all_spans_matched_hit_rate"] > (w["hit_rate"] or 0) + 1e-9:
            p(f"  with every breaker neutralised (counterfactual, not a suggestion): "
              f"{_pct(w['all_spans_matched_hit_rate'])}")
        if doc["suggested_layout"] and doc["suggested_layout"].get("path"):
            p(f"  written to {doc['suggested_layout']['path']} (replay sim --layout reproduces it)")
    p(f"not breakers: {_n(doc['cold_requests'], 'request')} went on with content no earlier request "
      f"had, {doc['short_requests']:,} shorter than one block")


def _explain(a: Any, *, no_text: bool) -> None:
    p = lambda s: out.print(s, markup=False, highlight=False)  # noqa: E731
    p(f"request {a.request_id} ({a.source}): {a.prompt_tokens:,} prompt tokens, "
      f"{a.cached_tokens:,} from cache; an unbounded cache would have served "
      f"{a.matchable_tokens:,} (vLLM's limit {a.limit_tokens:,})")
    if a.kind is None:
        p("  no break: it hit every block an earlier request had cached")
        return
    pos = a.position
    where = ""
    if pos is not None:
        where = _where({"kind": a.kind, "segment": pos.segment, "message_index": pos.message_index,
                        "role": pos.role, "line": pos.line, "tool": pos.tool_name,
                        "schema_key": pos.schema_key, "block": pos.block})
        if pos.column is not None:
            where += f", column {pos.column}"
    p(f"  {a.kind} at token {a.divergence_token}: {where}")
    if a.earlier_request_id:
        p(f"  matched against earlier request {a.earlier_request_id}")
    if a.detail and not no_text:
        p(f"  {a.detail}")
    if a.context and not no_text:
        k = int(a.context["offset"])
        p(f"  this request: …{a.context['new'][:k]}[{a.context['new'][k:]}]…")
        p(f"  earlier:      …{a.context['old'][:k]}[{a.context['old'][k:]}]…")


def diagnose_cmd(
    trace: TraceArg,
    fmt: FormatOption = "auto",
    block_size: BlockSizeOption = 16,
    capacity_blocks: CapacityBlocksOption = None,
    algo: AlgoOption = "sha256",
    hash_id_block_size: HashIdBlockSizeOption = 512,
    output_tokens: OutputTokensOption = "trace",
    max_model_len: MaxModelLenOption = None,
    tokenizer: TokenizerOption = None,
    layout: LayoutOption = None,
    limit: LimitOption = None,
    seed: SeedOption = None,
    strict: StrictOption = False,
    model: Annotated[str | None, typer.Option(
        "--model", help="Model the trace is for (the price-table entry for cost; the runs' "
                        "model with --ingest; default replay-sim).")] = None,
    prices: PricesOption = None,
    scope_by_model: Annotated[bool, typer.Option(
        "--scope-by-model", help="Each request's model enters its block hashes (as a LoRA "
                                 "adapter's name does): models never share blocks.")] = False,
    request: Annotated[str | None, typer.Option(
        "--request", help="Explain one request: where its prefix broke, with context.")] = None,
    no_text: Annotated[bool, typer.Option(
        "--no-text", help="Print structure only: no prompt text, patterns or context.")] = False,
    levels: Annotated[int, typer.Option("--levels", min=1, max=5,
                                        help="Levels of breakers to look for.")] = 3,
    allow_rewrites: Annotated[bool, typer.Option(
        "--allow-rewrites", help="Also suggest transforms that change what the model reads "
                                 "(placeholders, whitespace normalisation), labelled as "
                                 "such. Default: moves and tool/JSON order only.")] = False,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Directory for suggested-layout.yaml and breakers.json "
                      "(default out/replay/diagnose-<trace>-<time>Z-<hex>).")] = None,
    ingest: IngestOption = False,
    db: DbOption = DB_DEFAULT,
    as_json: JsonOption = False,
) -> None:
    """Say why the prefix cache misses, where in the prompt, and prove the fix by replay.

    Replays TRACE through the exact cache model (the options of 'replay sim'), finds for every
    request the earlier request with the longest common prefix (by the block-hash chain) and
    the first token that differs, maps it to the message and line (or the tools, or the
    template), names its kind, ranks breakers by lost tokens (counterfactual replay), and
    replays a suggested layout. Prompt text is printed only here, and written only to
    suggested-layout.yaml under --out, whose patterns hold the start of each matched line (e.g.
    "^Current date: ") as a literal: share that file as you would the trace. breakers.json and
    the database (--ingest) keep no text (kinds, positions, counts, digests).

    Examples:

      prefixscope diagnose data/captures/aider/chat-requests.jsonl

      prefixscope diagnose data/captures/aider/chat-requests.jsonl --request aider-0003-01

      prefixscope diagnose traffic.jsonl --capacity-blocks 2000 --model llama-3-8b --ingest --json
    """
    from prefixscope.cli.commands.replay_sim import _price
    from prefixscope.replay.diagnose import DiagnoseSpec, attribution_pass
    from prefixscope.replay.diagnose_fix import diagnose, suggested_layout_file
    from prefixscope.replay.layouts import load_layout

    started = time.time()
    if ingest and (layout is not None or scope_by_model):
        raise UsageError("--ingest stores the trace as recorded, as replay sim replays it: "
                         "drop --layout and --scope-by-model")
    run = sim_spec_from_options(
        trace, fmt=fmt, block_size=block_size, capacity_blocks=capacity_blocks, algo=algo,
        hash_id_block_size=hash_id_block_size, output_tokens=output_tokens,
        max_model_len=max_model_len, tokenizer=tokenizer, limit=limit, seed=seed, strict=strict)
    spec = DiagnoseSpec.of(run, layout=load_layout(layout) if layout else None,
                           scope_by_model=scope_by_model)
    if request is not None:
        p = attribution_pass(spec, explain=request)
        if p.explained is None:
            raise NothingIngested(f"{trace}: no request {request!r} (of {p.summary.requests:,})")
        if as_json:
            a = p.explained
            pos = a.position
            print_json({"request_id": a.request_id, "source": a.source, "kind": a.kind,
                        "prompt_tokens": a.prompt_tokens, "cached_tokens": a.cached_tokens,
                        "matchable_tokens": a.matchable_tokens,
                        "divergence_token": a.divergence_token,
                        "earlier_request": a.earlier_request_id,
                        "segment": pos.segment if pos else None,
                        "message_index": pos.message_index if pos else None,
                        "role": pos.role if pos else None, "line": pos.line if pos else None,
                        "column": pos.column if pos else None,
                        "tool": pos.tool_name if pos else None,
                        "schema_key": pos.schema_key if pos else None,
                        "block": pos.block if pos else None})
            return
        _explain(p.explained, no_text=no_text)
        return
    d = diagnose(spec, max_levels=levels, allow_rewrites=allow_rewrites)
    for prob in d.base.problems[:20] if not as_json else []:
        err.print(f"skipped {prob}", markup=False, highlight=False)
    if len(d.base.problems) > 20 and not as_json:
        err.print(f"... and {len(d.base.problems) - 20} more skipped records", markup=False,
                  highlight=False)
    if d.summary.requests == 0:
        first = f" (first: {d.base.problems[0]})" if d.base.problems else ""
        raise NothingIngested(f"{trace}: no usable requests; {len(d.base.problems)} records "
                              f"skipped{first}")
    price = _price(model or "replay-sim", prices)
    from prefixscope.replay.run_ids import default_run_dir, new_run_id

    outd = out_dir or default_run_dir(new_run_id("diagnose", Path(str(trace)).stem))
    layout_path = None
    if d.suggested_layout is not None:
        outd.mkdir(parents=True, exist_ok=True)
        layout_path = outd / "suggested-layout.yaml"
        layout_path.write_text(suggested_layout_file(d), encoding="utf-8")
    from prefixscope.replay.diagnose_ledger import trace_ledger_groups

    ledger, ledger_groups = trace_ledger_groups(spec)
    doc = diagnosis_doc(d, price=price, layout_path=str(layout_path) if layout_path else None,
                        seconds=time.time() - started, ledger=ledger)
    ingested = None
    if ingest:
        ingested = _ingest(spec, d, doc, outd, model=model, db=db, ledger=ledger_groups)
        doc["ingested"] = ingested
    if as_json:
        print_json(doc)
        return
    _print(doc, no_text=no_text)
    if ingested is not None:
        out.print(f"stored in {db}: run {ingested['run_id']}, {ingested['breakers_added']} "
                  f"breakers (Breakers page), {ingested['ledger_rows_added']} ledger rows "
                  f"(Miss ledger page)", markup=False, highlight=False)


def _ingest(spec: Any, d: Any, doc: dict[str, Any], outd: Path, *, model: str | None,
            db: str, ledger: Any) -> dict[str, Any]:
    """Replay the trace as recorded (a normal replay run) and store it with the breaker
    summary and the miss ledger: ``breakers.json`` (structure, kinds, counts, digests, no
    text) and ``ledger.json`` (tokens per ledger class, ``replay.ledger_store``) in the run
    directory enter through ``prefixscope.ingest.breakers`` and ``prefixscope.ingest.ledger``."""
    from prefixscope.ingest.breakers import ingest_breakers_file
    from prefixscope.ingest.ledger import ingest_ledger_file
    from prefixscope.replay.ledger_store import write_ledger_file
    from prefixscope.ingest.runs import ingest_run_dir
    from prefixscope.replay.diagnose_store import write_breakers_file
    from prefixscope.replay.runner import run_sim
    from prefixscope.store import db as store_db

    sim = spec.run_spec(model=model, strict=False,
                        label=f"{Path(spec.trace).name.split('.')[0]} as recorded (diagnosed)")
    run = run_sim(sim, outd / "run")
    path = write_breakers_file(outd / "run" / "breakers.json", d, doc, run_id=run.run_id,
                               model=run.model)
    lpath = write_ledger_file(outd / "run" / "ledger.json", [ledger], run_id=run.run_id,
                              run_kind="replay-sim", label=sim.label,
                              block_size=doc["block_size"],
                              capacity_blocks=doc["capacity_blocks"], model=model,
                              default_model=run.model, trace=spec.trace)
    with store_db.writer(db) as con:
        r = ingest_run_dir(con, run.out_dir)
        added = ingest_breakers_file(con, path)
        ledger_added = ingest_ledger_file(con, lpath)
    return {"db": db, "run_id": run.run_id, "requests_added": r.usage.rows_added,
            "breakers_added": added, "breakers_file": str(path),
            "ledger_rows_added": ledger_added, "ledger_file": str(lpath)}


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``prefixscope diagnose``."""
    groups["app"].command("diagnose")(diagnose_cmd)


__all__ = ["diagnose_cmd", "diagnosis_doc", "register", "json"]
