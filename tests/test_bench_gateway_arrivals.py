"""The gateway benchmark's open-loop arrival schedule (benchmarks/gateway.py --stagger) and its
count of open streams: what the schedule promises, checked on the schedule itself (no timing)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gateway",
                                                  ROOT / "benchmarks" / "gateway.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = _bench()


def test_poisson_schedule_has_the_rate_and_exponential_gaps():
    rate = 400.0  # 64 streams of 160 ms open on average
    offsets = bench.arrival_schedule(20_000, rate, "poisson", seed=3)
    assert offsets[0] == 0.0
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert min(gaps) >= 0.0
    mean = sum(gaps) / len(gaps)
    assert mean == pytest.approx(1 / rate, rel=0.03)
    # exponential: the standard deviation equals the mean, P(gap > mean) = 1/e
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert sd == pytest.approx(mean, rel=0.05)
    assert sum(g > mean for g in gaps) / len(gaps) == pytest.approx(math.exp(-1), abs=0.02)


def test_same_seed_same_schedule_for_both_paths_other_seed_differs():
    a = bench.arrival_schedule(800, 400.0, "poisson", seed=1)
    assert a == bench.arrival_schedule(800, 400.0, "poisson", seed=1)
    assert a != bench.arrival_schedule(800, 400.0, "poisson", seed=2)


def test_constant_schedule_is_evenly_spaced():
    offsets = bench.arrival_schedule(5, 400.0, "constant")
    assert offsets == pytest.approx([0.0, 0.0025, 0.005, 0.0075, 0.01])


def test_schedule_refuses_bad_arguments():
    with pytest.raises(ValueError, match="rate_per_s"):
        bench.arrival_schedule(10, 0.0)
    with pytest.raises(ValueError, match="process"):
        bench.arrival_schedule(10, 1.0, "bursty")


def test_staggered_streams_of_fixed_length_keep_the_intended_number_open():
    # requests of 160 ms started on the schedule: Little's law, 400/s x 0.16 s = 64 open
    offsets = bench.arrival_schedule(8_000, 400.0, "poisson", seed=0)
    mean, peak = bench.open_streams([(t, t + 0.16) for t in offsets])
    assert mean == pytest.approx(64, rel=0.05)
    assert 64 < peak < 128
    # evenly spaced: 64 open at once, never more (each ends just before the 65th starts)
    offsets = bench.arrival_schedule(8_000, 400.0, "constant")
    mean, peak = bench.open_streams([(t, t + 0.1599) for t in offsets])
    assert mean == pytest.approx(64, rel=0.01)
    assert peak == 64


def test_open_streams_on_known_spans():
    assert bench.open_streams([]) == (0.0, 0)
    # 0-2 and 1-3 overlap for 1 s of a 3 s window: 4 busy seconds / 3
    mean, peak = bench.open_streams([(0.0, 2.0), (1.0, 3.0)])
    assert mean == pytest.approx(4 / 3)
    assert peak == 2
    # one ending exactly when the next starts is not two open
    assert bench.open_streams([(0.0, 1.0), (1.0, 2.0)]) == (pytest.approx(1.0), 1)
    # the synchronised wave: 64 starting together
    assert bench.open_streams([(0.0, 0.16)] * 64) == (pytest.approx(64.0), 64)


def test_open_streams_over_a_window_leaves_out_ramp_up_and_drain():
    offsets = bench.arrival_schedule(800, 400.0, "constant")  # 2 s of arrivals
    spans = [(t, t + 0.1599) for t in offsets]
    whole, _ = bench.open_streams(spans)
    assert whole < 60  # diluted by the first and last 160 ms
    mean, peak = bench.open_streams(spans, (0.16, offsets[-1]))
    assert mean == pytest.approx(64, rel=0.01)
    assert peak == 64
