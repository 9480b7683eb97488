"""Hostile whole documents through every command that reads one (config file, price table,
layout, gateway trace, token-id list, run manifest, Prometheus answer, HMAC key and the
gateway's API-key, config and admin-token files): a FIFO, ``/dev/zero``, a folder, invalid
UTF-8, nesting 3,000 levels deep (TOML, JSON, YAML), an empty file, a file past the size bound.

Each is refused with the file named and the reason in the one wording of
``prefixscope.core.documents``, with the exit code of its kind (2 config, 3 unreadable source,
4 unparsable source), never a traceback and never a hang (``run_cli`` fails past its time
bound; ``/dev/zero`` is never read, so it cannot fill the memory)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefixscope.core.bounds import DOCUMENT_TOO_LARGE, MAX_DOCUMENT_BYTES
from prefixscope.core.documents import DocumentError, parse_json, parse_toml, parse_yaml, read_document
from tests.hostile.support import fresh_db, run_cli

REPO = Path(__file__).resolve().parents[2]
GATEWAY_TRACE = REPO / "data" / "multitenant" / "trace.jsonl"

#: kind -> (file name suffix, bytes) of each hostile document; fifo/dev-zero/folder are made.
CONTENT = {
    "invalid-utf8": b"\xff\xfe\x00 not text",
    "deep-toml": b"a = " + b"[" * 3000 + b"]" * 3000 + b"\n",
    "deep-json": b"[" * 3000 + b"]" * 3000,
    "deep-yaml": b"a: " + b"[" * 3000 + b"]" * 3000 + b"\n",
}
#: kind -> the reason's words on stderr.
WORDS = {
    "invalid-utf8": "not UTF-8 text (byte 0)",
    "deep-toml": "TOML nested deeper than 64 levels",
    "deep-json": "JSON nested deeper than 64 levels",
    "deep-yaml": "YAML nested deeper than 64 levels",
    "fifo": "not a regular file: it is a FIFO (named pipe)",
    "dev-zero": "not a regular file: it is a character device",
    "folder": "not a regular file: it is a folder",
}
UNREADABLE = ("fifo", "dev-zero", "folder")


def make_hostile(path: Path, kind: str) -> None:
    """Make ``path`` the hostile document ``kind`` (``dev-zero``: a symbolic link to it)."""
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(CONTENT[kind])


def _path(kind: str, tmp_path: Path, suffix: str) -> str:
    if kind == "dev-zero":
        return "/dev/zero"
    p = tmp_path / f"doc{suffix}"
    make_hostile(p, kind)
    return str(p)


def _key(tmp_path: Path) -> str:
    k = tmp_path.parent / f"{tmp_path.name}-hmac.key"  # outside any repository checkout
    k.write_bytes(os.urandom(32).hex().encode())  # no whitespace to strip
    return str(k)


#: target -> (suffix, kinds that apply, argv builder(path, tmp_path, db), code when unreadable,
#: code when its content is bad).
TARGETS = {
    "config (report daily)": (".toml", ("invalid-utf8", "deep-toml", *UNREADABLE),
                              lambda p, t, db: ["report", "daily", "--dry-run", "--db", db,
                                                "--config", p], 2, 2),
    "price table": (".toml", ("invalid-utf8", "deep-toml", *UNREADABLE),
                    lambda p, t, db: ["ingest", "prices", p, "--db", db], 3, 2),
    # /dev/zero has no .toml/.yaml suffix: a layout is refused by its name first
    "layout toml": (".toml", ("invalid-utf8", "deep-toml", "fifo", "folder"),
                    lambda p, t, db: ["replay", "sim", str(REPO / "data/captures/aider/chat-requests.jsonl"),
                                      "--format", "chat", "--layout", p], 3, 2),
    "layout yaml": (".yaml", ("invalid-utf8", "deep-yaml", "fifo", "folder"),
                    lambda p, t, db: ["replay", "sim", str(REPO / "data/captures/aider/chat-requests.jsonl"),
                                      "--format", "chat", "--layout", p], 3, 2),
    "token ids": (".json", ("invalid-utf8", "deep-json", *UNREADABLE),
                  lambda p, t, db: ["replay", "hashes", p], 3, 4),
    "gateway trace": (".jsonl", ("invalid-utf8", "deep-json", *UNREADABLE),
                      lambda p, t, db: ["replay", "gateway", p, "--no-ingest", "--db", db,
                                        "--hmac-key-file", _key(t), "--out", str(t / "out")], 3, 4),
    "inventory": (".txt", ("invalid-utf8", *UNREADABLE),
                  lambda p, t, db: ["replay", "gateway", str(GATEWAY_TRACE), "--no-ingest",
                                    "--db", db, "--hmac-key-file", _key(t), "--inventory", p,
                                    "--out", str(t / "out")], 2, 2),
    "hmac key": ("", UNREADABLE,
                 lambda p, t, db: ["replay", "gateway", str(GATEWAY_TRACE), "--no-ingest",
                                   "--db", db, "--hmac-key-file", p, "--out", str(t / "out")], 2, 2),
}
CASES = [(target, kind) for target, (_, kinds, *_rest) in TARGETS.items() for kind in kinds]


@pytest.mark.parametrize(("target", "kind"), CASES, ids=[f"{t}-{k}" for t, k in CASES])
def test_hostile_document_is_refused_with_its_reason(target, kind, tmp_path):
    suffix, _, argv, unreadable_code, bad_code = TARGETS[target]
    path = _path(kind, tmp_path, suffix)
    code, _, err = run_cli(argv(path, tmp_path, fresh_db(tmp_path)))
    assert WORDS[kind] in err, err
    assert path in err or Path(path).resolve().as_posix() in err, err
    if unreadable_code is not None:
        assert code == (unreadable_code if kind in UNREADABLE else bad_code), (code, err)
    else:
        assert code != 0


def test_read_document_bounds(tmp_path):
    big = tmp_path / "big.toml"
    with open(big, "wb") as fh:
        fh.truncate(MAX_DOCUMENT_BYTES + 1)  # sparse: 16 MiB + 1 without writing it
    with pytest.raises(DocumentError, match="larger than 16,777,216 bytes") as info:
        read_document(big)
    assert str(info.value) == DOCUMENT_TOO_LARGE and not info.value.unreadable
    ok = tmp_path / "ok.toml"
    ok.write_bytes(b"\xef\xbb\xbfa = 1\n")  # a BOM is not part of the text
    assert parse_toml(read_document(ok)) == {"a": 1}
    with pytest.raises(DocumentError) as info:
        read_document(tmp_path / "gone.toml")
    assert info.value.missing and info.value.unreadable and str(info.value) == "no such file"
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"a": 1}\n\n\xff')
    with pytest.raises(DocumentError, match=r"not UTF-8 text \(byte 10\)") as info:
        read_document(bad)
    assert info.value.line == 3


def test_parse_errors_never_quote_the_text():
    secret = "tenant-acme-secret-prompt"
    for parse, text in ((parse_toml, f'a = "{secret}" junk'), (parse_json, f'{{"a": {secret}}}'),
                        (parse_yaml, f"a: [{secret}\nb: ]: c")):
        with pytest.raises(DocumentError) as info:
            parse(text)
        reason = str(info.value)
        assert secret not in reason
        assert "line" in reason or "byte" in reason, reason
