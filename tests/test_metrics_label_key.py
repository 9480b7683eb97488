"""The HMAC key for non-vLLM metric labels is read once per command (not per scrape), from
``$PREFIXSCOPE_HMAC_KEY_FILE`` or ``[identity] hmac_key_file``; a configured key that cannot be
read is an error before anything is stored."""

from __future__ import annotations

import json

import pytest

from prefixscope.ingest.exposition import configured_label_key, scrape_loop
from prefixscope.core.errors import ConfigError
from prefixscope.store import db as store_db

EXPOSITION = (
    "# TYPE vllm:prefix_cache_queries counter\n"
    'vllm:prefix_cache_queries_total{engine="0",model_name="m",tenant="acme-corp"} 100.0\n'
)


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "keys" / "hmac.key"
    path.parent.mkdir()
    path.write_bytes(bytes(range(32)))
    return path


@pytest.fixture
def no_key_env(monkeypatch, tmp_path):
    monkeypatch.delenv("PREFIXSCOPE_HMAC_KEY_FILE", raising=False)
    monkeypatch.delenv("PREFIXSCOPE_HMAC_KEY", raising=False)
    monkeypatch.delenv("PREFIXSCOPE_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./prefixscope.toml


def _tenant_labels(db_path):
    with store_db.reader(db_path) as con:
        rows = con.execute("SELECT labels FROM metric_samples").fetchall()
    return [json.loads(r[0]).get("tenant") for r in rows]


def test_no_key_configured_is_none(no_key_env):
    assert configured_label_key() is None


def test_key_from_the_config_file(no_key_env, tmp_path, key_file):
    cfg = tmp_path / "prefixscope.toml"
    cfg.write_text(f'[identity]\nhmac_key_file = "{key_file}"\n')
    assert configured_label_key(str(cfg)) == bytes(range(32))


def test_missing_key_file_is_an_error_not_silence(no_key_env, monkeypatch, tmp_path):
    monkeypatch.setenv("PREFIXSCOPE_HMAC_KEY_FILE", str(tmp_path / "gone.key"))
    with pytest.raises(ConfigError, match="gone.key: cannot read the HMAC key file"):
        configured_label_key()


def test_scrape_loop_reads_the_key_once(no_key_env, monkeypatch, tmp_path, key_file, db_path):
    monkeypatch.setenv("PREFIXSCOPE_HMAC_KEY_FILE", str(key_file))
    source = tmp_path / "metrics.prom"
    source.write_text(EXPOSITION)
    values = iter([200.0, 300.0])

    def after_scrape(outcome):
        key_file.unlink(missing_ok=True)  # later scrapes must not need the file
        source.write_text(EXPOSITION.replace("100.0", str(next(values, 400.0))))

    result = scrape_loop(db_path, [str(source)], every_s=0.01, max_scrapes=3,
                         on_scrape=after_scrape)
    assert [o.summary.rows_quarantined for o in result.outcomes] == [0, 0, 0]
    tenants = _tenant_labels(db_path)
    assert len(tenants) >= 2 and all(t.startswith("hmac:") for t in tenants)
    assert len(set(tenants)) == 1  # same key every scrape


def test_cli_fails_at_start_when_the_key_file_is_missing(cli, no_key_env, monkeypatch,
                                                          tmp_path, db_path):
    monkeypatch.setenv("PREFIXSCOPE_HMAC_KEY_FILE", str(tmp_path / "gone.key"))
    source = tmp_path / "metrics.prom"
    source.write_text(EXPOSITION)
    code, _, err = cli(["ingest", "metrics", source, "--every", "1", "--max-scrapes", "2",
                        "--db", db_path])
    assert code == 2 and "gone.key: cannot read the HMAC key file" in err
    assert "Traceback" not in err
