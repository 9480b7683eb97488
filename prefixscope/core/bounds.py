"""Bounds on what any input may hold, checked at ingest (every bound is listed in
``docs/ingest.md#bounds``).

A record past a bound is quarantined with ``file:line: field: reason`` (the reason states the
bound, never the value); a source that is not a regular file is refused before it is read.
Everything here is pure and shared by every reader (``ingest/*``, ``replay/trace*``), so one
bound has one wording.

Bounds:

1. :data:`MAX_LINE_BYTES`: a line (JSONL record, exposition line) longer than 1 MiB is
   quarantined without being held whole; a file with no newline at all is read no further than
   that (``/dev/zero``-like input never fills the memory). A replay trace's line, which holds
   a whole prompt's token ids, may be 16 MiB (:data:`MAX_TRACE_LINE_BYTES`), read the same way.
2. :data:`MAX_DEPTH`: JSON nested deeper than 64 arrays/objects is quarantined before it reaches
   a decoder (the stdlib and msgspec recurse: RecursionError at about 1,000 levels).
3. :data:`MAX_ID_CHARS`: identifiers (request id, run id, model, instance, topic...) are at most
   256 characters; a longer one quarantines its record (never truncated: two ids must not merge).
4. :data:`MAX_TOKENS`: a token count of one request (prompt, cached, written, completion; the
   prompt also after adding an exclusive shape's reads and writes) is an integer in
   [0, 2^32 - 1]: no model has a context near 4.3 G tokens, and a SUM over 2^31 rows then still
   fits DuckDB's BIGINT (2^63 - 1). :data:`MAX_COUNT`: sequence numbers, ranks, sizes and epochs
   are integers in [0, 2^62] (never summed).
5. :data:`TS_MIN_UNIX_S`, :data:`TS_MAX_UNIX_S`: times are in [1970-01-01, 2100-01-01) UTC
   (Unix seconds); anything else (negative, 1e15, NaN, infinite) is a unit or typing error and
   no report could print it.
6. Only regular files are read (:func:`open_regular`): a FIFO, a device (``/dev/zero``), a
   socket or a folder is refused with its kind named; a file whose first 8 KiB are mostly not
   text (:func:`looks_binary`) is refused as binary.
7. :data:`MAX_DOCUMENT_BYTES`: a document read whole (a config file, a price table, a layout, a
   run manifest, a token-id list: :mod:`prefixscope.core.documents`) is at most 16 MiB, strict
   UTF-8, and nested at most :data:`MAX_DEPTH` levels.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from typing import BinaryIO

#: Longest line read, bytes (1 MiB).
MAX_LINE_BYTES = 1 << 20
#: Longest line of a replay trace, bytes (16 MiB): one line holds a whole prompt's token ids,
#: and a 200,000-token prompt of 7-digit ids is 1.8 MB (at most one line is held at a time).
MAX_TRACE_LINE_BYTES = 16 << 20
#: Deepest JSON nesting accepted (arrays + objects).
MAX_DEPTH = 64
#: Longest identifier, characters.
MAX_ID_CHARS = 256
#: Largest sequence number, rank, size or epoch.
MAX_COUNT = 2**62
#: Largest token count of one request (2^32 - 1): 2^31 rows of it still sum within a BIGINT.
MAX_TOKENS = 2**32 - 1
#: Largest counter or histogram sample (2^53, the last exactly representable DOUBLE integer):
#: a sum over 1,024 series of it still casts to a BIGINT.
MAX_COUNTER_VALUE = float(2**53)
#: Earliest and latest accepted time, Unix seconds: 1970-01-01 and 2100-01-01 UTC.
TS_MIN_UNIX_S = 0.0
TS_MAX_UNIX_S = 4102444800.0
#: Largest document read whole (config, price table, layout, manifest, token list), bytes.
MAX_DOCUMENT_BYTES = 16 << 20
#: Bytes sampled at the start of a file by :func:`looks_binary`.
BINARY_SAMPLE_BYTES = 8192

LINE_TOO_LONG = f"line longer than {MAX_LINE_BYTES:,} bytes (1 MiB)"
TRACE_LINE_TOO_LONG = f"line longer than {MAX_TRACE_LINE_BYTES:,} bytes (16 MiB)"
TOO_DEEP = f"JSON nested deeper than {MAX_DEPTH} levels"
ID_TOO_LONG = f"longer than {MAX_ID_CHARS} characters"
#: Why an identifier that is not one line of printable text is refused (the value is never quoted).
ID_NOT_TEXT = ("not an identifier: control, invisible (format) or line-break characters, or "
               "spaces before or after it")
COUNT_RANGE = "not an integer from 0 to 2^62"
TOKENS_OVER = f"over {MAX_TOKENS:,} tokens (2^32 - 1)"
COUNTER_OVER = f"over {int(MAX_COUNTER_VALUE):,} (2^53)"
TOKENS_NEGATIVE = "token count is negative"
TIME_RANGE = "time is outside 1970-01-01 to 2100-01-01 UTC"
NOT_FINITE = "not a finite number"
DOCUMENT_TOO_LARGE = f"larger than {MAX_DOCUMENT_BYTES:,} bytes (16 MiB)"

# a JSON string, as an unrolled loop (runs of plain bytes matched at once: about 15x faster
# than an alternation per character on a prompt full of code)
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKETS = re.compile(rb"[\[\]{}]")


def json_too_deep(raw: bytes | str, limit: int = MAX_DEPTH) -> bool:
    """True when the JSON text ``raw`` nests arrays/objects deeper than ``limit``.

    Fast path: fewer than ``limit`` opening brackets in all (one pass at memchr speed). Else
    brackets inside strings are ignored (again a count first) and the running depth is
    tracked exactly. Cost of the slow path: about 6 ms for 270 KB of code in a prompt.
    """
    b = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if b.count(b"[") + b.count(b"{") <= limit:
        return False
    bare = _STRINGS.sub(b'""', b)
    if bare.count(b"[") + bare.count(b"{") <= limit:  # the brackets were inside strings
        return False
    depth = 0
    for m in _BRACKETS.finditer(bare):
        if m.group() in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def count_ok(value: object) -> bool:
    """True for an int (not a bool) in [0, :data:`MAX_COUNT`]."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def time_ok(value: object) -> bool:
    """True for a finite number of Unix seconds in [:data:`TS_MIN_UNIX_S`, :data:`TS_MAX_UNIX_S`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        x = float(value)
    except OverflowError:
        return False
    return math.isfinite(x) and TS_MIN_UNIX_S <= x < TS_MAX_UNIX_S


def id_ok(value: str) -> bool:
    """True when an identifier is at most :data:`MAX_ID_CHARS` characters."""
    return len(value) <= MAX_ID_CHARS


def id_blank(value: object) -> bool:
    """True when an identifier is missing: None, ``""`` or only whitespace (``"   "``,
    ``"\n"``). A blank id is a missing id, never a real one: else every later blank id would be
    "already stored"."""
    return value is None or (isinstance(value, str) and (value == "" or value.isspace()))


def id_text_ok(value: str) -> bool:
    """The rule of an identifier's characters (request and run ids of a usage log): printable
    text (``str.isprintable``: no control, format such as a zero-width space, line or paragraph
    separator, or surrogate characters; the one space allowed is U+0020) without a space before
    or after it. Length is :func:`id_ok`'s; blank is :func:`id_blank`'s."""
    return value.isprintable() and value[:1] != " " and value[-1:] != " "


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"))


def not_regular_reason(mode: int) -> str | None:
    """Why a file of ``st_mode`` cannot be read as a source (None for a regular file)."""
    for test, what in _KINDS:
        if test(mode):
            return f"not a regular file: it is {what}"
    return None if stat.S_ISREG(mode) else "not a regular file"


class NotReadable(OSError):
    """A path that is not a regular file or does not exist; ``str()`` is the reason."""


#: Why a path whose name is not UTF-8 is refused: every source's location is stored as text.
NAME_NOT_UTF8 = ("the file name is not UTF-8 text (it could not be stored as the source's "
                 "location): rename the file, e.g. with convmv, and ingest it again")


def _os_reason(exc: OSError, path: str | os.PathLike[str], what: str = "file") -> str:
    """One sentence for an OSError of a path, the same for every reader (lowercase, the
    system's words, with what to do where there is something to do); ``what`` is what was
    looked for (``file`` or ``folder``)."""
    if isinstance(exc, NotReadable):
        return str(exc)
    if isinstance(exc, FileNotFoundError):
        return f"a symbolic link to a missing {what}" if os.path.islink(path) else f"no such {what}"
    if exc.errno == errno.ENAMETOOLONG:
        return ("file name too long (over the system's limit: 255 bytes a name, 4,096 bytes a "
                "path)")
    if exc.errno == errno.EACCES or isinstance(exc, PermissionError):
        return ("permission denied (the file, or a folder above it, cannot be read or searched "
                "by this user)")
    if exc.errno == errno.ENOTDIR:
        return "a part of the path above the file is not a folder"
    return (exc.strerror or type(exc).__name__).lower()


def source_stat(path: str | os.PathLike[str], what: str = "file") -> os.stat_result:
    """``os.stat(path)`` of a path given to read (symlinks followed), or the sentence why not.

    The one place a source path is looked up: every ingester's files go through it (directly,
    or through :func:`check_regular` / :func:`open_regular`). A name that is not UTF-8 is
    refused before anything is read (:data:`NAME_NOT_UTF8`).

    Raises:
        NotReadable: ``no such file``, ``a symbolic link to a missing file``, ``file name too
            long (...)``, ``permission denied (...)``, ``too many levels of symbolic links``,
            :data:`NAME_NOT_UTF8`... (``no such folder`` when ``what`` is ``folder``)
    """
    name = os.fspath(path)
    if isinstance(name, str):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # a name of bytes that are not UTF-8 (surrogateescape)
            raise NotReadable(NAME_NOT_UTF8) from None
    try:
        return os.stat(path)
    except OSError as exc:
        raise NotReadable(_os_reason(exc, path, what)) from None


#: Why a path given as a folder (a run directory) is refused when it is something else.
NOT_A_FOLDER = "not a folder"


def check_folder(path: str | os.PathLike[str]) -> None:
    """Refuse anything but an existing folder (symlinks are followed): the folder equivalent of
    :func:`check_regular`, through the same lookup (:func:`source_stat`), so a name too long,
    a folder above it that cannot be searched or a name that is not UTF-8 is a sentence.

    Raises:
        NotReadable: ``no such folder``, :data:`NOT_A_FOLDER`, the reasons of
            :func:`source_stat`...
    """
    st = source_stat(path, what="folder")
    if not stat.S_ISDIR(st.st_mode):
        raise NotReadable(NOT_A_FOLDER)


def check_regular(path: str | os.PathLike[str]) -> None:
    """Refuse anything but an existing regular file (symlinks are followed), without opening it.

    Raises:
        NotReadable: ``no such file``, ``not a regular file: it is a FIFO (named pipe)``, the
            reasons of :func:`source_stat`...
    """
    st = source_stat(path)
    why = not_regular_reason(st.st_mode)
    if why is not None:
        raise NotReadable(why)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a regular file for binary reading; refuse anything else before reading a byte.

    The file is opened non-blocking (so a FIFO never blocks the open) and checked on the open
    descriptor (no race with a swap between check and open), then switched back to blocking.

    Raises:
        NotReadable: the path does not exist or is not a regular file (the reason names its
            kind); other OSError as raised by ``open``.
    """
    check_regular(path)  # a name that is not UTF-8, too long, no permission on a folder...
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:  # a folder, a socket (ENXIO), no permission...
        check_regular(path)  # names the kind when it is not a regular file
        raise NotReadable(_os_reason(exc, path)) from None
    try:
        why = not_regular_reason(os.fstat(fd).st_mode)
        if why is not None:
            raise NotReadable(why)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


