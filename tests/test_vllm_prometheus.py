"""A real Prometheus (Debian's /usr/bin/prometheus) scrapes the real vLLM every second;
``prefixscope ingest prometheus URL --start --end`` must give the same hit rate (and the same
hit and query tokens) as the live replay's own before/after scrapes of /metrics, with the
instance label kept.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import pytest

from tests.vllm_support import (
    ServerConfig,
    build_traffic,
    free_port,
    live_config,
    vllm_pool,  # noqa: F401  (fixture)
)

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus, pytest.mark.timeout(1200),
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="Debian package prometheus not installed")]


@pytest.fixture
def prometheus(tmp_path, vllm_pool):  # noqa: F811
    server = vllm_pool.get(ServerConfig())
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: vllm\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{server.port}']\n")
    proc = subprocess.Popen(
        [shutil.which("prometheus"), f"--config.file={cfg}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        else:
            raise RuntimeError("prometheus did not become ready:\n"
                               + (tmp_path / "prometheus.log").read_text()[-2000:])
        yield server, url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _wait_for_scrapes(url: str, *, n: int, timeout_s: float = 30) -> None:
    """Wait until Prometheus holds ``n`` samples of the hits counter in the last 5 minutes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = httpx.get(url + "/api/v1/query",
                      params={"query": "count_over_time(vllm:prefix_cache_hits_total[5m])"})
        res = r.json()["data"]["result"]
        if res and int(float(res[0]["value"][1])) >= n:
            return
        time.sleep(0.5)
    raise AssertionError("Prometheus did not scrape vLLM in time")


def test_prometheus_range_pull_equals_direct_scrapes(prometheus, tmp_path, cli):
    from prefixscope.ingest.live_run import ingest_live_run
    from prefixscope.replay.live_run import run_live
    from prefixscope.store import db as store_db
    from prefixscope.store.queries.metrics import hit_rate_totals

    server, prom_url = prometheus
    _wait_for_scrapes(prom_url, n=3)
    reqs = build_traffic(40, seed=11, salted=True, followups=8, id_prefix="p")
    summary, results = run_live(reqs, live_config(server, concurrency=2), tmp_path / "run")
    assert summary.failed == 0 and summary.settled
    time.sleep(3.5)  # Prometheus scrapes the settled counters (interval 1 s)
    start_s, end_s = summary.before_ts_unix_s + 0.001, summary.after_ts_unix_s + 3.0

    direct_db, prom_db = str(tmp_path / "direct.duckdb"), str(tmp_path / "prom.duckdb")
    with store_db.writer(direct_db) as con:
        ingest_live_run(con, tmp_path / "run")
    code, out, err = cli(["ingest", "prometheus", prom_url, "--start", str(start_s - 60),
                          "--end", str(end_s + 1), "--db", prom_db])
    assert code == 0, err

    instance = f"127.0.0.1:{server.port}"
    with store_db.reader(direct_db) as con:
        d = hit_rate_totals(con, start_s=start_s, end_s=end_s, by=("model", "instance"))
    with store_db.reader(prom_db) as con:
        p = hit_rate_totals(con, start_s=start_s, end_s=end_s, by=("model", "instance"))
    assert list(d["instance"]) == [instance] and list(p["instance"]) == [instance]
    assert list(d["model"]) == list(p["model"]) == ["tiny-llama-random"]
    assert int(d["hit_tokens"][0]) == summary.cached_tokens
    assert int(d["query_tokens"][0]) == summary.prompt_tokens
    assert int(p["hit_tokens"][0]) == int(d["hit_tokens"][0])
    assert int(p["query_tokens"][0]) == int(d["query_tokens"][0])
    assert p["hit_rate"][0] == pytest.approx(d["hit_rate"][0], abs=1e-12)
