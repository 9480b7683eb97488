"""Generated hostile JSON lines: whole-line attacks and per-field value attacks.

Each generator yields ``(case id, raw line bytes)``; the tests pair them with the exact
quarantine entry the ingester must give. Field values are put into a good record by JSON path
(``a.b[0].c``) so that the rest of the record stays valid.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Nesting depths tried (the stdlib parser's recursion limit is about 1,000).
DEPTHS = (1_000, 100_000)
#: A string longer than any identifier cap.
HUGE = 1 << 20

#: Raw JSON number texts that overflow or leave every stated range.
BIG_INTS = {"2p63": str(2**63), "2p64": str(2**64), "2p70": str(2**70), "2p200": str(2**200),
            "neg2p63m1": str(-(2**63) - 1)}
NONFINITE = {"nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "1e400": "1e400"}


def whole_line_attacks(good: bytes) -> Iterator[tuple[str, bytes]]:
    """Lines that are not one JSON object at all (the field of their quarantine entry is none)."""
    for d in DEPTHS:
        yield f"deep-array-{d}", b"[" * d + b"]" * d
        yield f"deep-object-{d}", b'{"a":' * d + b"1" + b"}" * d
    yield "truncated", good[: len(good) // 2]
    yield "plain-text", b"hello, this is not json"
    yield "binary", bytes(b for b in range(256) if b not in (10, 13))
    yield "nul-bytes", b"\x00" * 64
    yield "invalid-utf8", b'{"a": "\xff\xfe\xfd"}'
    yield "top-array", b"[1, 2, 3]"
    yield "top-string", b'"just a string"'
    yield "top-number", b"12345"
    yield "top-null", b"null"
    yield "trailing-garbage", good + b" }}}"


def set_path(obj: Any, path: str, raw: str) -> bytes:
    """``obj`` as JSON with the value at ``path`` replaced by the raw JSON text ``raw``."""
    marker = "\x00HOSTILE\x00"
    o = copy.deepcopy(obj)
    cur = o
    parts = _split(path)
    for p in parts[:-1]:
        cur = cur[p]
    cur[parts[-1]] = marker
    return json.dumps(o).replace(json.dumps(marker), raw).encode("utf-8", "surrogatepass")


def _split(path: str) -> list[Any]:
    out: list[Any] = []
    for part in path.split("."):
        while "[" in part:
            head, _, rest = part.partition("[")
            if head:
                out.append(head)
            idx, _, part = rest.partition("]")
            out.append(int(idx))
        if part:
            out.append(part)
    return out


def number_attacks(obj: Any, path: str) -> Iterator[tuple[str, bytes]]:
    """A numeric field set to values past 2^63, non-finite, negative, or of the wrong type."""
    for name, raw in {**BIG_INTS, **NONFINITE}.items():
        yield f"{path}={name}", set_path(obj, path, raw)
    yield f"{path}=neg", set_path(obj, path, "-5")
    yield f"{path}=1e300", set_path(obj, path, "1e300")
    yield f"{path}=string", set_path(obj, path, '"12"')
    yield f"{path}=bool", set_path(obj, path, "true")
    yield f"{path}=deep", set_path(obj, path, "[" * 5000 + "]" * 5000)
    yield f"{path}=5000-digits", set_path(obj, path, "9" * 5000)


def string_attacks(obj: Any, path: str) -> Iterator[tuple[str, bytes]]:
    """A string field set to 1 MiB, control characters, a lone surrogate, or a number."""
    yield f"{path}=huge", set_path(obj, path, json.dumps("r" * HUGE))
    yield f"{path}=long", set_path(obj, path, json.dumps("r" * 1000))
    yield f"{path}=ansi", set_path(obj, path, json.dumps("\x1b[31mred\x1b[0m\x07"))
    yield f"{path}=surrogate", set_path(obj, path, '"a\\ud800b"')
    yield f"{path}=raw-invalid-utf8", set_path(obj, path, '"aX"').replace(b"aX", b"a\xc3\x28", 1)
    yield f"{path}=number", set_path(obj, path, "7")



#: Bytes of a file name that are not UTF-8 (a Latin-1 name copied from an old system).
NOT_UTF8_NAME = b"n\xff\xfe"


def path_attacks(good: Path, tmp: Path) -> Iterator[tuple[str, str, str]]:
    """Paths given to a file ingester that no file system lookup should turn into a traceback:
    ``(case id, path as the CLI receives it, the reason its error line must give)``.

    ``good`` is a valid input file of the ingester (its suffix is kept: some ingesters pick the
    format by it); the cases are made under ``tmp``.
    """
    import os

    yield ("path-5000-chars", "/" + "a" * 5000 + good.suffix,
           "file name too long (over the system's limit: 255 bytes a name, 4,096 bytes a path)")
    deep = tmp / ("d" * 200) / ("e" * 200)
    yield ("path-5000-bytes-of-folders", str(deep) + "/f" * 2400 + good.suffix,
           "file name too long (over the system's limit: 255 bytes a name, 4,096 bytes a path)")
    raw = os.fsencode(tmp) + b"/" + NOT_UTF8_NAME + good.suffix.encode()
    if good.is_dir():  # a run directory
        import shutil

        shutil.copytree(good, os.fsdecode(raw))
    else:
        with open(raw, "wb") as fh:
            fh.write(good.read_bytes())
    yield ("name-not-utf8", os.fsdecode(raw),
           "the file name is not UTF-8 text (it could not be stored as the source's location): "
           "rename the file, e.g. with convmv, and ingest it again")
    plain = tmp / "plain-file"
    plain.write_text("x")
    yield ("parent-is-a-file", str(plain / ("input" + good.suffix)),
           "a part of the path above the file is not a folder")


def http_attacks(path: str, ctype: str, good_body: bytes) -> Iterator[tuple[str, bytes, tuple[int, ...]]]:
    """Raw HTTP/1.1 requests no server of the project may answer with a traceback, an unbounded
    read or a hang: ``(case id, the bytes sent, the status codes allowed)``. ``path``/``ctype``
    /``good_body`` are a valid request of the endpoint under attack. The client keeps its side
    open after sending (no EOF), so a server that reads "to the end" hangs and fails the case.
    """
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n").encode()
    yield "chunk-size-minus-one", head + b"Transfer-Encoding: chunked\r\n\r\n-1\r\n" + b"x" * 64, \
        (400,)
    yield "chunk-size-not-hex", head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", (400,)
    yield "chunk-size-0x-prefix", head + b"Transfer-Encoding: chunked\r\n\r\n0x10\r\n", (400,)
    yield "chunk-size-huge", head + b"Transfer-Encoding: chunked\r\n\r\nffffffff\r\n", (413,)
    yield "content-length-huge", head + b"Content-Length: 99999999999\r\n\r\n", (413,)
    yield "content-length-negative", head + b"Content-Length: -5\r\n\r\n", (400,)
    yield "content-length-not-a-number", head + b"Content-Length: ten\r\n\r\n", (400,)
    # two lengths that disagree: framing an attacker picks (request smuggling), never "the first"
    yield "content-length-conflicting", (head + b"Content-Length: 2\r\nContent-Length: 20\r\n\r\n"
                                         + b"{}" + b" " * 18), (400,)
    yield "content-length-plus-sign", head + b"Content-Length: +2\r\n\r\n{}", (400,)
    # an encoding the server does not decode: never read as plain bytes
    for cid, enc in (("br", b"br"), ("zstd", b"zstd"), ("two", b"gzip, br"),
                     ("control", b"x-\x1b[31m")):
        yield (f"content-encoding-{cid}",
               head + b"Content-Encoding: " + enc + b"\r\nContent-Length: %d\r\n\r\n"
               % len(good_body) + good_body, (415,))
    yield "headers-90-kb", head + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000)
                                           for i in range(90)) + b"\r\n", (431,)
    yield "header-line-70-kb", head + b"X-Long: " + b"a" * (70 << 10) + b"\r\n\r\n", (431,)
    yield "request-line-70-kb", b"POST /" + b"a" * (70 << 10) + b" HTTP/1.1\r\n\r\n", (414, 431)
    yield "not-http", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64 + b"\r\n\r\n", \
        (400, 431)
    deep = b"[" * 100_000
    yield "json-100000-deep", head + b"Content-Length: %d\r\n\r\n" % len(deep) + deep, (400,)
    import zlib

    bomb = zlib.compress(b"\0" * (70 << 20), 9)  # 70 MiB inflated, past every 64 MiB bound
    yield "deflate-bomb", (head + b"Content-Encoding: deflate\r\nContent-Length: %d\r\n\r\n"
                           % len(bomb) + bomb), (413,)
    yield "wrong-method", (f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").encode(), (405, 501)
    yield "wrong-path", (b"POST /other HTTP/1.1\r\nHost: x\r\nContent-Type: " + ctype.encode() +
                         b"\r\nContent-Length: %d\r\n\r\n" % len(good_body) + good_body), (404,)
    yield "wrong-content-type", (head.replace(ctype.encode(), b"text/html") +
                                 b"Content-Length: %d\r\n\r\n" % len(good_body) + good_body), (415,)


def json_key_attacks(obj: dict[str, Any]) -> Iterator[tuple[str, bytes, str]]:
    """A JSON object's keys under attack: ``(case id, body, the key the refusal must name)``.
    Each key repeated with another value (the stdlib keeps the last one: a refusal must not
    depend on which), a key no endpoint takes, and a key holding control characters."""
    for k in obj:
        first = json.dumps({k: obj[k]})[1:-1]
        other = json.dumps({k: "other-value"})[1:-1]
        rest = ", ".join(json.dumps({kk: v})[1:-1] for kk, v in obj.items() if kk != k)
        yield (f"dup-key-{k}", ("{" + ", ".join(p for p in (first, rest, other) if p) + "}")
               .encode(), k)
    unknown = "tenant" if "tenant" not in obj else "tenant_id"  # {"tenant": ...} to a bump
    yield "unknown-key", json.dumps({**obj, unknown: "acme"}).encode(), unknown
    yield "unknown-key-nul", json.dumps({**obj, "a\x00b": 1}).encode(), "a\\u0000b"


#: Control characters an identifier must never hold (C0, DEL, C1), as JSON string texts.
CONTROL_STRINGS = {"nul": '"a\\u0000b"', "newline": '"a\\nb"', "esc": '"a\\u001bb"',
                   "del": '"a\\u007fb"', "c1": '"a\\u0085b"', "only-nul": '"\\u0000"'}


def control_attacks(obj: Any, path: str) -> Iterator[tuple[str, bytes]]:
    """An identifier field set to text holding a control character."""
    for name, raw in CONTROL_STRINGS.items():
        yield f"{path}=ctl-{name}", set_path(obj, path, raw)


def identity_header_attacks(names: dict[str, str], base: dict[str, str]
                            ) -> Iterator[tuple[str, list[tuple[str, bytes]], str]]:
    """Identity headers a trusted proxy might pass on wrongly: ``(case id, the request's
    headers in order, the header name the 400 must name)``. ``names`` maps each identity
    header to a good value; ``base`` holds the headers a good request sends. Every header
    repeated (a proxy that appends rather than replaces), in the same and in another case,
    with the same or another value; an epoch header that is present but empty or blank."""
    for name, good in names.items():
        rest = [(k, v.encode()) for k, v in base.items() if k != name]
        for how, second in (("same", name), ("upper", name.upper())):
            for val in ("same-value", "other-value"):
                v2 = good if val == "same-value" else good + "9"
                yield (f"repeat-{name}-{how}-{val}",
                       rest + [(name, good.encode()), (second, v2.encode())], name)
    epoch = next(n for n in names if n.endswith("epoch"))
    rest = [(k, v.encode()) for k, v in base.items() if k != epoch]
    for case, value in (("empty", b""), ("blank", b"   "), ("tab", b"\t")):
        yield f"{case}-{epoch}", rest + [(epoch, value)], epoch