BINARY_REASON = ("a binary file, not text (most of its first 8 KiB are not printable UTF-8): "
                 "give the JSONL or text file itself")


def looks_binary(head: bytes) -> bool:
    """True when more than 30% of ``head`` (a file's first bytes) is not text: NUL and other C0
    control bytes (tab, newlines, form feed and ESC excepted) and bytes that are not UTF-8."""
    if not head:
        return False
    text = head.decode("utf-8", "replace")
    bad = text.count("\ufffd")
    bad += sum(text.count(c) for c in _C0_BINARY)
    return bad > 0.3 * len(text)


_C0_BINARY = tuple(chr(c) for c in range(32) if chr(c) not in "\t\n\r\f\x1b")


def escape_control(text: str) -> str:
    """``text`` with C0/C1 control characters (ANSI escapes, BEL, NUL, CR...) and lone
    surrogates shown as ``\\x1b``-style escapes: safe to print on a terminal."""
    if text.isprintable():
        return text
    return _CONTROL.sub(_escape_one, text)


def escape_line(text: str) -> str:
    """As :func:`escape_control`, and tab, line feed (``\\x0a``) and the other line breaks
    escaped too: for a value shown on one line (a table cell, a name inside a message), which
    a newline must not split."""
    if text.isprintable():
        return text
    return _LINE_CONTROL.sub(_escape_one, text)


