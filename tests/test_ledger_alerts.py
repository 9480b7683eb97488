"""The daily report's ALERT hint names the largest loss class of the model's newest stored miss
ledger (stored through the real replay fleet -> ledger.json -> ingest path), beside the top
breaker of a stored diagnosis; OK lines and models without a ledger are unchanged."""

from __future__ import annotations

from prefixscope.alerts.daily import build_daily_report
from prefixscope.core.config import AlertsConfig
from prefixscope.core.report import ALERT, OK, MissCauses, alert_hint, loss_hint
from prefixscope.ingest.ledger import ingest_ledger_file
from prefixscope.replay.fleet_run import run_fleet
from prefixscope.replay.runner import SimRunSpec
from tests.alerts_support import local_ts
from tests.replay_io_support import AIDER_TRACE
from tests.test_diagnose_alerts import DAY, _day, _diagnosis


def _fleet_ledger(con, tmp_path, model: str, run_id: str) -> float:
    """The aider chats on 3 replicas, round robin first, stored as ``model``'s ledger; returns
    round robin's routing share of the missed tokens (a fraction)."""
    rep = run_fleet(SimRunSpec(trace=str(AIDER_TRACE), format="chat", block_size=16),
                    instances=3, routers="round-robin,longest-prefix", group=True)
    path = rep.write_ledger(tmp_path / f"{run_id}.json", run_id=run_id, model=model)
    assert ingest_ledger_file(con, path) > 0
    return rep.results[0].ledger.share_of_missed("routing")


def test_alert_line_names_the_largest_loss_class(con, tmp_path):
    _day(con, tmp_path, "bot", hits=0)
    _day(con, tmp_path, "fleet-only", hits=0)
    _day(con, tmp_path, "ok-model", hits=600_000)
    _day(con, tmp_path, "other", hits=0)
    _diagnosis(con, tmp_path, "bot")
    share = _fleet_ledger(con, tmp_path, "bot", "fleet-bot")
    assert _fleet_ledger(con, tmp_path, "fleet-only", "fleet-only") == share
    _fleet_ledger(con, tmp_path, "ok-model", "fleet-ok")
    pct = f"{100 * share:.1f}%"
    assert pct == "78.0%"  # replay fleet's table: routing / missed under round robin
    rep = build_daily_report(con, day=DAY, tz="UTC", cfg=AlertsConfig(),
                             now_unix_s=local_ts(DAY, 30))
    lines = {ln.model: ln for ln in rep.lines if ln.scope is None}
    assert lines["bot"].status == ALERT
    assert lines["bot"].text == (
        "0 of 644,000 prompt tokens from cache (0.0%): ALERT: check the top of the prompt "
        "(top breaker: timestamp on line 1 of message 0 (system), see prefixscope diagnose; "
        f"largest loss: routing ({pct} of missed))")
    assert lines["fleet-only"].text == (
        "0 of 644,000 prompt tokens from cache (0.0%): ALERT: check the top of the prompt "
        f"(largest loss: routing ({pct} of missed))")
    assert lines["ok-model"].status == OK
    assert lines["ok-model"].text == "600,000 of 644,000 prompt tokens from cache (93.2%): OK"
    assert lines["other"].text.endswith("ALERT: check the top of the prompt")


def test_the_newest_ledger_of_a_model_names_its_loss(con, tmp_path):
    """A later ledger of the model replaces the earlier one; its first policy (as deployed)
    speaks: longest-prefix first has no routing loss, so prompt change is the largest."""
    from prefixscope.store.queries.ledger import largest_loss_by_model

    _fleet_ledger(con, tmp_path, "bot", "fleet-a")
    rep = run_fleet(SimRunSpec(trace=str(AIDER_TRACE), format="chat", block_size=16),
                    instances=3, routers="longest-prefix,round-robin", group=True)
    path = rep.write_ledger(tmp_path / "b.json", run_id="fleet-b", model="bot")
    ingest_ledger_file(con, path)
    got = largest_loss_by_model(con, ["bot"])["bot"]
    assert (got["run_id"], got["router"], got["class"]) == ("fleet-b", "longest-prefix",
                                                            "prompt_change")
    led = rep.results[0].ledger
    assert got["share_of_missed"] == led.prompt_change / led.missed


def test_alert_hint_words_with_a_ledger():
    loss = {"class": "prompt_change", "share_of_missed": 0.5163}
    assert loss_hint(loss) == "largest loss: prompt change (51.6% of missed)"
    assert alert_hint(None, None, loss) == ("check the top of the prompt (largest loss: "
                                            "prompt change (51.6% of missed))")
    assert alert_hint(MissCauses(ordinary=1, rejects=(("cache_epoch", 2),)), None, loss) == (
        "2 of 3 misses were gateway rejections after a cache-epoch bump (cache_epoch 2), per "
        "the decision log; for the other 1: check the top of the prompt; largest loss: prompt "
        "change (51.6% of missed)")
    assert alert_hint(None, None, None) == "check the top of the prompt"
