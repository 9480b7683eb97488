"""Miss ledger: where a replayed run's prompt tokens went, as a waterfall from prompt tokens to
tokens from cache, per model, instance and day, routing policies side by side, with the top
fixes and their verified gains.

Reads ``prefixscope.store.queries.ledger`` (``ledger_runs``, ``ledger_totals``): the totals
``prefixscope replay fleet TRACE --ingest`` and ``prefixscope diagnose TRACE --ingest`` store
(counts only), and ``prefixscope.store.queries.breakers`` for the same run's breakers. Every
class and its formula: docs/metrics.md "Miss ledger". Text from the data (run labels, routers,
models) reaches the page only through tables, select boxes and figures, never Markdown.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from prefixscope.core.formatting import breaker_position, fmt_int, fmt_pct, fmt_time
from prefixscope.dashboard import data, figures, filters
from prefixscope.dashboard.downloads import show_table

EMPTY = ("No miss ledger stored. Run `prefixscope replay fleet TRACE --ingest` (for example "
         "`prefixscope replay fleet data/captures/aider/chat-requests.jsonl --instances 3 "
         "--router round-robin,longest-prefix --ingest`) or `prefixscope diagnose TRACE "
         "--ingest`: each replays the trace and stores where every prompt token went.")
ALL = "All"
#: Ledger classes as the table names them: (column, name, what it means).
CLASS_ROWS = (
    ("hit_tokens", "hit", "served from the instance's cache"),
    ("granularity_tokens", "engine granularity",
     "partial last block and last token: always computed"),
    ("routing_tokens", "routing", "resident on another instance when the request arrived"),
    ("capacity_tokens", "capacity", "cached before, evicted"),
    ("isolation_tokens", "isolation", "same prefix under another salt or adapter: by design"),
    ("prompt_change_tokens", "prompt change", "seen before, but the prompt diverged earlier"),
    ("cold_tokens", "cold", "never seen before anywhere in the fleet"),
)
NO_FIX = ("No verified fix stored for this run. `prefixscope diagnose TRACE --ingest` ranks the "
          "prompt's breakers with the gain of each fix measured by replay; `prefixscope replay "
          "fleet TRACE --router round-robin,longest-prefix --ingest` measures what a "
          "prefix-aware router recovers.")


def class_table(totals: pd.DataFrame) -> pd.DataFrame:
    """The classes as rows, one column pair per policy (tokens and share of the prompt
    tokens, then a row with the share of missed tokens of each loss): ``totals`` is
    ``ledger_totals(..., by=("router",))``."""
    rows = []
    for col, name, what in CLASS_ROWS:
        row = {"Class": name, "Meaning": what}
        for _, t in totals.iterrows():
            p, missed = int(t["prompt_tokens"]), int(t["prompt_tokens"] - t["hit_tokens"])
            v = int(t[col])
            row[f"Tokens · {t['router']}"] = fmt_int(v)
            row[f"Of prompt · {t['router']}"] = fmt_pct(v / p if p else None)
            row[f"Of missed · {t['router']}"] = ("" if col == "hit_tokens"
                                               else fmt_pct(v / missed if missed else None))
        rows.append(row)
    return pd.DataFrame(rows)


def largest_loss(t: pd.Series) -> tuple[str, float | None]:
    """The loss class with the most tokens of one totals row and its share of the missed
    tokens (fraction; None when nothing missed). Ties go to the earlier class (test order)."""
    missed = int(t["prompt_tokens"] - t["hit_tokens"])
    col, name, _ = max(CLASS_ROWS[1:], key=lambda c: int(t[c[0]]))
    return name, (int(t[col]) / missed if missed else None)


def fixes_table(totals: pd.DataFrame, diag: pd.Series | None,
                breakers: pd.DataFrame) -> pd.DataFrame:
    """The top fixes of a run with their verified gains, most recovered tokens first (at most
    five): each other routing policy that serves more tokens than the first one (the run's
    replays of that policy), and each stored breaker whose fix was measured by replay
    (``what_if_*`` of ``breakers_of``). Columns: Fix, Class, Tokens recovered, Hit rate after,
    Verified by."""
    out = []
    if len(totals) > 1:
        base = totals.iloc[0]
        for _, t in totals.iloc[1:].iterrows():
            gain = int(t["hit_tokens"] - base["hit_tokens"])
            if gain > 0 and t["prompt_tokens"]:
                out.append({"Fix": f"route by {t['router']} instead of {base['router']}",
                            "Class": "routing", "Tokens recovered": gain,
                            "Hit rate after": t["hit_tokens"] / t["prompt_tokens"],
                            "Verified by": "fleet replay of the same trace"})
    if diag is not None and not breakers.empty:
        cached = int(diag["cached_tokens"])
        for _, b in breakers.iterrows():
            if pd.isna(b.get("what_if_cached_tokens")):
                continue
            gain = int(b["what_if_cached_tokens"]) - cached
            if gain <= 0:
                continue
            fix = b["transform_types"] if b["fixable"] and isinstance(
                b["transform_types"], str) else "not by layout"
            out.append({"Fix": f"#{int(b['rank'])} {str(b['kind']).replace('_', ' ')} at "
                               f"{breaker_position(b)}: {fix}",
                        "Class": "prompt change", "Tokens recovered": gain,
                        "Hit rate after": b["what_if_hit_rate"],
                        "Verified by": "diagnose: counterfactual replay"})
    df = pd.DataFrame(out, columns=["Fix", "Class", "Tokens recovered", "Hit rate after",
                                    "Verified by"])
    df = df.sort_values("Tokens recovered", ascending=False, kind="stable").head(5)
    return df.assign(**{"Tokens recovered": df["Tokens recovered"].map(fmt_int),
                        "Hit rate after": df["Hit rate after"].map(fmt_pct)})


def _pick(label: str, options: list, key: str):
    """A select box with ``All`` first; returns None for All."""
    choice = st.selectbox(label, [ALL, *options], key=key,
                          format_func=lambda v: "(none)" if v == "" else str(v))
    return None if choice == ALL else choice


db = data.db_path()
st.title("Miss ledger")
st.caption("Every prompt token of a replayed run in exactly one class: from cache, engine "
           "granularity, routing, capacity, isolation, prompt change or cold "
           "(docs/metrics.md \"Miss ledger\"). Routing policies of one run side by side; "
           "stored by `prefixscope replay fleet TRACE --ingest` and `prefixscope diagnose "
           "TRACE --ingest`, counts only.")
f = filters.current()

with data.guard(db):
    runs = data.query(db, "ledger", "ledger_runs", run_ids=f.replay_run_ids(), models=f.models)
    if runs.empty:
        st.info(EMPTY, icon=":material/info:")
        st.stop()
    labels = {}
    for _, r in runs.iterrows():
        name = r["label"] if isinstance(r["label"], str) and r["label"] else r["run_id"]
        labels[r["run_id"]] = f"{name} · {r['routers']} · {fmt_time(r['created_unix_s'])}"
    run = st.selectbox("Run", list(labels), format_func=lambda k: labels[k], key="ledger_run")
    by_group = {g: data.query(db, "ledger", "ledger_totals", run_ids=(run,), models=f.models,
                              instances=f.instances, by=(g,))
                for g in ("model", "instance", "day")}
    c1, c2, c3 = st.columns(3)
    with c1:
        model = _pick("Model", [str(m) for m in by_group["model"]["model"]], "ledger_model")
    with c2:
        inst = _pick("Instance", [str(i) for i in by_group["instance"]["instance"]],
                     "ledger_instance")
    with c3:
        day = _pick("Trace day", [int(d) for d in by_group["day"]["day"]], "ledger_day")
    models = (model,) if model is not None else f.models
    instances = (inst,) if inst is not None else f.instances
    days = (day,) if day is not None else None
    totals = data.query(db, "ledger", "ledger_totals", run_ids=(run,), models=models,
                        instances=instances, days=days, by=("router",))
    if totals.empty or int(totals["prompt_tokens"].sum()) == 0:
        st.info("No ledger rows for this selection: choose All in the boxes above or widen "
                "the sidebar's models and instances.", icon=":material/info:")
        st.stop()
    where = " · ".join(f"{k} {v}" for k, v in (("model", model), ("instance", inst),
                                                ("trace day", day)) if v is not None)
    st.plotly_chart(figures.ledger_waterfall_figure(
        totals, title="Where the prompt tokens went" + (f" ({where})" if where else "")),
        key="ledger_waterfall")
    show_table("ledger-classes", class_table(totals), key="ledger_classes",
               caption="Tokens per class for each routing policy of the run; of missed: the "
                       "class over the prompt tokens not served from cache.")
    summary = pd.DataFrame([{
        "Router": t["router"], "Requests": fmt_int(t["requests"]),
        "Prompt tokens": fmt_int(t["prompt_tokens"]), "From cache": fmt_int(t["hit_tokens"]),
        "Hit rate": fmt_pct(t["hit_tokens"] / t["prompt_tokens"] if t["prompt_tokens"] else None),
        "Largest loss": largest_loss(t)[0],
        "Of missed": fmt_pct(largest_loss(t)[1]),
    } for _, t in totals.iterrows()])
    show_table("ledger-policies", summary, key="ledger_policies")
    per_inst = data.query(db, "ledger", "ledger_totals", run_ids=(run,), models=models,
                          instances=instances, days=days, by=("router", "instance"))
    show_table("ledger-instances", pd.DataFrame([{
        "Router": t["router"], "Instance": t["instance"], "Requests": fmt_int(t["requests"]),
        "Prompt tokens": fmt_int(t["prompt_tokens"]),
        "Hit rate": fmt_pct(t["hit_tokens"] / t["prompt_tokens"] if t["prompt_tokens"] else None),
        "Routing": fmt_int(t["routing_tokens"]), "Capacity": fmt_int(t["capacity_tokens"]),
        "Prompt change": fmt_int(t["prompt_change_tokens"]), "Cold": fmt_int(t["cold_tokens"]),
    } for _, t in per_inst.iterrows()]), key="ledger_instances",
        caption="Per instance: its requests, hit rate and the tokens each loss class cost it.")
    st.subheader("Top fixes, verified by replay")
    diags = data.query(db, "breakers", "diagnoses", run_ids=(run,))
    diag = None if diags.empty else diags.iloc[0]
    brk = (data.query(db, "breakers", "breakers_of", diagnosis_id=diag["diagnosis_id"])
           if diag is not None else pd.DataFrame())
    fixes = fixes_table(totals, diag, brk)
    show_table("ledger-fixes", fixes, key="ledger_fixes", empty=NO_FIX,
               caption="Tokens recovered: cached tokens the whole run gains with that fix, "
                       "measured by replaying the trace with it (a routing policy: the fleet "
                       "replay under that policy; a breaker: diagnose's counterfactual replay "
                       "over every model and instance of the run).")
