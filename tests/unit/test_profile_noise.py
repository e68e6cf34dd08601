"""The profiler's noise (issue 32): each median's spread, re-timing unstable ones, the profile's summary
(saved in its JSON only when measured), and the one-line warning."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import pytest
import torch

from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.profile import timing
from pipetrain.profile.measure import measure_profile
from pipetrain.profile.noise import NoiseLog, ProfileNoise, noise_warning, relative_spread, steadiest
from pipetrain.profile.table import LayerProfile, Profile

NOISY = [1.0, 1.5, 0.6, 2.0, 1.0]  # quartiles 1.0 and 1.5 around a median of 1.0: ±25%
STEADY = [1.0, 1.01, 0.99, 1.0, 1.0]


@pytest.mark.parametrize(("samples", "spread"), [
    ([1.0, 1.2, 0.9, 0.8, 1.1], 0.1),
    (NOISY, 0.25),
    ([1.0, 1.0, 1.0, 1.0, 10.0], 0.0),  # one slow run is not noise: the median barely moves
    ([2.0], 0.0),
    ([0.0, 0.0], 0.0),
])
def test_relative_spread_is_half_the_interquartile_range_over_the_median(samples: list[float], spread: float) -> None:
    assert relative_spread(samples) == pytest.approx(spread)


def test_a_noisy_round_is_timed_again_and_the_steady_one_kept() -> None:
    rounds = iter([NOISY, [2 * x for x in STEADY]])
    assert steadiest(lambda i: next(rounds)) == (2.0, pytest.approx(0.0), 2)


def test_rounds_stop_after_two_more_and_keep_the_steadiest() -> None:
    calls: list[int] = []

    def round_of(i: int) -> list[float]:
        calls.append(i)
        return [[1.0, 1.3, 0.6, 2.0, 1.0], NOISY, [1.0, 1.4, 0.6, 2.0, 1.0]][i]

    median, spread, rounds = steadiest(round_of)
    assert calls == [0, 1, 2] and rounds == 3
    assert (median, spread) == (1.0, pytest.approx(0.15))  # the first round


class _FakeClock:
    """A wall clock whose every reading pair spans the next of ``spans`` seconds."""

    def __init__(self, spans: Iterator[float]) -> None:
        self.spans = spans
        self.now = 0.0

    def mark(self) -> float:
        return self.now

    def seconds(self, start: float, end: float) -> float:
        return next(self.spans)


def test_the_timer_retimes_an_unstable_median_and_logs_its_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    spans = iter([9.0, *NOISY, *STEADY, 9.0, *STEADY])  # warm-up, a noisy round, a steady one (no warm-up)
    monkeypatch.setattr(timing, "device_clock", lambda device: _FakeClock(spans))
    monkeypatch.setattr("pipetrain.profile.noise.EXTRA_ROUNDS", 2)  # the default (tests/conftest.py sets 0)
    timer = timing._Timer(torch.device("cpu"), warmup=1, repeats=5)
    assert timer.median_s(lambda: lambda: None) == 1.0
    assert timer.median_s(lambda: lambda: None) == 1.0  # steady at once: one round, with its warm-up run
    assert timer.noise == NoiseLog([1.0, 1.0], [pytest.approx(0.0), pytest.approx(0.0)], retimed=1)


def test_the_summary_weighs_spreads_by_seconds() -> None:
    log = NoiseLog()
    for seconds, spread in [(10.0, 0.02), (1.0, 0.5), (0.1, 0.9)]:
        log.add(seconds, spread, retimed=spread > 0.1)
    noise = ProfileNoise.summarise(log, 5, 1.5, 2.5, 2)
    assert (noise.median_spread, noise.spread) == (0.02, 0.02)  # the 10 s measurement is 90% of the time
    log.add(2.0, 0.3, retimed=True)
    noise = ProfileNoise.summarise(log, 5, 1.5, 2.5, 2)
    assert (noise.median_spread, noise.spread, noise.measurements, noise.retimed) == (0.02, 0.3, 4, 3)
    assert ProfileNoise.summarise(NoiseLog(), 5, None, None, None).spread == 0.0


def test_the_warning_is_one_line_with_spread_load_and_fix() -> None:
    steady = ProfileNoise(0.05, 0.02, 100, 3, 5, 0.5, 0.6, 2)
    assert noise_warning(steady) is None and noise_warning(None) is None
    line = noise_warning(dataclasses.replace(steady, spread=0.23, load_start=2.8, retimed=40))
    assert line is not None and "\n" not in line
    assert line.startswith("timings vary by ±23% (load 2.8 on 2 cores) even after timing 40 of 100")
    assert "quieter machine" in line and "--repeats 10" in line
    assert steady.describe() == ("timings within ±5% for 90% of the profiled time (median ±2%; 3 of 100 timed "
                                 "again; load 0.6 on 2 cores)")
    no_load = noise_warning(dataclasses.replace(steady, spread=0.23, load_start=None, load_end=None))
    assert no_load is not None and no_load.startswith("timings vary by ±23% even")


def _synthetic() -> Profile:
    layers = tuple(LayerProfile(name, (1, 8), (1e-3, 8e-3), (2e-3, 16e-3), 64, 128, 256, 1e3) for name in "abc")
    return Profile("tiny", "f", "cpu", "estimated", 16, layers)


def test_profile_json_keeps_noise_only_when_measured() -> None:
    estimated = _synthetic()
    assert estimated.noise is None and '"noise"' not in estimated.to_json()
    assert Profile.from_json(estimated.to_json()) == estimated
    noisy = dataclasses.replace(estimated, noise=ProfileNoise(0.12, 0.04, 60, 7, 5, 1.25, None, 2))
    assert Profile.from_json(noisy.to_json()) == noisy


def test_a_malformed_noise_field_names_the_fix() -> None:
    median_above_p90 = ProfileNoise(0.01, 0.04, 60, 7, 5)
    profile = dataclasses.replace(_synthetic(), noise=median_above_p90)
    with pytest.raises(UserError, match=r"median_spread.*re-create it with `pipetrain profile`"):
        Profile.from_json(profile.to_json())


def test_a_measured_profile_carries_its_noise_and_warns_when_unstable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    graph = build_model("mlp-digits")
    profile = measure_profile(graph, 2, sizes=(2,), warmup=0, repeats=2)
    assert profile.noise is not None and profile.noise.repeats == 2
    assert profile.noise.measurements >= 4 * len(graph)  # forward, backward, B and W of every layer
    monkeypatch.setattr(timing, "steadiest", lambda round_of, extra_rounds: (round_of(0)[0], 0.5, 3))
    with caplog.at_level(logging.WARNING, logger="pipetrain.profile.measure"):
        noisy = measure_profile(graph, 2, sizes=(2,), warmup=0, repeats=1)
    assert noisy.noise is not None and noisy.noise.spread == 0.5
    assert noisy.noise.retimed == noisy.noise.measurements
    assert [r.message for r in caplog.records if r.message.startswith("timings vary by ±50%")]
