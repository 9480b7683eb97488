"""Queries of the daily report and alert email (``alerts/``): scrape activity for the STALE
check, and the ``alert_sends`` log (claim, finish, list).

Hit rates, request figures and savings come from ``prefixscope.store.queries.metrics`` (H1),
``prefixscope.store.queries.requests`` and ``prefixscope.store.queries.savings`` (H2); only what those modules do not
answer lives here. Formulas: ``docs/alerts.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pandas as pd

from prefixscope.store.queries import archive

#: Statuses of a row of ``alert_sends``.
SEND_SENDING = "sending"
SEND_SENT = "sent"
SEND_FAILED = "failed"


def scrape_activity(con: duckdb.DuckDBPyConnection, *, start_s: float, end_s: float,
                    models: Sequence[str] | None = None) -> pd.DataFrame:
    """When each metrics source (instance, model) was scraped in ``[start_s, end_s)``.

    A scrape time is a distinct ``metric_samples.ts_unix_s`` of the instance with a non-NULL
    ``model`` label; the 0 placed at a counter's ``_created`` time (``created_zero``) is not a
    scrape and is left out, and so are replay runs' samples (``run_id`` not ``''``).

    Args:
        start_s, end_s: Unix seconds, the half-open range looked at.
        models: only these model names (None = all).

    Returns:
        One row per (instance, model), ordered by instance, model: ``instance, model,
        scrapes`` (distinct scrape times), ``first_ts_unix_s``, ``last_ts_unix_s``,
        ``median_gap_s`` (median seconds between consecutive scrapes; NULL with fewer than 2).
    """
    model_filter = ""
    params: list[object] = [start_s, end_s]
    if models is not None:
        if not models:
            model_filter = " AND FALSE"
        else:
            model_filter = f" AND model IN ({', '.join('?' for _ in models)})"
            params.extend(models)
    return con.execute(
        f"""
        WITH scrapes AS (
            SELECT DISTINCT instance, model, ts_unix_s
            FROM {archive.relation(con, "metric_samples", start_s, end_s)}
            WHERE ts_unix_s >= ? AND ts_unix_s < ? AND model IS NOT NULL
              AND NOT created_zero AND run_id = ''{model_filter}
        ), gaps AS (
            SELECT instance, model, ts_unix_s,
                   ts_unix_s - lag(ts_unix_s) OVER (
                       PARTITION BY instance, model ORDER BY ts_unix_s) AS gap_s
            FROM scrapes
        )
        SELECT instance, model,
               count(*)::BIGINT AS scrapes,
               min(ts_unix_s) AS first_ts_unix_s,
               max(ts_unix_s) AS last_ts_unix_s,
               median(gap_s)::DOUBLE AS median_gap_s
        FROM gaps
        GROUP BY instance, model
        ORDER BY instance, model
        """, params).df()


def active_send_recipients(con: duckdb.DuckDBPyConnection, *, day: str, tz: str,
                           now_unix_s: float, claim_timeout_s: float) -> set[str]:
    """Recipient sets (the ``recipients`` column) that must not be mailed again for ``day``.

    A set counts when one of its rows for (``day``, ``tz``) is ``sent``, or is ``sending`` and
    was claimed less than ``claim_timeout_s`` seconds before ``now_unix_s`` (another process is
    delivering it right now). A ``failed`` row, or a ``sending`` row older than the timeout (its
    process died), does not count: the next run tries again.
    """
    rows = con.execute(
        "SELECT DISTINCT recipients FROM alert_sends WHERE day = ? AND tz = ? AND "
        "(status = ? OR (status = ? AND created_unix_s > ?))",
        [day, tz, SEND_SENT, SEND_SENDING, now_unix_s - claim_timeout_s]).fetchall()
    return {r[0] for r in rows}


def open_claims(con: duckdb.DuckDBPyConnection, *, day: str, tz: str) -> pd.DataFrame:
    """The ``sending`` rows of (``day``, ``tz``): claims not (yet) closed.

    Returns:
        Columns ``send_id, recipients, claimed_by`` (``host:pid``, NULL for rows written
        before migration 40), ``attempts``, ``created_unix_s``; oldest first.
    """
    return con.execute(
        "SELECT send_id, recipients, claimed_by, attempts, created_unix_s FROM alert_sends "
        "WHERE day = ? AND tz = ? AND status = ? ORDER BY created_unix_s",
        [day, tz, SEND_SENDING]).df()


def last_sent(con: duckdb.DuckDBPyConnection, *, day: str, tz: str,
              recipients: str) -> float | None:
    """When the newest ``sent`` row of (day, tz, recipients) was sent (Unix s), or None."""
    row = con.execute(
        "SELECT max(coalesce(finished_unix_s, created_unix_s)) FROM alert_sends WHERE day = ? "
        "AND tz = ? AND recipients = ? AND status = ?", [day, tz, recipients, SEND_SENT]).fetchone()
    return None if row[0] is None else float(row[0])


def claim_send(con: duckdb.DuckDBPyConnection, *, send_id: str, day: str, tz: str,
               recipients: str, subject: str, report_status: str, message_id: str,
               resend: bool, smtp_host: str, lines_json: str, now_unix_s: float,
               claim_timeout_s: float, claimed_by: str | None = None) -> bool:
    """Record the intent to send one email, unless it is already sent or being sent.

    Runs its own transaction (the caller holds a writer connection and no open transaction).
    Without ``resend``, a set found by :func:`active_send_recipients` is not claimed; with
    ``resend`` only a fresh ``sending`` claim of another process blocks it.

    Returns:
        True when a ``sending`` row was inserted (the caller then sends and calls
        :func:`finish_send`), False when the email must not be sent.
    """
    con.execute("BEGIN TRANSACTION")
    try:
        if resend:
            busy = con.execute(
                "SELECT count(*) FROM alert_sends WHERE day = ? AND tz = ? AND recipients = ? "
                "AND status = ? AND created_unix_s > ?",
                [day, tz, recipients, SEND_SENDING, now_unix_s - claim_timeout_s]).fetchone()[0]
        else:
            busy = int(recipients in active_send_recipients(
                con, day=day, tz=tz, now_unix_s=now_unix_s, claim_timeout_s=claim_timeout_s))
        if busy:
            con.execute("ROLLBACK")
            return False
        con.execute(
            "INSERT INTO alert_sends (send_id, day, tz, recipients, subject, report_status, "
            "status, message_id, attempts, error, resend, smtp_host, lines_json, created_unix_s, "
            "finished_unix_s, claimed_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, NULL, ?, ?, ?, ?, "
            "NULL, ?)",
            [send_id, day, tz, recipients, subject, report_status, SEND_SENDING, message_id,
             resend, smtp_host, lines_json, now_unix_s, claimed_by])
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return True


def finish_send(con: duckdb.DuckDBPyConnection, *, send_id: str, status: str, attempts: int,
                error: str | None, now_unix_s: float) -> None:
    """Close a claimed send as ``sent`` or ``failed`` with the number of SMTP attempts made and
    the last error (None when sent)."""
    assert status in (SEND_SENT, SEND_FAILED), status
    con.execute(
        "UPDATE alert_sends SET status = ?, attempts = ?, error = ?, finished_unix_s = ? "
        "WHERE send_id = ?", [status, attempts, error, now_unix_s, send_id])


def alert_sends(con: duckdb.DuckDBPyConnection, *, day: str | None = None,
                limit: int = 500) -> pd.DataFrame:
    """The sends log, newest first (what the Alerts dashboard page shows).

    Args:
        day: only this report day (``YYYY-MM-DD``); None = all days.
        limit: at most this many rows.

    Returns:
        Columns ``created_unix_s, finished_unix_s, day, tz, report_status, status, recipients,
        subject, message_id, attempts, error, resend, smtp_host, send_id, lines_json``.
    """
    where = "" if day is None else "WHERE day = ?"
    params: list[object] = [] if day is None else [day]
    return con.execute(
        f"SELECT created_unix_s, finished_unix_s, day, tz, report_status, status, recipients, "
        f"subject, message_id, attempts, error, resend, smtp_host, send_id, lines_json "
        f"FROM alert_sends {where} ORDER BY created_unix_s DESC, send_id LIMIT ?",
        params + [limit]).df()


def miss_causes(con: duckdb.DuckDBPyConnection, *, start_s: float | None,
                end_s: float | None, models: Sequence[str] | None = None,
                run_ids: Sequence[str] | None = ("",)):
    """What the gateway decision log says of each model's misses in ``[start_s, end_s)``.

    Reads ``gateway_decisions`` LEFT JOIN ``requests`` (archive included) as the Scopes and
    Rejections pages do (``prefixscope.store.scope_sql.ROWS_SQL``: a request's time is its
    usage row's, else its decision's; refused requests, a decision with an error and no usage
    row, are left out).

    Args:
        start_s, end_s: Unix seconds, half open (None = unbounded).
        models: only these models (None = all).
        run_ids: runs read (default production traffic, ``''``; None = every run).

    Returns:
        ``{(model, scope): MissCauses}`` and ``{(model, None): MissCauses}`` (the model over
        its scopes) of :class:`prefixscope.core.report.MissCauses`; models without decisions
        in the range are absent.
    """
    from prefixscope.core.report import MissCauses
    from prefixscope.store import scope_sql
    from prefixscope.store.queries.scopes import PAIR_SKEW_S

    lo = None if start_s is None else float(start_s) - PAIR_SKEW_S
    hi = None if end_s is None else float(end_s) + PAIR_SKEW_S
    d = archive.relation(con, "gateway_decisions", lo, hi)
    r = archive.relation(con, "requests", lo, hi)
    rows_sql = scope_sql.ROWS_SQL.format(source=f"{d} d LEFT JOIN {r} r ON {scope_sql.ON_KEY}")
    where, params = ["refused IS NULL", "model IS NOT NULL"], []
    if start_s is not None:
        where.append("ts_unix_s >= ?")
        params.append(float(start_s))
    if end_s is not None:
        where.append("ts_unix_s < ?")
        params.append(float(end_s))
    if models is not None:
        where.append("list_contains(?::VARCHAR[], model)")
        params.append(list(models))
    if run_ids is not None:
        where.append("list_contains(?::VARCHAR[], run_id)")
        params.append(list(run_ids))
    rows = con.execute(f"""
        SELECT model, scope, decision, first_mismatch, bypass IS TRUE AS bypass, count(*) AS n
        FROM ({rows_sql}) j
        WHERE ts_unix_s IS NOT NULL AND {' AND '.join(where)}
          AND (decision IN ('miss', 'reject')
               OR (decision = 'accept' AND salt_applied IS NOT TRUE))
        GROUP BY ALL""", params).fetchall()
    ordinary: dict[tuple, int] = {}
    unserved: dict[tuple, int] = {}
    bypassed: dict[tuple, int] = {}
    rejects: dict[tuple, dict[str, int]] = {}
    for model, scope, decision, first, bypass, n in rows:
        for key in ((model, scope), (model, None)):
            if decision == "miss":
                ordinary[key] = ordinary.get(key, 0) + int(n)
            elif decision == "accept":
                into = bypassed if bypass else unserved
                into[key] = into.get(key, 0) + int(n)
            else:
                by = rejects.setdefault(key, {})
                by[str(first)] = by.get(str(first), 0) + int(n)
    keys = set(ordinary) | set(unserved) | set(bypassed) | set(rejects)
    return {k: MissCauses(ordinary.get(k, 0),
                          tuple(sorted(rejects.get(k, {}).items(), key=lambda kv: (-kv[1], kv[0]))),
                          unserved.get(k, 0), bypassed.get(k, 0)) for k in keys}


def alert_hints(con: duckdb.DuckDBPyConnection, *, start_s: float | None, end_s: float | None,
                models: Sequence[str] | None = None, run_ids: Sequence[str] | None = ("",)):
    """The :class:`prefixscope.core.report.AlertHints` of a range: each model's newest stored
    diagnosis (``breakers.top_breaker_by_model``), the largest loss class of its newest stored
    miss ledger (``ledger.largest_loss_by_model``) and :func:`miss_causes`. The one source of
    the words after ``ALERT:`` for ``prefixscope report``, the daily report and its email,
    the Alerts page and Overview's "Why" (rule: :func:`prefixscope.core.report.alert_hint`)."""
    from prefixscope.core.report import AlertHints
    from prefixscope.store.queries.breakers import top_breaker_by_model
    from prefixscope.store.queries.ledger import largest_loss_by_model

    picked = None if models is None else sorted(models)
    return AlertHints(top_breakers=top_breaker_by_model(con, picked),
                      causes=miss_causes(con, start_s=start_s, end_s=end_s, models=models,
                                         run_ids=run_ids),
                      largest_losses=largest_loss_by_model(con, picked))
