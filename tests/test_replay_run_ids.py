"""Run ids are minted once (replay/run_ids.py), in one format, under one output folder, for
``replay sim``, ``replay compare`` and ``replay live``; "no usable requests" is exit code 4 for
both sim and live (docs/ingest.md: nothing could be read)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prefixscope.replay.run_ids import RUNS_DIR, default_run_dir, new_run_id

ID = r"-\d{8}T\d{6}Z-[0-9a-f]{6}"


def test_one_format_for_every_kind():
    t = 1_795_960_000.0  # 2026-11-28T...
    assert re.fullmatch(r"sim-conversation-trace" + ID, new_run_id("sim", "Conversation trace!", now_unix_s=t))
    assert re.fullmatch(r"live" + ID, new_run_id("live", now_unix_s=t))
    assert re.fullmatch(r"compare-x-a" + ID, new_run_id("compare", "x a", now_unix_s=t))
    assert len(new_run_id("sim", "y" * 100).split("-")[1]) == 32
    assert default_run_dir("sim-a") == RUNS_DIR / "sim-a" == Path("out/replay/sim-a")


def test_sim_and_compare_default_to_out_replay(cli, data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trace = str(data_dir / "captures" / "aider" / "chat-requests.jsonl")
    code, out, err = cli(["replay", "sim", trace, "--format", "chat", "--limit", "3", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert re.fullmatch(r"sim-[a-z0-9-]+" + ID, doc["run_id"])
    assert Path(doc["out_dir"]) == Path("out/replay") / doc["run_id"]
    assert (tmp_path / doc["out_dir"] / "requests.jsonl").is_file()
    code, out, err = cli(["replay", "compare", trace, "--format", "chat", "--limit", "3",
                          "--capacity-blocks", "50", "--capacity-blocks-b", "500", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert re.fullmatch(r"out/replay/compare-[a-z0-9-]+" + ID, doc["out_dir"])
    assert re.fullmatch(r"sim-[a-z0-9-]+-a" + ID, doc["a"]["run_id"])


def test_no_usable_requests_is_exit_4_for_sim_and_live(cli, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    code, _, err = cli(["replay", "sim", str(empty), "--format", "chat", "--out", str(tmp_path / "s")])
    assert code == 4 and "no usable requests" in err
    # No server is contacted: the trace is read first.
    code, _, err = cli(["replay", "live", str(empty), "--format", "chat",
                        "--base-url", "http://127.0.0.1:9", "--out", str(tmp_path / "l")])
    assert code == 4 and "no usable requests" in err
