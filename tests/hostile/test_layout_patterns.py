"""A layout's regular expression cannot hang a replay (ReDoS): patterns are matched by the
``regex`` engine with a per-message time bound (prefixscope.core.patterns), and a pattern that
overruns it, or does not compile, is a config error (exit 2) naming the file and the field.
"""

from __future__ import annotations

import json
import time

from prefixscope.core.patterns import MATCH_TIMEOUT_S
from tests.hostile.support import run_cli_subprocess


def _chat(path, system_text: str, n: int = 2):
    path.write_text("".join(json.dumps({"request_id": f"r{i}", "model": "m", "messages": [
        {"role": "system", "content": system_text + "\nrest of system prompt"},
        {"role": "user", "content": "hi " * 40}]}) + "\n" for i in range(n)))
    return path


def _layout(path, pattern: str, kind: str = "move_lines"):
    extra = {"move_lines": ', "from": "first_system", "to": "first_user_end"',
             "remove_lines": "", "replace": ', "with": "x"'}[kind]
    path.write_text(f'name: x\ntransforms:\n  - {{"type": "{kind}", "pattern": '
                    f'{json.dumps(pattern)}{extra}}}\n')
    return path


def test_the_new_users_nested_plus_finishes(tmp_path):
    chat = _chat(tmp_path / "redos-chat.jsonl", "a" * 34 + "!")
    lay = _layout(tmp_path / "redos.yaml", "(a+)+$")
    t0 = time.monotonic()
    code, out, err = run_cli_subprocess(["replay", "compare", chat, "--format", "chat",
                                         "--layout-b", lay, "--out", tmp_path / "out"],
                                        timeout_s=60)
    assert code == 0, err
    assert "hit rate" in out
    assert time.monotonic() - t0 < 60


def test_a_catastrophic_pattern_is_a_config_error_naming_file_and_field(tmp_path):
    # (a|aa)+$ on a line of a's ending in "!" backtracks exponentially in any backtracking engine
    chat = _chat(tmp_path / "chat.jsonl", "a" * 60 + "!")
    for kind in ("move_lines", "remove_lines", "replace"):
        lay = _layout(tmp_path / f"{kind}.yaml", "(a|aa)+$", kind)
        t0 = time.monotonic()
        code, out, err = run_cli_subprocess(["replay", "compare", chat, "--format", "chat",
                                             "--layout-b", lay, "--out", tmp_path / "out"],
                                            timeout_s=60)
        took = time.monotonic() - t0
        assert code == 2, (kind, out, err)
        assert f"{lay}: transforms.0.pattern: the regular expression took longer than " \
               f"{MATCH_TIMEOUT_S:g} s on one message" in err, err
        assert "a" * 60 not in err  # never echoes the prompt text
        assert took < 45, took


def test_a_pattern_the_engine_rejects_is_a_config_error(tmp_path):
    chat = _chat(tmp_path / "chat.jsonl", "hello")
    lay = _layout(tmp_path / "bad.yaml", "(a+")
    code, out, err = run_cli_subprocess(["replay", "compare", chat, "--format", "chat",
                                         "--layout-b", lay, "--out", tmp_path / "out"],
                                        timeout_s=60)
    assert code == 2, err
    assert f"{lay}: transforms.0" in err and "pattern" in err
    assert "not a valid regular expression" in err
