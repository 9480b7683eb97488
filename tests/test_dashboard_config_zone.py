"""An ``[alerts] timezone`` that is no IANA zone (``Factory`` loads in zoneinfo but is none) is
named in a warning on the pages that read days in it, and the days are read in UTC."""

from __future__ import annotations

import pytest

from tests import dashboard_support as ds
from tests.test_dashboard_not_reported import na_db  # noqa: F401 (the fixture)


@pytest.mark.parametrize("page", ["views/overview.py", "views/savings.py", "views/alerts.py"])
def test_an_unknown_configured_zone_is_named_and_read_as_utc(page, na_db, use_db, tmp_path,  # noqa: F811
                                                            monkeypatch):
    use_db(na_db)
    cfg = tmp_path / "zone.toml"
    cfg.write_text('[alerts]\ntimezone = "Factory"\n', encoding="utf-8")
    monkeypatch.setenv("PREFIXSCOPE_CONFIG", str(cfg))
    at = ds.run_app(na_db, page, setup=lambda a: a.radio(key="filter_range").set_value("all"),
                    timeout_s=120)
    ds.assert_clean(at)
    warnings = [str(w.value) for w in at.warning]
    assert any("[alerts] timezone: unknown time zone 'Factory'" in w and "UTC" in w
               for w in warnings), warnings
