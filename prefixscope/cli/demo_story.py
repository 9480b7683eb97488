"""The demo's story: a week of production traffic with a day-5 regression, and its fix.

Called by :func:`prefixscope.cli.demo.build_demo`. Everything goes through the normal ingest
path (``docs/architecture.md``):

1. :func:`prefixscope.replay.production_week.build_week` replays real conversations through the
   exact cache model and writes the week's usage logs, saved Prometheus ranges (every 15 s) and
   the release-day chat log;
2. the usage logs go through :func:`prefixscope.ingest.usage.ingest_usage_file`, the ranges
   through :func:`prefixscope.ingest.prometheus_api.ingest_query_range_file` (production
   traffic, ``run_id = ''``);
3. the release-day chat log of ``gpu-a1`` is replayed twice (:func:`run_story_replays`): as
   recorded and with the fix (``data/layouts/timestamp-at-end.yaml``), at the instance's cache
   size, and both runs are ingested (``prefixscope.ingest.runs``): the Replay page shows the fix;
4. :func:`diagnose_hook` runs ``prefixscope diagnose`` on that chat log when the command exists.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timezone
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prefixscope.core.paths import data_file
from prefixscope.replay.production_week import (INSTANCES, SCRAPE_EVERY_S, WeekResult, build_week,
                                                full_week_end)

FIX_LAYOUT = data_file("layouts", "timestamp-at-end.yaml")
DEMO_PRICES = data_file("demo-week", "prices.toml")
#: The instance whose release-day chat log is replayed and diagnosed.
STORY_INSTANCE = "gpu-a1"
RUN_AS_RECORDED = "demo-release-as-recorded"
RUN_FIXED = "demo-release-timestamp-at-end"


@dataclass
class StoryReport:
    """What :func:`build_story` did: one line per step and the week's files."""

    week: WeekResult
    lines: list[str] = field(default_factory=list)
    chat_log: Path | None = None


def build_story(db_path: str, work_dir: str | Path, *, end_unix_s: float | None = None,
                progress: Callable[[str], None] | None = None,
                started: Callable[[str], None] | None = None) -> StoryReport:
    """Make the week (files under ``work_dir/week``) and ingest it into ``db_path``.

    Args:
        db_path: a migrated DuckDB file (opened read-write here).
        work_dir: where the week's files are written.
        end_unix_s: the build's clock (default: now), Unix seconds: the week is the seven full
            UTC days before that day (it ends at the last UTC midnight,
            :func:`~prefixscope.replay.production_week.full_week_end`), so its figures do not
            depend on the hour of the build.
        progress: called with each line of :attr:`StoryReport.lines` as it is done.
        started: called with a line as each step starts (what, and how much).

    Raises:
        PrefixscopeError subclasses from the replay and the ingest.
    """
    from prefixscope.ingest.prices import load_prices
    from prefixscope.ingest.prometheus_api import ingest_query_range_file
    from prefixscope.ingest.usage import ingest_usage_file
    from prefixscope.store import db as store_db

    def start(line: str) -> None:
        if started is not None:
            started(line)

    def done(line: str) -> None:
        report.lines.append(line)
        if progress is not None:
            progress(line)

    t0 = time.monotonic()
    end = full_week_end(time.time() if end_unix_s is None else float(end_unix_s))
    start(f"building the week: {len(INSTANCES)} instances x 7 days, replaying real "
          "conversations through the cache model")
    week = build_week(Path(work_dir) / "week", end_unix_s=end,
                      progress=lambda iw: start(
                          f"built {iw.spec.name} ({iw.spec.model}): {iw.requests:,} requests"))
    report = StoryReport(week)
    built = time.monotonic() - t0
    with store_db.writer(db_path) as con:
        load_prices(con, DEMO_PRICES)
        for iw in week.instances:
            start(f"ingesting {iw.spec.name}: {iw.requests:,} requests and its counters "
                  f"every {SCRAPE_EVERY_S:g} s")
            u = ingest_usage_file(con, str(iw.usage_path), workers=0)
            m = ingest_query_range_file(con, str(iw.prometheus_path), label_key=None)
            rate = iw.cached_tokens / iw.prompt_tokens if iw.prompt_tokens else 0.0
            done(f"{iw.spec.name} ({iw.spec.model}): {u.rows_added:,} requests, "
                 f"{m.rows_added:,} metric samples, {rate:.1%} of prompt tokens from cache")
            if iw.spec.name == STORY_INSTANCE:
                report.chat_log = iw.chat_log
    released = ", ".join(
        f"{datetime.fromtimestamp(iw.release_unix_s, tz=timezone.utc):%H:%M} UTC on {iw.spec.name}"
        for iw in week.instances if iw.release_unix_s is not None)
    done(f"the week is in the database (day 5, {week.release_day}: the release adds a "
         f"timestamp to coder-7b's system prompt at {released}): built in {built:.0f} s, "
         f"ingested in {time.monotonic() - t0 - built:.0f} s")
    return report