_LINE_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e"
                           "\u2066-\u2069]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u202a-\u202e"
                      "\u2066-\u2069]")


def _escape_one(m: re.Match[str]) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # a byte of a file name that is not UTF-8 (surrogateescape)
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


_TIME_KEYS = ("ts_unix_s", "ts", "time", "timestamp", "created", "created_at")


def out_of_range_reason(path: str | None) -> str:
    """The documented reason for msgspec's ``Number out of range`` (a number past the DOUBLE
    range such as ``1e400``) at JSON path ``path``: a token count is :data:`TOKENS_OVER`, a time
    :data:`TIME_RANGE`, anything else :data:`NOT_FINITE` (``docs/ingest.md#bounds``)."""
    leaf = (path or "").rsplit(".", 1)[-1].strip("`$[]")
    if leaf.endswith("tokens"):
        return TOKENS_OVER
    if leaf in _TIME_KEYS:
        return TIME_RANGE
    return NOT_FINITE


def token_bound_reason(msgspec_reason: str) -> str:
    """The documented wording of a token count's bound for msgspec's reason on a field typed
    ``Annotated[int, Meta(ge=0, le=MAX_TOKENS)]``: ``Expected `int` >= 0`` ->
    :data:`TOKENS_NEGATIVE`, ``Expected `int` <= 4294967295`` -> :data:`TOKENS_OVER`; any
    other reason unchanged (``docs/ingest.md#bounds``). Call it only for token fields."""
    if msgspec_reason == "Expected `int` >= 0":
        return TOKENS_NEGATIVE
    if msgspec_reason == f"Expected `int` <= {MAX_TOKENS}":
        return TOKENS_OVER
    return msgspec_reason
