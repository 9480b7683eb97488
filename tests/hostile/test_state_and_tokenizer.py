"""Hostile gateway state files (``state_file`` of ``prefixscope gateway``) and tokenizer folders
(``--tokenizer DIR``): a FIFO, ``/dev/zero``, a folder, invalid UTF-8, nesting 3,000 levels
deep, and a state file of the wrong shape. Both are read through ``prefixscope.core.documents``:
refused with the file named and the one wording of the documents, exit 3 when the file cannot be
read, 2 when its content is bad; never a traceback, a hang, or a gateway that starts serving."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from prefixscope.gateway.store import MemoryStore
from tests.gateway_support import write_secrets
from tests.hostile.support import run_cli
from tests.hostile.test_documents import UNREADABLE, WORDS, make_hostile

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "data" / "tiny-tokenizer"
CHAT_CAPTURE = REPO / "data" / "captures" / "aider" / "chat-requests.jsonl"


def _gateway_argv(tmp_path: Path, state: Path) -> list[str]:
    secrets = write_secrets(tmp_path / "secrets")
    cfg = tmp_path / "gw.toml"
    cfg.write_text('[gateway]\nupstreams = ["http://127.0.0.1:9"]\nport = 0\n'
                   f'log_dir = "{tmp_path / "logs"}"\nstate_file = "{state}"\n'
                   + "".join(f'{k} = "{v}"\n' for k, v in secrets.items()))
    return ["gateway", "--config", str(cfg)]


STATE_KINDS = ("invalid-utf8", "deep-json", *UNREADABLE)


@pytest.mark.parametrize("kind", STATE_KINDS)
def test_hostile_state_file_stops_the_gateway_with_its_reason(kind, tmp_path):
    state = tmp_path / "state.json"
    make_hostile(state, kind)
    code, _, err = run_cli(_gateway_argv(tmp_path, state))
    assert WORDS[kind] in err, err
    assert str(state) in err, err
    assert code == (3 if kind in UNREADABLE else 2), (code, err)


@pytest.mark.parametrize(("content", "words"), [
    (b"[1, 2]", "not a gateway state file: a value of the wrong type or form"),
    (b'{"registry": {}}', "not a gateway state file: no cache_epoch"),
    (b'{"cache_epoch": "tenant-acme-secret"}',
     "not a gateway state file: a value of the wrong type or form"),
    (json.dumps({"cache_epoch": 2, "registry": {"00": "[" * 3000 + "]" * 3000}}).encode(),
     "not a gateway state file: an entry is nested too deep"),
    (json.dumps({"cache_epoch": 2, "registry": {"zz": "{}"}}).encode(),
     "not a gateway state file: no identity"),
])
def test_state_file_of_the_wrong_shape_is_a_config_error(content, words, tmp_path):
    state = tmp_path / "state.json"
    state.write_bytes(content)
    code, _, err = run_cli(_gateway_argv(tmp_path, state))
    assert code == 2, (code, err)
    assert f"{state}: {words}" in err, err
    assert "tenant-acme-secret" not in err


def test_a_saved_state_loads_and_a_missing_one_is_a_first_start(tmp_path):
    state = tmp_path / "state.json"
    first = MemoryStore(str(state))
    assert first.cache_epoch == 1 and not state.exists()
    first.cache_epoch = 5
    first.gate._epochs["ns"] = 3
    first.save()
    again = MemoryStore(str(state))
    assert (again.cache_epoch, again.gate._epochs["ns"]) == (5, 3)


TOKENIZER_FILES = {"tokenizer.json": ("invalid-utf8", "deep-json", *UNREADABLE),
                   "tokenizer_config.json": ("invalid-utf8", "deep-json", *UNREADABLE),
                   "chat_template.jinja": ("invalid-utf8", *UNREADABLE)}
TOKENIZER_CASES = [(f, k) for f, kinds in TOKENIZER_FILES.items() for k in kinds]


@pytest.mark.parametrize(("name", "kind"), TOKENIZER_CASES,
                         ids=[f"{f}-{k}" for f, k in TOKENIZER_CASES])
def test_hostile_tokenizer_file_is_refused_with_its_reason(name, kind, tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(TOKENIZER, folder)
    (folder / name).unlink()
    make_hostile(folder / name, kind)
    code, _, err = run_cli(["replay", "sim", CHAT_CAPTURE, "--format", "chat",
                            "--tokenizer", folder])
    if name == "tokenizer.json" and kind == "deep-json":
        # the tokenizers library parses it (serde_json, which stops at 128 levels)
        assert "cannot load tokenizer" in err, err
    else:
        assert WORDS[kind] in err, err
    assert str(folder / name) in err, err
    assert code == (3 if kind in UNREADABLE else 2), (code, err)
