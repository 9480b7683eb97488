"""Build the demo database from the bundled real data (``make demo`` / ``prefixscope demo``).

What goes in, all through the normal ingest path (nothing is written around it):

0. **The story** (``prefixscope.cli.demo_story``): a week of production traffic for two models
   on three instances, the seven full UTC days before the build's day, made by replaying real conversations through the exact cache
   model; on day 5 a release puts a timestamp on top of ``coder-7b``'s system prompt and its hit
   rate falls below 50%. The release-day chat log is replayed as recorded and with the fix, and
   ``prefixscope diagnose`` runs on it when that command exists. This is production traffic
   (``run_id = ''``): Overview, Requests, Savings and Alerts show it by default.
1. A second, labelled data source, run ``vllm-cpu-0.32`` (kind ``capture``): two real vLLM 0.32
   CPU servers' ``/metrics`` scrapes from ``data/vllm-cpu-0.32/``:
   instance ``vllm-cpu-bs32`` (one scrape after the 31-request probe) and instance
   ``vllm-cpu-kvevents`` (a scrape after its first probe run and one after a second run, a reset
   and 12 evicting requests). The files carry no scrape time; the times used are estimates
   placed inside the window the captures allow (see :data:`SCRAPE_TIMES`).
2. The probe's 31 usage objects (``probe_bs32.requests.jsonl``) for instance ``vllm-cpu-bs32``.
3. The decoded KV events of the kvevents server.
4. The price table ``data/prices.toml`` (shadow price for the self-hosted tiny model).
5. Replay runs (Mooncake conversation trace at two cache sizes, a prompt-layout A/B on real
   chat captures) and the multi-tenant scope demo, when those modules are present.
6. A fleet: the aider chats replayed on 3 replicas under round robin and the prefix-aware
   longest-prefix router, each policy's miss ledger stored (Miss ledger page).

The database is built in a temporary file and moved into place, so a running dashboard never
sees a half-built demo.
"""

from __future__ import annotations

import importlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prefixscope.core.errors import SourceUnavailable
from prefixscope.core.formatting import count_noun
from prefixscope.core.paths import data_dir
from prefixscope.store import db as store_db

DATA = data_dir()
CAPTURES = DATA / "vllm-cpu-0.32"

#: (file, instance, scrape time in Unix seconds). Estimates: the bs32 scrape followed the
#: probe (counters created at 1795960909.3; the probe's sample responses carry ``created``
#: 1795960925, and 31 requests took 25-140 ms each); the kvevents server's
#: first scrape followed its first probe and reset (reset at 1795961035.95, next KV event batch
#: at 1795961090.9); its second followed the last eviction batch (1795961152.5).
SCRAPE_TIMES: tuple[tuple[str, str, float], ...] = (
    ("metrics_bs32.txt", "vllm-cpu-bs32", 1795960930.0),
    ("metrics_kvevents.txt", "vllm-cpu-kvevents", 1795961040.0),
    ("metrics_kvevents_after_evict.txt", "vllm-cpu-kvevents", 1795961160.0),
)


@dataclass
class DemoReport:
    """What the demo build did: one line per step, and the final database path."""

    db_path: str
    steps: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _optional(module: str, attr: str) -> Callable | None:
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return None


#: The run id of the real vLLM CPU captures (a second data source, not production traffic).
CAPTURES_RUN_ID = "vllm-cpu-0.32"
CAPTURES_LABEL = "real vLLM 0.32 CPU captures (tiny model, 2026-11-29)"


def build_demo(db_path: str, *, work_dir: str | None = None, with_replay: bool = True,
               with_story: bool = True, end_unix_s: float | None = None,
               progress: Callable[[str], None] | None = None) -> DemoReport:
    """Build the demo database at ``db_path`` from the bundled data, replacing it atomically.

    The build goes to ``DB.building`` beside it (a stale one from an earlier run is removed
    first); when the build fails or is interrupted (Ctrl-C), ``DB.building`` and its ``.wal``
    are removed (the existing ``db_path`` is left as it was), and the error propagates.

    Args:
        db_path: destination DuckDB file (replaced when the build succeeds).
        work_dir: where replay outputs are written (default ``data/demo/`` beside the DB).
        with_replay: also run the replay and scope demos.
        with_story: also build the week of production traffic (about a minute).
        end_unix_s: the build's clock (default: now): the story's week is the seven full UTC
            days before that day.
        progress: called with one line as each step starts and ends (``[  12 s] building
            the week: ...``), so ``prefixscope demo`` is never silent while it builds; the
            finished steps' lines are also in the report.

    Returns:
        A :class:`DemoReport` listing each step with its row counts.

    Raises:
        SourceUnavailable: the bundled data is missing (not a full clone).
    """
    tmp = building_path(db_path)
    try:
        return _build_demo(db_path, work_dir=work_dir, with_replay=with_replay,
                           with_story=with_story, end_unix_s=end_unix_s, progress=progress)
    except BaseException:
        for p in (tmp, Path(str(tmp) + ".wal")):
            p.unlink(missing_ok=True)
        raise


