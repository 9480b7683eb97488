"""``prefixscope archive``: move old raw rows to Parquet, then apply the retention of rollups
(``docs/retention.md``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from prefixscope.cli.common import DB_DEFAULT, DbOption, JsonOption, count_noun, out, print_json
from prefixscope.core.config import load_settings
from prefixscope.core.errors import SourceUnavailable, UsageError
from prefixscope.core.times import format_time, parse_time

BeforeOption = Annotated[str | None, typer.Option(
    "--before", help="Archive whole UTC days before this time (ISO date, Unix s, -30d; "
                     "default: now - [retention] raw_days, decisions now - decision_days).")]
ToOption = Annotated[str | None, typer.Option(
    "--to", help="Archive folder or s3://bucket/prefix (default: [retention] archive).")]
DryRunOption = Annotated[bool, typer.Option(
    "--dry-run", help="Print the days and rows that would be archived; write nothing.")]
NewRootOption = Annotated[bool, typer.Option(
    "--new-root", help="Archive to a root other than the one this database already archived "
                       "to (the days archived before stay where they are and are still read).")]


def archive_cmd(db: DbOption = DB_DEFAULT, to: ToOption = None, before: BeforeOption = None,
                dry_run: DryRunOption = False, new_root: NewRootOption = False,
                as_json: JsonOption = False) -> None:
    """Archive production requests, metric samples and gateway decisions of whole UTC days
    older than the retention as Parquet partitioned by day and model, delete them from the database once
    read back, and delete rollup rows older than [retention] rollup_days. Safe to re-run
    (also after a crash): a day is never written twice nor deleted unarchived.

    Example: prefixscope archive --to archive/ --before 2026-10-01 --dry-run
    """
    from prefixscope.store import db as store_db
    from prefixscope.store.queries import archive as arc

    settings = load_settings()
    ret = settings.retention
    now = time.time()
    cutoffs: dict[str, float] = {}  # tables whose default cutoff is not raw_days
    if before is not None:
        before_s = parse_time(before, now_unix_s=now)
        if before_s > now:
            raise UsageError(f"--before {before} is in the future ({format_time(before_s)}): "
                             "only rows older than now can be archived")
    else:
        before_s = now - ret.raw_days * arc.DAY_S
        cutoffs = {"gateway_decisions": now - (ret.decision_days or ret.raw_days) * arc.DAY_S}
    rollup_before_s = min(now - ret.rollup_days * arc.DAY_S, before_s)
    location = to or ret.archive
    if not location and not dry_run:
        raise UsageError("no archive location: set [retention] archive in prefixscope.toml or "
                         "pass --to PATH (raw rows are deleted only after they are archived)")
    if not Path(db).exists():
        raise SourceUnavailable(f"no database at {db}: nothing to archive")
    opts = arc.remote_options_from_env(
        s3_region=ret.s3_region, s3_endpoint=ret.s3_endpoint, s3_url_style=ret.s3_url_style,
        s3_use_ssl=ret.s3_use_ssl, extension_directory=ret.extension_directory,
        extension_repository=ret.extension_repository)
    cutoff = arc.day_floor(before_s)
    with store_db.writer(db, lock_timeout_s=settings.store.lock_timeout_s) as con:
        plan = arc.plan_days(con, cutoff, cutoffs)
        if location and not new_root:
            other = [r for r in arc.recorded_roots(con) if not arc.same_root(r, location)]
            if other:
                raise UsageError(
                    f"{db} is already archived to {other[0]}: archive to it again (--to "
                    f"{other[0]}) or pass --new-root to start a second root at {location} "
                    "(one root per database, docs/retention.md)")
        arc.check_files([f for t in arc.ARCHIVED for f in arc.archived_files(con, t)])
        root = location if dry_run else arc.prepare_target(location, opts, con)
    done: list[arc.ArchivedDay] = []
    dropped: dict[str, int] = {}
    if not dry_run:
        # one COPY, count check and DELETE per chunk of days (arc.CHUNK_ROWS rows) under the
        # write lock; between chunks the file is released when another process waits for it
        con = store_db.BatchConnection(db, lock_timeout_s=settings.store.lock_timeout_s)
        try:
            for table, lo, hi, _ in arc.plan_chunks(plan):
                if arc.is_remote(root):
                    arc.ensure_remote(con.connection(), root, opts)
                done += arc.archive_range(con.connection(), table, lo, hi, root)
                store_db.release_between_batches(con, only_if_waited=True)
            dropped = arc.drop_rollups(con.connection(), rollup_before_s)
        finally:
            con.close()
    days = plan if dry_run else done
    totals = {t: sum(d.rows for d in days if d.table == t) for t in arc.ARCHIVED}
    if as_json:
        print_json({"db": db, "archive": location, "dry_run": dry_run,
                    "before": format_time(cutoff), "rollups_before": format_time(
                        arc.day_floor(rollup_before_s)),
                    "days": [d.as_dict() for d in days], "rows": totals,
                    "rollup_rows_deleted": dropped})
        return
    verb = "would archive" if dry_run else "archived"
    where = location or "(no archive location yet)"
    out.print(f"{db}: {verb} {len({d.day for d in days})} day(s) before {format_time(cutoff)} "
              f"to {where}", markup=False, highlight=False)
    for table, n in totals.items():
        out.print(f"  {table:<16} {count_noun(n, 'row')}", markup=False, highlight=False)
    if dry_run and before is None and "raw_days" not in ret.model_fields_set:
        out.print(f"  (cutoff: [retention] raw_days default, {ret.raw_days} days)",
                  markup=False, highlight=False)
    if not location:
        out.print("note: a real run needs an archive location: set [retention] archive in "
                  "prefixscope.toml or pass --to PATH (raw rows are deleted only after they are "
                  "archived; docs/retention.md)", markup=False, highlight=False)
    if not dry_run:
        for table, n in dropped.items():
            out.print(f"  {table:<16} {count_noun(n, 'rollup row')} deleted (before "
                      f"{format_time(arc.day_floor(rollup_before_s))})", markup=False,
                      highlight=False)


def register(groups: dict[str, typer.Typer]) -> None:
    """Add ``archive``."""
    groups["app"].command("archive")(archive_cmd)
