"""Parsing and formatting of points in time.

All stored times are Unix seconds (float, UTC). Users may type ISO 8601 (``2026-11-28T10:00:00Z``,
a date ``2026-11-28`` meaning its midnight UTC), Unix seconds (``1795960824.2``) or a relative
time (``now``, ``-1h``, ``-30m``, ``-7d``, ``-90s``).
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from prefixscope.core.bounds import time_ok
from prefixscope.core.errors import UsageError

_REL = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


#: Names the tz database ships that are not zones a user means: ``Factory`` (offset 0, "-00",
#: for unconfigured machines), ``localtime`` (a link to whatever the machine is set to),
#: ``posixrules`` (the POSIX TZ rule template).
_NOT_ZONES = frozenset({"Factory", "localtime", "posixrules"})
_ZONES: frozenset[str] | None = None


def is_iana_zone(name: object) -> bool:
    """True for an IANA zone name a day boundary may use: ``UTC`` or one of
    ``zoneinfo.available_timezones()`` other than ``Factory``, ``localtime``, ``posixrules``
    (and never a ``posix/`` or ``right/`` copy)."""
    global _ZONES
    if not isinstance(name, str):
        return False
    if name == "UTC":
        return True
    if _ZONES is None:
        import zoneinfo

        _ZONES = frozenset(z for z in zoneinfo.available_timezones()
                           if z not in _NOT_ZONES and not z.startswith(("posix/", "right/")))
    return name in _ZONES


def parse_time(text: str, *, now_unix_s: float | None = None) -> float:
    """Parse a user-given time into Unix seconds (UTC).

    Args:
        text: ISO 8601 date or date-time (naive values are UTC), Unix seconds, ``now``, or a
            negative offset from now such as ``-1h`` (units s, m, h, d).
        now_unix_s: the reference for ``now`` and offsets; defaults to the wall clock.

    Returns:
        Seconds since the Unix epoch, UTC, within the stored times' bound (1970-01-01 to
        2100-01-01, ``prefixscope.core.bounds``).

    Raises:
        UsageError: the text is none of the accepted forms, or a time outside that bound
            (``1e300``, ``-100000000d``, year 3000: no report could print it).
    """
    now = time.time() if now_unix_s is None else now_unix_s
    t = text.strip()
    if t == "now":
        return now
    m = _REL.match(t)
    if m:
        return _bounded(now - float(m.group(1)) * _UNIT_S[m.group(2)], text)
    try:
        return _bounded(float(t), text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError as exc:
        raise UsageError(
            f"cannot read time {text!r}: use ISO 8601 (2026-11-28T10:00:00Z), Unix seconds, "
            "'now' or an offset like -1h"
        ) from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return _bounded(dt.timestamp(), text)


def _bounded(ts: float, text: str) -> float:
    if not time_ok(ts):
        raise UsageError(f"time {text!r} is outside 1970-01-01 to 2100-01-01 UTC")
    return ts


#: Longest duration accepted (a window, a lookback): 100 years, in seconds.
MAX_DURATION_S = 36_500 * 86_400.0


def parse_duration(text: str) -> float:
    """Parse a duration such as ``5m``, ``1h``, ``1d``, ``90s`` or ``300`` into seconds.

    Raises:
        UsageError: not a positive duration, or longer than :data:`MAX_DURATION_S` (100 years).
    """
    t = text.strip()
    m = re.match(r"^(\d+(?:\.\d+)?)([smhd]?)$", t)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"cannot read duration {text!r}: use e.g. 300, 90s, 5m, 1h or 1d")
    seconds = float(m.group(1)) * _UNIT_S.get(m.group(2) or "s", 1.0)
    if not seconds <= MAX_DURATION_S:  # also inf from 1e400-like digits
        raise UsageError(f"duration {text!r} is longer than 100 years (36500d)")
    return seconds


def format_time(ts_unix_s: float) -> str:
    """Format Unix seconds as ISO 8601 UTC with a ``Z`` suffix, to the second."""
    return datetime.fromtimestamp(ts_unix_s, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