def run_story_replays(db_path: str, out_dir: str | Path, chat_log: Path,
                      release_unix_s: float) -> str:
    """Replay the release-day chat log as recorded and with the fix; ingest both runs.

    Both runs use ``gpu-a1``'s cache (block size 16, its ``num_gpu_blocks``) and start at the
    release time, so they sit on the time axis where the regression began.

    Returns:
        A one-line summary for the demo report.
    """
    from prefixscope.ingest.runs import ingest_run_dir
    from prefixscope.replay.runner import SimRunSpec, run_sim
    from prefixscope.store import db as store_db

    spec_a1 = next(s for s in INSTANCES if s.name == STORY_INSTANCE)
    out = Path(out_dir)
    done = []
    for run_id, layout, label in (
            (RUN_AS_RECORDED, None, "release day on gpu-a1, as recorded (timestamp on top)"),
            (RUN_FIXED, str(FIX_LAYOUT), "release day on gpu-a1, fix: timestamp at the end")):
        spec = SimRunSpec(trace=str(chat_log), format="chat", block_size=spec_a1.block_size,
                          capacity_blocks=spec_a1.num_gpu_blocks, algo="fast",
                          layout_path=layout, label=label, model=spec_a1.model)
        done.append(run_sim(spec, out / run_id, run_id=run_id, t0_unix_s=release_unix_s))
    with store_db.writer(db_path) as con:
        for res in done:
            ingest_run_dir(con, res.out_dir)
    return ", ".join(f"{r.label}: {r.summary.hit_rate:.1%}" for r in done)


def diagnose_available() -> bool:
    """True when this prefixscope has a ``diagnose`` command (issue 13)."""
    from prefixscope.cli.root import app

    names = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    names |= {g.name for g in app.registered_groups}
    return "diagnose" in names


def diagnose_hook(db_path: str, chat_log: Path, out_dir: Path | None = None) -> str | None:
    """Run ``prefixscope diagnose CHAT_LOG --ingest`` on the release-day chat log when the
    command exists (else None), at ``gpu-a1``'s cache (block size 16, its ``num_gpu_blocks``,
    fast keys), so the Breakers page and the daily report's hint name what broke the prefix
    (the ``Current time`` line on top of the system prompt).

    Returns:
        The line naming the top breaker (``#1 level 1 timestamp message 0 (system), line 1:
        ...``) for the demo report; a failure is reported, never raised (the rest of the demo
        stands).
    """
    if not diagnose_available():
        return None
    spec = next(s for s in INSTANCES if s.name == STORY_INSTANCE)
    args = ["diagnose", str(chat_log), "--format", "chat", "--block-size", str(spec.block_size),
            "--capacity-blocks", str(spec.num_gpu_blocks), "--algo", "fast",
            "--model", spec.model, "--ingest", "--db", db_path, "--no-text"]
    if out_dir is not None:
        args += ["--out", str(out_dir)]
    proc = subprocess.run([sys.executable, "-c", "from prefixscope.cli.root import main; main()",
                           *args], capture_output=True, text=True, timeout=600)
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    if proc.returncode != 0:
        return f"failed (exit {proc.returncode}): {lines[-1] if lines else ''}"
    top = next((ln.strip() for ln in lines if ln.strip().startswith("#1 ")), None)
    return " ".join(top.split()) if top else (lines[0] if lines else "")
