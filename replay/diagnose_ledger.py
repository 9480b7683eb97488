"""The miss ledger of a diagnosed trace: where its prompt tokens went, as a waterfall.

``diagnose`` prints this first (issue 26 item 6): from the prompt tokens to the tokens served
from cache, each loss class of :mod:`prefixscope.replay.ledger` in the order the ledger tests it,
with the top breaker (the rank-1 region of ``diagnose``) named inside *prompt change*, the class
a layout can act on. One instance (the trace as ``replay sim`` replays it, sequential), so
*routing* is 0 here; ``replay fleet`` gives a fleet's ledger.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prefixscope.replay.diagnose_replay import DiagnoseSpec, open_trace
from prefixscope.replay.fleet import replay_fleet
from prefixscope.replay.ledger import CLASSES, LedgerTotals
from prefixscope.replay.ledger_store import SINGLE, PolicyLedger, policy_ledger
from prefixscope.replay.types import TraceRequest

#: The waterfall's steps after the prompt tokens, in the ledger's test order, with the words a
#: reader sees; ``hit`` is the waterfall's end ("from cache").
STEPS = (
    ("granularity", "engine granularity", "partial last block, last token: always computed"),
    ("routing", "routing", "resident on another instance"),
    ("capacity", "capacity", "cached here before, evicted"),
    ("isolation", "isolation", "same prefix under another salt or adapter: by design"),
    ("prompt_change", "prompt change", "seen before, but the prompt diverged earlier"),
    ("cold", "cold", "never seen before"),
)


def _requests(spec: DiagnoseSpec) -> Iterator[TraceRequest]:
    """The trace's requests as diagnose's exact model sees them (``--scope-by-model``: the
    model name as the adapter's, :meth:`ExactCache.prepare`'s rule)."""
    from dataclasses import replace

    for tr, _ in open_trace(spec).items:
        if spec.scope_by_model and tr.lora_name is None and tr.model:
            tr = replace(tr, lora_name=tr.model, lora_path=tr.model)
        yield tr


def trace_ledger(spec: DiagnoseSpec) -> LedgerTotals:
    """The miss ledger of ``spec``'s trace on one instance of ``spec``'s cache (tokens per
    class over counted requests; ``hit`` equals the diagnosis's cached tokens: the same exact
    sequential model).

    Raises:
        SourceUnavailable, UsageError, ParseError, SimulationError: as ``replay sim``.
    """
    return trace_ledger_groups(spec)[0]


def trace_ledger_groups(spec: DiagnoseSpec) -> tuple[LedgerTotals, PolicyLedger]:
    """:func:`trace_ledger` and the same ledger per (model, instance, day, scope), as
    ``diagnose --ingest`` stores it (router :data:`~prefixscope.replay.ledger_store.SINGLE`,
    one instance ``i0``). One replay.

    Raises:
        as :func:`trace_ledger`.
    """
    run = replay_fleet(_requests(spec), spec.sim_config(), instances=1)
    pol = policy_ledger(SINGLE, 1, run)
    return run.result.ledger, pol


def ledger_doc(led: LedgerTotals, top_breaker: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``ledger`` object of ``diagnose --json`` (docs/diagnose.md#json): ``prompt_tokens``,
    ``cached_tokens``, ``missed_tokens``, ``classes`` (tokens per ledger class, summing to
    ``prompt_tokens``), ``shares`` (each class over the prompt tokens, fractions),
    ``largest_loss`` (the loss class with the most tokens, None when nothing missed) and
    ``top_breaker`` (rank, kind and lost tokens of the rank-1 breaker, inside
    ``prompt_change``; None without breakers)."""
    classes = {c: getattr(led, c) for c in CLASSES}
    losses = {c: v for c, v in classes.items() if c != "hit" and v > 0}
    return {
        "prompt_tokens": led.prompt_tokens, "cached_tokens": led.hit,
        "missed_tokens": led.missed, "classes": classes,
        "shares": {c: (v / led.prompt_tokens if led.prompt_tokens else None)
                   for c, v in classes.items()},
        "largest_loss": max(losses, key=losses.__getitem__) if losses else None,
        "top_breaker": None if top_breaker is None else {
            k: top_breaker.get(k) for k in ("rank", "kind", "lost_tokens", "suggestion")},
    }


def waterfall_lines(doc: dict[str, Any], *, where: str | None = None) -> list[str]:
    """The ledger ``doc`` (:func:`ledger_doc`) as text: prompt tokens, one ``-`` line per
    loss class (zero classes kept, so the reader sees what did not happen), ``=`` the tokens
    from cache; ``where`` names the top breaker's place (shown under prompt change)."""
    p = doc["prompt_tokens"]

    def pct(v: int) -> str:
        return f"{100 * v / p:5.1f}%" if p else "    —"

    width = max(len(f"{p:,}"), 1)
    out = ["where the prompt tokens went (miss ledger, exact replay, one instance):",
           f"  {'prompt tokens':<20} {p:>{width},} {pct(p)}"]
    for cls, name, what in STEPS:
        v = doc["classes"][cls]
        out.append(f"  - {name:<18} {v:>{width},} {pct(v)}  {what}")
        tb = doc.get("top_breaker")
        if cls == "prompt_change" and tb is not None and v > 0:
            at = f" ({where})" if where else ""
            out.append(f"      top breaker #{tb['rank']}: {tb['kind']}{at}, "
                       f"{tb['lost_tokens']:,} tokens lost if it matched (counterfactual replay)")
    h = doc["cached_tokens"]
    out.append(f"  = {'from cache':<18} {h:>{width},} {pct(h)}")
    return out
