"""``replay compare``'s human table shows hit rates as percentages (one decimal) and B - A in
percentage points; ``--json`` keeps fractions. Real bundled aider trace and layout."""

from __future__ import annotations

import json
import re
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
AIDER_TRACE = DATA / "captures" / "aider" / "chat-requests.jsonl"
LAYOUT = DATA / "layouts" / "date-in-first-user.yaml"


def test_compare_table_prints_percentages_and_json_keeps_fractions(cli, tmp_path):
    args = ["replay", "compare", AIDER_TRACE, "--layout-b", LAYOUT, "--limit", "40"]
    code, out, err = cli([*args, "--out", tmp_path / "t"])
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("hit rate"))
    a_pct, b_pct, d_pp = re.fullmatch(
        r"hit rate\s+(\d+\.\d)%\s+(\d+\.\d)%\s+([+-]\d+\.\d) pp", row).groups()
    code, out, err = cli([*args, "--out", tmp_path / "j", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert 0 <= doc["a"]["hit_rate"] <= 1 and 0 <= doc["b"]["hit_rate"] <= 1
    assert a_pct == f"{100 * doc['a']['hit_rate']:.1f}"
    assert b_pct == f"{100 * doc['b']['hit_rate']:.1f}"
    assert d_pp == f"{100 * doc['delta']['hit_rate']:+.1f}"
