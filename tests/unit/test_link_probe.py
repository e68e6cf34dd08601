"""The link probe: the least-squares link fit, and a real two-process probe."""

from __future__ import annotations

import logging
import math

import pytest

from pipetrain.cluster import NO_MESSAGE_HOST, Link, MessageHost
from pipetrain.errors import UserError
from pipetrain.graph.zoo import build_model
from pipetrain.profile import link as link_module
from pipetrain.profile.link import (
    DEFAULT_SIZES_BYTES,
    LinkProbe,
    _fit_collective_or_none,
    fit_collective,
    fit_error,
    fit_link,
    fit_message_host,
    probe_cluster,
    probe_link,
    probe_links,
)


def synthetic(link: Link) -> list[tuple[int, float]]:
    return [(n, link.transfer_s(n)) for n in DEFAULT_SIZES_BYTES]


def test_default_sizes_span_64_bytes_to_16_mib() -> None:
    assert DEFAULT_SIZES_BYTES[0] == 64
    assert DEFAULT_SIZES_BYTES[-1] == 16 << 20


def test_fit_recovers_a_known_link_exactly() -> None:
    truth = Link(latency_s=5e-5, bandwidth_bytes_per_s=2.5e9)
    fitted = fit_link(synthetic(truth))
    assert fitted.latency_s == pytest.approx(truth.latency_s, rel=1e-9)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(truth.bandwidth_bytes_per_s, rel=1e-9)
    assert fit_error(fitted, synthetic(truth)) < 1e-9


def test_fit_weighs_small_messages_by_relative_error() -> None:
    truth = Link(latency_s=1e-4, bandwidth_bytes_per_s=1e9)
    points = [(n, t * (1.1 if i % 2 else 0.9)) for i, (n, t) in enumerate(synthetic(truth))]
    fitted = fit_link(points)
    assert fitted.latency_s == pytest.approx(truth.latency_s, rel=0.15)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(truth.bandwidth_bytes_per_s, rel=0.15)
    assert fit_error(fitted, points) < 0.25


def test_fit_clamps_a_negative_latency() -> None:
    points = [(1000, 1e-6), (2000, 3e-6), (4000, 7e-6)]  # the line through them has latency < 0
    fitted = fit_link(points)
    assert fitted.latency_s == 0.0
    assert 1e8 < fitted.bandwidth_bytes_per_s < 1e9


@pytest.mark.parametrize(
    "points",
    [[(64, 1e-5)], [(64, 1e-5), (64, 2e-5)], [(64, 0.0), (128, 1e-5)], [(64, 2e-5), (1 << 20, 1e-5)]],
)
def test_fit_rejects_unusable_points(points: list[tuple[int, float]]) -> None:
    with pytest.raises(UserError):
        fit_link(points)


def test_probe_rejects_bad_arguments() -> None:
    with pytest.raises(UserError, match="two or more positive sizes"):
        probe_link(sizes_bytes=[64])
    with pytest.raises(UserError, match="repeats"):
        probe_link(repeats=0)


@pytest.mark.slow
def test_probe_two_local_ranks() -> None:
    sizes = (64, 1 << 16, 1 << 22, 1 << 24)  # 16 MiB: the bandwidth outweighs a loaded machine's noise
    probe = probe_link(sizes_bytes=sizes, repeats=5)
    assert [n for n, _ in probe.points] == list(sizes)
    assert all(t > 0 for _, t in probe.points)
    assert 0 <= probe.link.latency_s < 0.01
    assert probe.link.bandwidth_bytes_per_s > 1e7
    assert probe.max_relative_error == pytest.approx(fit_error(probe.link, probe.points))
    assert 0.0 < probe.contention_speed < 2.0  # measured, whatever the load: other tests may share the cores
    assert probe.backend == "gloo"
    assert [n for n, _ in probe.collective_points] == list(sizes)
    assert 0 < probe.collective.latency_s < 0.01
    assert probe.collective.bandwidth_bytes_per_s > 1e7
    assert [n for n, _, _ in probe.host_points] == [1 << 10, 1 << 16, 1 << 20]
    assert 0 < probe.message_host.send_s + probe.message_host.send_per_byte_s < 0.01
    assert probe.message_host.recv_s + probe.message_host.recv_per_byte_s > 0


def test_message_host_fit_recovers_each_side_and_clamps_noise() -> None:
    sizes = (1 << 10, 1 << 16, 1 << 20)
    exact = [(n, 5e-5 + n * 3e-10, 7e-5 + n * 1e-10) for n in sizes]
    host = fit_message_host(exact)
    assert host.send_s == pytest.approx(5e-5) and host.send_per_byte_s == pytest.approx(3e-10)
    assert host.recv_s == pytest.approx(7e-5) and host.recv_per_byte_s == pytest.approx(1e-10)
    shrinking = [(n, 9e-5 - n * 1e-11, 2e-9 * n - 1e-6) for n in sizes]  # noise: a send cheaper when larger, a
    # negative fixed part
    noisy = fit_message_host(shrinking)
    assert noisy.send_per_byte_s == 0 and noisy.send_s == pytest.approx(sum(t for _, t, _ in shrinking) / 3)
    assert noisy.recv_s == 0 and noisy.recv_per_byte_s == pytest.approx(2e-9, rel=1e-3)
    with pytest.raises(UserError, match="two different message sizes"):
        fit_message_host([(64, 1e-5, 1e-5), (64, 2e-5, 2e-5)])


