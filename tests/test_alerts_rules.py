"""Deployment files of the alerts: Prometheus rules (promtool check + unit tests), the
Alertmanager example, the systemd units and the cron line (their command runs for real)."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from datetime import date, timedelta
from pathlib import Path

import pytest
import yaml

from prefixscope.store import db as store_db
from tests.alerts_support import CounterSource, local_ts, start_smtp

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "alerts.yml"
ALERTMANAGER = ROOT / "deploy" / "alertmanager.yml"
SERVICE = ROOT / "deploy" / "systemd" / "prefixscope-daily.service"
TIMER = ROOT / "deploy" / "systemd" / "prefixscope-daily.timer"
CRON = ROOT / "deploy" / "cron" / "prefixscope-daily.cron"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

needs_promtool = pytest.mark.skipif(not Path(PROMTOOL).exists(),
                                    reason="promtool not installed (make test installs it)")

# Unit test of the rules, one series per case, one sample a minute:
# broken (10% hit rate) and old (legacy names, 20%) alert; healthy (94%) does not; quiet (0 of
# 30 tokens, under the 1000-token guard) does not; restarted (90%, counters reset at 61 min)
# does not; gone stops at 30 min and is reported stale.
RULES_TEST = """
rule_files:
  - {rules}
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'vllm:prefix_cache_queries_total{{model_name="broken",instance="a:8000",engine="0"}}'
        values: '0+1000x150'
      - series: 'vllm:prefix_cache_hits_total{{model_name="broken",instance="a:8000",engine="0"}}'
        values: '0+100x150'
      - series: 'vllm:prefix_cache_queries_total{{model_name="healthy",instance="b:8000",engine="0"}}'
        values: '0+1000x150'
      - series: 'vllm:prefix_cache_hits_total{{model_name="healthy",instance="b:8000",engine="0"}}'
        values: '0+940x150'
      - series: 'vllm:prefix_cache_queries_total{{model_name="quiet",instance="c:8000",engine="0"}}'
        values: '0+1x30 30+0x120'
      - series: 'vllm:prefix_cache_hits_total{{model_name="quiet",instance="c:8000",engine="0"}}'
        values: '0+0x150'
      - series: 'vllm:gpu_prefix_cache_queries_total{{model_name="old",instance="d:8000"}}'
        values: '0+1000x150'
      - series: 'vllm:gpu_prefix_cache_hits_total{{model_name="old",instance="d:8000"}}'
        values: '0+200x150'
      - series: 'vllm:prefix_cache_queries_total{{model_name="restarted",instance="f:8000",engine="0"}}'
        values: '0+1000x60 0+1000x90'
      - series: 'vllm:prefix_cache_hits_total{{model_name="restarted",instance="f:8000",engine="0"}}'
        values: '0+900x60 0+900x90'
      - series: 'vllm:prefix_cache_queries_total{{model_name="gone",instance="e:8000",engine="0"}}'
        values: '0+1000x30'
      - series: 'vllm:prefix_cache_hits_total{{model_name="gone",instance="e:8000",engine="0"}}'
        values: '0+900x30'
    alert_rule_test:
      - eval_time: 10m
        alertname: PrefixCacheHitRateLow1h
        exp_alerts: []
      - eval_time: 60m
        alertname: PrefixCacheHitRateLow1h
        exp_alerts:
          - exp_labels: {{severity: warning, team: prefixscope, model_name: broken}}
            exp_annotations:
              summary: "Prefix-cache hit rate of broken below 50% over the last hour"
              description: "broken: 10% of the prompt tokens of the last hour came from the prefix cache (threshold 50%, at least 1000 tokens queried). Check the top of the prompt."
          - exp_labels: {{severity: warning, team: prefixscope, model_name: old}}
            exp_annotations:
              summary: "Prefix-cache hit rate of old below 50% over the last hour"
              description: "old: 20% of the prompt tokens of the last hour came from the prefix cache (threshold 50%, at least 1000 tokens queried). Check the top of the prompt."
      - eval_time: 90m
        alertname: PrefixCacheHitRateLow1h
        exp_alerts:
          - exp_labels: {{severity: warning, team: prefixscope, model_name: broken}}
            exp_annotations:
              summary: "Prefix-cache hit rate of broken below 50% over the last hour"
              description: "broken: 10% of the prompt tokens of the last hour came from the prefix cache (threshold 50%, at least 1000 tokens queried). Check the top of the prompt."
          - exp_labels: {{severity: warning, team: prefixscope, model_name: old}}
            exp_annotations:
              summary: "Prefix-cache hit rate of old below 50% over the last hour"
              description: "old: 20% of the prompt tokens of the last hour came from the prefix cache (threshold 50%, at least 1000 tokens queried). Check the top of the prompt."
      - eval_time: 150m
        alertname: PrefixCacheHitRateLow24h
        exp_alerts:
          - exp_labels: {{severity: critical, team: prefixscope, model_name: broken}}
            exp_annotations:
              summary: "Prefix-cache hit rate of broken below 50% over the last 24 hours"
              description: "broken: 10% of the prompt tokens of the last 24 hours came from the prefix cache (threshold 50%, at least 1000 tokens queried). Check the top of the prompt."
          - exp_labels: {{severity: critical, team: prefixscope, model_name: old}}
            exp_annotations:
              summary: "Prefix-cache hit rate of old below 50% over the last 24 hours"
              description: "old: 20% of the prompt tokens of the last 24 hours came from the prefix cache (threshold 50%, at least 1000 tokens queried). Check the top of the prompt."
      - eval_time: 40m
        alertname: PrefixCacheMetricsStale
        exp_alerts: []
      - eval_time: 60m
        alertname: PrefixCacheMetricsStale
        exp_alerts:
          - exp_labels: {{severity: warning, team: prefixscope, model_name: gone, instance: "e:8000"}}
            exp_annotations:
              summary: "vLLM prefix-cache counters of gone on e:8000 stopped arriving"
              description: "e:8000 reported vllm:prefix_cache_queries_total for gone in the last day but not for at least 15 minutes now: the hit rate of this source is unknown."
