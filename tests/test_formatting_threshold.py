"""A report line's figure never contradicts its status: a value just under the alert threshold
does not round onto it (``fmt_share_vs``; docs/metrics.md "Percentage")."""

from __future__ import annotations

import pytest

from prefixscope.core.formatting import fmt_share, fmt_share_vs
from prefixscope.core.report import format_report_line


@pytest.mark.parametrize(("part", "whole", "threshold", "text"), [
    (4_999, 10_000, 0.5, "49.99%"),
    (49_999, 100_000, 0.5, "49.999%"),
    (5_000, 10_000, 0.5, "50.0%"),
    (5_001, 10_000, 0.5, "50.0%"),      # above: rounding down onto it still reads OK's side
    (6_432, 10_380, 0.5, "62.0%"),      # far from it: the pages' one decimal
    (79_995, 100_000, 0.8, "79.995%"),
    (1, 3, 0.5, "33.3%"),
])
def test_figure_stays_on_its_side_of_the_threshold(part, whole, threshold, text):
    assert fmt_share_vs(part, whole, threshold) == text
    assert (part / whole < threshold) == (float(text.rstrip("%")) / 100 < threshold)


def test_report_line_reads_its_status():
    assert fmt_share(4_999, 10_000) == "50.0%"  # the plain format would contradict ALERT
    status, text = format_report_line(4_999, 10_000, 0.5)
    assert status == "ALERT" and "(49.99%): ALERT" in text
    status, text = format_report_line(5_000, 10_000, 0.5)
    assert status == "OK" and "(50.0%): OK" in text


def test_rate_beside_a_status_stays_on_its_side():
    from prefixscope.core.formatting import fmt_pct_vs

    assert fmt_pct_vs(0.49996, 0.5) == "49.996%"
    assert fmt_pct_vs(0.5, 0.5) == "50.0%"
    assert fmt_pct_vs(0.734, 0.5) == "73.4%"
    assert fmt_pct_vs(None, 0.5) == "—"
    assert fmt_pct_vs(0.49996, None) == "50.0%"
