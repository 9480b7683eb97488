"""``output_token_ids`` of a token-ids trace follow the prompt's rule: integers from 0 to 2^31 - 1
(a generated token is a vocabulary id too). They took any int (-1, 10**30) while the prompt's
were bounded (new user, session 9); the record is skipped, naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hostile.support import run_cli

PROMPT = list(range(1, 18))
REASON = "$.output_token_ids: not a list of token ids (integers from 0 to 2^31 - 1)"


@pytest.mark.parametrize("bad", [[-1, 3], [10**30], [2**31], [True], [1.0], ["7"], 5])
def test_output_token_ids_out_of_range_skip_the_record(tmp_path: Path, bad):
    f = tmp_path / "trace.jsonl"
    f.write_text(json.dumps({"prompt_token_ids": PROMPT, "output_token_ids": bad}) + "\n"
                 + json.dumps({"prompt_token_ids": PROMPT, "output_token_ids": [5, 2**31 - 1]})
                 + "\n")
    code, out, err = run_cli(["replay", "sim", str(f), "--format", "token-ids", "--out",
                              str(tmp_path / "out")])
    assert code == 0, (code, out, err)
    assert f"{f}:1: {REASON}" in out + err
    assert "1 requests (0 rejected, 1 trace records skipped)" in out + err