def test_a_two_rank_all_reduce_is_two_ring_steps() -> None:
    """``2 · latency + n / bandwidth`` at r = 2: the step's latency is half the intercept."""
    step = Link(latency_s=2e-4, bandwidth_bytes_per_s=1.5e9)
    points = [(n, 2 * step.latency_s + n / step.bandwidth_bytes_per_s) for n in DEFAULT_SIZES_BYTES]
    fitted = fit_collective(points)
    assert fitted.latency_s == pytest.approx(step.latency_s, rel=1e-9)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(step.bandwidth_bytes_per_s, rel=1e-9)


@pytest.mark.slow
def test_probe_contention_on_a_models_own_work() -> None:
    """Rank 0 runs the first half of the model's layers, rank 1 the second half, alone then together."""
    graph = build_model("mlp", n_layers=4, inputs=64, width=64, hidden=128, classes=8)
    probe = probe_link(sizes_bytes=(64, 1 << 20, 1 << 22, 1 << 24), repeats=3, model=(graph, 8))
    assert 0.0 < probe.contention_speed < 2.0  # measured, whatever the load: other tests may share the cores


@pytest.mark.slow
def test_a_given_link_is_kept_and_only_contention_measured() -> None:
    """``link=``: no ping-pong or all-reduce (no points, so no fit), the link and all-reduce as given,
    the contention measured, in each of two rounds of one launch."""
    graph = build_model("mlp", n_layers=4, inputs=64, width=64, hidden=128, classes=8)
    given, all_reduce = Link(3e-5, 2e9), Link(2e-4, 1e9)
    probes = probe_links(2, sizes_bytes=[64], repeats=0, model=(graph, 8), link=given,
                         collective=all_reduce)  # sizes unused: no error
    assert len(probes) == 2
    for probe in probes:
        assert (probe.link, probe.points, probe.max_relative_error) == (given, (), 0.0)
        assert (probe.collective, probe.collective_points) == (all_reduce, ())
        assert (probe.message_host, probe.host_points) == (NO_MESSAGE_HOST, ())
        # A measured ratio t_alone / t_together: above 1 when another process slowed an "alone" turn (other
        # tests share the cores), so only its sign is certain; probe_cluster caps it at 1 (the next test).
        assert 0.0 < probe.contention_speed < math.inf


def test_probe_cluster_keeps_a_given_link(monkeypatch: pytest.MonkeyPatch) -> None:
    given, all_reduce = Link(3e-5, 2e9), Link(2e-4, 1e9)
    seen: list[Link | None] = []

    host = MessageHost(send_s=1e-5)

    def fake_probes(rounds: int, *, model: object = None, link: Link | None = None,
                    collective: Link | None = None, message_host: MessageHost = NO_MESSAGE_HOST) -> list[LinkProbe]:
        seen.append(link)
        measured = link is None
        return [LinkProbe(Link(1.0, 1.0) if measured else link, (), 0.0, speed, "gloo",
                          Link(0.5, 0.5) if measured else collective, (),
                          MessageHost(send_s=speed * 1e-4, recv_s=2e-4) if measured else message_host, ())
                for speed in (0.8, 0.6, 0.9)[:rounds]]

    monkeypatch.setattr(link_module, "probe_links", fake_probes)
    cluster = probe_cluster(2, probes=3, link=given, collective=all_reduce, message_host=host)
    assert seen == [given]  # one launch for the three probes, their median contention kept
    assert (cluster.intra_node, cluster.shared_speed, cluster.collective) == (given, (1.0, 0.8), all_reduce)
    assert cluster.message_host == host
    fresh = probe_cluster(2, probes=3)
    assert (fresh.intra_node, fresh.collective) == (Link(1.0, 1.0), Link(0.5, 0.5))
    assert fresh.message_host.send_s == pytest.approx(0.8e-4) and fresh.message_host.recv_s == 2e-4  # each's median


def test_probe_cluster_caps_a_contention_speed_raised_by_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two busy ranks are never faster than one alone: a ratio above 1 (an "alone" turn slowed by another
    process) becomes a shared speed of 1, not a prediction faster than one rank."""
    def fake_probes(rounds: int, **_: object) -> list[LinkProbe]:
        return [LinkProbe(Link(1.0, 1.0), (), 0.0, 2.22, "gloo", Link(0.5, 0.5), (), NO_MESSAGE_HOST, ())] * rounds

    monkeypatch.setattr(link_module, "probe_links", fake_probes)
    assert probe_cluster(2, probes=3).shared_speed == (1.0, 1.0)


def test_contention_on_a_model_needs_two_halves() -> None:
    one_layer = build_model("mlp", n_layers=1)
    with pytest.raises(UserError, match="two halves"):
        probe_link(model=(one_layer, 4))
    with pytest.raises(UserError, match="two halves"):
        probe_link(model=(build_model("mlp", n_layers=2), 0))


def test_noisy_all_reduce_times_fall_back_to_the_link(caplog: pytest.LogCaptureFixture) -> None:
    """A collective's times that do not grow with size (seen on a loaded machine with 3 repeats:
    1 MiB 4.5 ms, 4 MiB 2.6 ms) give no fit; the probe keeps its link and prices all-reduces from it."""
    noisy = [(64, 3.5e-4), (1 << 20, 4.5e-3), (1 << 22, 2.6e-4)]
    with pytest.raises(UserError, match="do not grow"):
        fit_collective(noisy)
    with caplog.at_level(logging.WARNING, logger="pipetrain.profile.link"):
        assert _fit_collective_or_none(noisy) is None
    assert "priced from the link" in caplog.text
    clean = [(64, 4e-4), (1 << 20, 1.2e-3)]
    assert _fit_collective_or_none(clean) == fit_collective(clean)
