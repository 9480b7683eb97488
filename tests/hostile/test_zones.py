"""``--tz`` and the dashboard's ``?tz=`` take IANA zones only: ``localtime``, ``Factory`` and
``posixrules`` are files of the tz database (so ZoneInfo loads them) but no zone a day
boundary means; they are a usage error (exit 2) naming the option."""

from __future__ import annotations

import pytest

from prefixscope.core.times import is_iana_zone
from tests.hostile.support import fresh_db, run_cli


@pytest.mark.parametrize("name", ["localtime", "Factory", "posixrules", "posix/Europe/Berlin",
                                  "right/UTC", "../etc/passwd", "Europe/Nowhere"])
def test_report_daily_refuses_a_name_that_is_not_an_iana_zone(name, tmp_path):
    code, out, err = run_cli(["report", "daily", "--tz", name, "--db", fresh_db(tmp_path)])
    assert code == 2, (out, err)
    assert f"--tz: unknown time zone '{name}': use an IANA name such as UTC or Europe/Berlin" \
        in err


@pytest.mark.parametrize("name", ["UTC", "Europe/Berlin", "America/New_York", "Etc/UTC"])
def test_report_daily_takes_iana_zones(name, tmp_path):
    code, out, err = run_cli(["report", "daily", "--tz", name, "--db", fresh_db(tmp_path)])
    assert code == 0, err
    assert is_iana_zone(name)


def test_the_dashboard_tz_parameter_uses_the_same_rule():
    from prefixscope.dashboard.views.alerts import _valid_tz

    assert [_valid_tz(z) for z in ("localtime", "Factory", "posixrules", "UTC", "Asia/Tokyo")] \
        == [False, False, False, True, True]