def building_path(db_path: str) -> Path:
    """Where :func:`build_demo` builds the database before it replaces ``db_path``:
    ``DB.building`` beside it."""
    dest = Path(db_path)
    return dest.with_name(dest.name + ".building")


def _build_demo(db_path: str, *, work_dir: str | None, with_replay: bool, with_story: bool,
                end_unix_s: float | None, progress: Callable[[str], None] | None) -> DemoReport:
    """:func:`build_demo` without the clean-up of a failed build."""
    t0 = time.monotonic()
    if not CAPTURES.is_dir():
        raise SourceUnavailable(f"bundled captures missing at {CAPTURES}: is this a full clone?")
    dest = Path(db_path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = building_path(db_path)
    for p in (tmp, Path(str(tmp) + ".wal")):
        if p.exists():
            p.unlink()
    work = Path(work_dir) if work_dir else dest.parent / "demo"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    report = DemoReport(db_path=str(dest))

    def say(line: str) -> None:
        if progress is not None:
            progress(f"[{time.monotonic() - t0:5.0f} s] {line}")

    def done(line: str) -> None:
        report.steps.append(line)
        say(line)

    say("real vLLM CPU captures, prices and KV events (data/vllm-cpu-0.32/)")

    from prefixscope.ingest.exposition import ingest_exposition
    from prefixscope.ingest.prices import load_prices
    from prefixscope.ingest.runs import save_run
    from prefixscope.ingest.usage import ingest_usage_file

    with store_db.writer(tmp) as con:
        n = load_prices(con, DATA / "prices.toml")
        done(f"prices: {count_noun(n, 'model')} from data/prices.toml")
        for name, instance, at in SCRAPE_TIMES:
            # bundled vLLM captures carry only vLLM's own labels: no HMAC key is needed (or read)
            s = ingest_exposition(con, str(CAPTURES / name), instance=instance, at_unix_s=at,
                                  label_key=None, run_id=CAPTURES_RUN_ID)
            done(f"capture {name} as {instance}: {s.rows_added} samples")
        s = ingest_usage_file(con, str(CAPTURES / "probe_bs32.requests.jsonl"),
                              instance="vllm-cpu-bs32", run_id=CAPTURES_RUN_ID)
        done(f"capture probe_bs32.requests.jsonl: {s.rows_added} requests")
        save_run(con, run_id=CAPTURES_RUN_ID, kind="capture", label=CAPTURES_LABEL,
                 created_unix_s=SCRAPE_TIMES[-1][2], params={"source": "data/vllm-cpu-0.32"},
                 source_id=None)
        ingest_kv = _optional("prefixscope.ingest.kv_events", "ingest_kv_events_file")
        if ingest_kv is not None:
            for name in ("kv_events.jsonl", "kv_events_evict.jsonl"):
                s = ingest_kv(con, str(CAPTURES / name), instance="vllm-cpu-kvevents")
                done(f"KV events {name}: {s.rows_added} events")
        store_db.checkpoint(con)  # the file alone holds every row before os.replace

    story = None
    if with_story:
        from prefixscope.cli.demo_story import build_story

        story = build_story(str(tmp), work, end_unix_s=end_unix_s,
                            progress=lambda line: done(f"production: {line}"),
                            started=lambda line: say(f"production: {line}"))

    if with_replay:
        for module, attr, label in (
            ("prefixscope.cli.demo_replay", "run_demo_replays", "replay runs"),
            ("prefixscope.cli.demo_scopes", "run_demo_scopes", "multi-tenant scope demo"),
        ):
            fn = _optional(module, attr)
            if fn is None:
                continue
            say(f"{label}: simulating and ingesting")
            result = fn(str(tmp), str(work / attr))
            done(f"{label}: {result}")
    if story is not None and story.chat_log is not None:
        from prefixscope.cli.demo_story import STORY_INSTANCE, diagnose_hook, run_story_replays

        release = next(i.release_unix_s for i in story.week.instances
                       if i.spec.name == STORY_INSTANCE)
        say(f"diagnose {story.chat_log.name}: finding what breaks the prefix")
        diag = diagnose_hook(str(tmp), story.chat_log, work / "diagnose")
        done(f"diagnose {story.chat_log.name}: "
             + (diag if diag is not None else "command not available"))
        if with_replay:
            # made last: the newest runs, which the run pickers show first
            from prefixscope.replay.production_week import CHAT_LOG_HOURS

            say(f"fix replay: replaying the first {CHAT_LOG_HOURS:g} hours after the release on "
                f"{STORY_INSTANCE} (day 5) as recorded and with the timestamp moved to the end")
            line = run_story_replays(str(tmp), work / "release-replays", story.chat_log, release)
            done(f"fix replay: {line}")

    if with_replay:
        # after the fix replays: the newest ledger, which the Miss ledger page shows first
        from prefixscope.cli.demo_replay import run_demo_fleet

        say("fleet: the aider chats on 3 replicas, round robin and longest-prefix")
        done(f"fleet: {run_demo_fleet(str(tmp), str(work / 'fleet'))}")
    os.replace(tmp, dest)
    wal = Path(str(tmp) + ".wal")
    if wal.exists():
        os.replace(wal, Path(str(dest) + ".wal"))
    report.seconds = time.monotonic() - t0
    return report