"""


@needs_promtool
def test_promtool_check_rules():
    res = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 3 rules found" in res.stdout


@needs_promtool
def test_promtool_unit_tests_of_the_rules(tmp_path):
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(RULES_TEST.format(rules=RULES))
    res = subprocess.run([PROMTOOL, "test", "rules", str(test_file)], capture_output=True,
                         text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_rules_use_the_daily_threshold_and_volume_guard():
    from prefixscope.core.config import AlertsConfig

    cfg = AlertsConfig()
    doc = yaml.safe_load(RULES.read_text())
    rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    for name in ("PrefixCacheHitRateLow1h", "PrefixCacheHitRateLow24h"):
        expr = rules[name]["expr"]
        assert f"< {cfg.hit_rate_threshold}" in expr
        assert f">= {cfg.min_query_tokens}" in expr
        assert "sum by (model_name) (increase(" in expr


def test_alertmanager_example_routes_to_defined_receivers():
    amtool = shutil.which("amtool")
    assert amtool, "amtool missing: deploy/bin/install-system-deps.sh installs prometheus-alertmanager"
    res = subprocess.run([amtool, "check-config", str(ALERTMANAGER)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout
    doc = yaml.safe_load(ALERTMANAGER.read_text())
    names = {r["name"] for r in doc["receivers"]}
    assert len(names) == len(doc["receivers"])

    def walk(route):
        yield route
        for sub in route.get("routes", []):
            yield from walk(sub)

    for route in walk(doc["route"]):
        if "receiver" in route:
            assert route["receiver"] in names
    for r in doc["receivers"]:
        for email in r.get("email_configs", []):
            assert "@" in email["to"]
    assert "smtp_auth_password" not in doc["global"]  # a file, never the secret itself
    assert doc["global"]["smtp_auth_password_file"]
    # every alert of deploy/alerts.yml carries the label the routes match on
    rules = yaml.safe_load(RULES.read_text())
    for g in rules["groups"]:
        for rule in g["rules"]:
            assert rule["labels"]["team"] == "prefixscope"


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(path.read_text())
    return parser


def test_systemd_units_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    prefixscope = Path(shutil.which("prefixscope") or ROOT / ".venv" / "bin" / "prefixscope")
    service = tmp_path / SERVICE.name
    service.write_text(SERVICE.read_text().replace("/opt/prefixscope/.venv/bin/prefixscope",
                                                   str(prefixscope)))
    shutil.copy(TIMER, tmp_path / TIMER.name)
    res = subprocess.run([analyze, "verify", str(service), str(tmp_path / TIMER.name)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    cal = _unit(TIMER)["Timer"]["OnCalendar"]
    res = subprocess.run([analyze, "calendar", cal], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_timer_runs_the_service_daily_and_catches_up():
    timer = _unit(TIMER)
    assert timer["Timer"]["Unit"] == SERVICE.name
    assert timer["Timer"]["Persistent"] == "true"
    assert timer["Install"]["WantedBy"] == "timers.target"
    service = _unit(SERVICE)["Service"]
    assert service["Type"] == "oneshot"


def _service_args() -> list[str]:
    exec_start = _unit(SERVICE)["Service"]["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0].endswith("/prefixscope")
    return argv[1:]


def _cron_args() -> list[str]:
    lines = [ln for ln in CRON.read_text().splitlines()
             if ln.strip() and not ln.startswith("#") and "=" not in ln.split()[0]]
    (line,) = lines
    fields = line.split(None, 6)
    assert len(fields) == 7 and fields[5] == "prefixscope"  # /etc/cron.d format: user field
    assert fields[:5] == ["20", "0,2,6", "*", "*", "*"]
    command = fields[6].split(">>")[0]
    argv = shlex.split(command.split("&&")[1])
    assert argv[0].endswith("/prefixscope")
    return argv[1:]


@pytest.mark.parametrize("source", ["systemd", "cron"])
def test_scheduled_command_line_sends_once(source, cli, db_path, tmp_path):
    """The exact arguments of ExecStart / the cron line, run against a real SMTP server: the
    first run mails yesterday's report, the retry runs of the same day send nothing."""
    args = _service_args() if source == "systemd" else _cron_args()
    assert args == ["report", "daily", "--send"]
    day = date(2026, 11, 28)
    folder = tmp_path / "scrapes"
    folder.mkdir()
    with store_db.writer(db_path) as con:
        src = CounterSource(folder, "vllm-a:8000", "tiny-llama", local_ts(day - timedelta(days=2), 0))
        src.day(con, day, queries=10_000, hits=9_000, every_h=4)
    server = start_smtp()
    try:
        cfg = tmp_path / "prefixscope.toml"
        cfg.write_text(f'[alerts]\nrecipients = ["oncall@example.com"]\nsmtp_host = "127.0.0.1"\n'
                       f"smtp_port = {server.port}\n")
        extra = ["--db", db_path, "--config", str(cfg), "--date", day.isoformat()]
        code, out, err = cli(args + extra)
        assert code == 0, err
        code, out2, _ = cli(args + extra)
        assert code == 0 and "skipped oncall@example.com" in out2
        assert len(server.received) == 1
    finally:
        server.stop()
