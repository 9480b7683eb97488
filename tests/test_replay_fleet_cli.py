"""``prefixscope replay fleet`` through the CLI runner, on bundled traces."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from prefixscope.cli import app
from prefixscope.replay.ledger import CLASSES
from prefixscope.replay.routers import ROUTERS
from prefixscope.replay.sim import simulate
from prefixscope.replay.traces import read_trace
from prefixscope.replay.types import SimConfig

ROOT = Path(__file__).resolve().parent.parent
AIDER = ROOT / "data" / "captures" / "aider" / "chat-requests.jsonl"


def test_replay_fleet_json_on_the_aider_trace_every_policy():
    """Every policy but recorded (the trace names no instance), side by side; each policy's
    ledger sums to its prompt tokens; prefix-aware routing has no routing loss."""
    res = CliRunner().invoke(app, ["replay", "fleet", str(AIDER), "--format", "chat",
                                   "--instances", "2", "--capacity-blocks", "400", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [p["router"] for p in doc["policies"]] == [r for r in ROUTERS if r != "recorded"]
    assert doc["instances"] == 2 and doc["capacity_blocks"] == 400 and doc["block_size"] == 16
    assert doc["model"] == "sequential" and doc["format"] == "chat"
    for p in doc["policies"]:
        assert p["requests"] == 124 and p["counted_requests"] == 124
        assert sum(p["ledger"][c] for c in CLASSES) == p["prompt_tokens"]
        assert p["ledger"]["hit"] == p["cached_tokens"]
        assert p["missed_tokens"] == p["prompt_tokens"] - p["cached_tokens"]
        assert len(p["per_instance"]) == 2
        assert sum(i["cached_tokens"] for i in p["per_instance"]) == p["cached_tokens"]
        assert p["requests_max_over_mean"] >= 1.0
    by = {p["router"]: p for p in doc["policies"]}
    assert by["longest-prefix"]["ledger"]["routing"] == 0
    assert by["round-robin"]["ledger"]["routing"] > 0
    assert by["round-robin"]["routing_share_of_missed"] > 0.5
    assert by["longest-prefix"]["hit_rate"] > by["round-robin"]["hit_rate"]
    # The trace's own figures: the same prompt tokens under every policy.
    assert len({p["prompt_tokens"] for p in doc["policies"]}) == 1


def test_replay_fleet_one_instance_round_robin_equals_replay_sim():
    cfg = SimConfig(block_size=16, num_gpu_blocks=300, hash_algo="sha256")
    run = simulate(read_trace(AIDER, format="chat").requests, cfg)
    for _ in run:
        pass
    res = CliRunner().invoke(app, ["replay", "fleet", str(AIDER), "--format", "chat",
                                   "--instances", "1", "--capacity-blocks", "300",
                                   "--router", "round-robin", "--json"])
    assert res.exit_code == 0, res.output
    p = json.loads(res.output)["policies"][0]
    assert p["cached_tokens"] == run.summary().cached_tokens
    assert p["prompt_tokens"] == run.summary().prompt_tokens
    assert p["ledger"]["routing"] == 0


def test_replay_fleet_text_and_recorded_router(tmp_path):
    """A token-ids trace that names its instances: recorded joins the default list; the text
    table has one column per policy."""
    trace = tmp_path / "t.jsonl"
    lines = []
    for k in range(6):
        lines.append({"prompt_token_ids": list(range(40)) + [k] * 8, "output_tokens": 2,
                      "t": k, "conversation": f"c{k % 2}", "instance": f"pod-{k % 3}"})
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = CliRunner().invoke(app, ["replay", "fleet", str(trace), "--format", "token-ids",
                                   "--block-size", "8", "--instances", "3", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [p["router"] for p in doc["policies"]] == list(ROUTERS)
    rec = doc["policies"][-1]
    assert [i["instance"] for i in rec["per_instance"]] == ["pod-0", "pod-1", "pod-2"]
    assert [i["requests"] for i in rec["per_instance"]] == [2, 2, 2]
    # Recorded round robin over 3 pods is round robin: same hits.
    assert rec["cached_tokens"] == doc["policies"][0]["cached_tokens"]
    res = CliRunner().invoke(app, ["replay", "fleet", str(trace), "--format", "token-ids",
                                   "--block-size", "8", "--router", "round-robin,recorded"])
    assert res.exit_code == 0, res.output
    header = res.output.splitlines()[1].split()
    assert header == ["round-robin", "recorded"]
    assert "hit rate" in res.output and "routing / missed" in res.output


def test_replay_fleet_errors_are_messages_not_tracebacks(capsys):
    from prefixscope.cli.root import run

    code = run(["replay", "fleet", str(AIDER), "--format", "chat", "--router", "nearest"])
    assert code == 2
    assert "error: --router: unknown policy nearest; choose from round-robin" in \
        capsys.readouterr().err
    code = run(["replay", "fleet", str(AIDER), "--format", "chat", "--router", "recorded"])
    assert code == 2
    assert "the trace's first request names no instance" in capsys.readouterr().err


def test_replay_capacity_rows_match_replay_sim_and_min_is_never_below():
    res = CliRunner().invoke(app, ["replay", "capacity", str(AIDER), "--format", "chat",
                                   "--capacities", "150,400", "--jobs", "2", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [r["num_gpu_blocks"] for r in doc["rows"]] == [150, 400]
    for row in doc["rows"]:
        cfg = SimConfig(block_size=16, num_gpu_blocks=row["num_gpu_blocks"])
        run = simulate(read_trace(AIDER, format="chat").requests, cfg)
        for _ in run:
            pass
        s = run.summary()
        assert row["lru_cached_tokens"] == s.cached_tokens
        assert row["prompt_tokens"] == s.prompt_tokens
        assert row["rejected"] == s.rejected_requests
        assert row["min_cached_tokens"] >= row["lru_cached_tokens"]
    res = CliRunner().invoke(app, ["replay", "capacity", str(AIDER), "--format", "chat",
                                   "--capacities", "150,400"])
    assert res.exit_code == 0, res.output
    assert "LRU (vLLM)" in res.output and "MIN - LRU" in res.output


def test_replay_capacity_bad_sizes(capsys):
    from prefixscope.cli.root import run

    assert run(["replay", "capacity", str(AIDER), "--capacities", "400,abc"]) == 2
    assert "--capacities: 'abc' is not a number of blocks" in capsys.readouterr().err
    assert run(["replay", "capacity", str(AIDER), "--capacities", "1"]) == 2
    assert "--capacities: 1 is outside 2..4,000,000 blocks" in capsys.readouterr().err
