"""CostModel and Cluster: interpolation, speeds, links, JSON."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipetrain.cluster import Cluster, Device, Link, MessageHost
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.profile.table import LayerProfile, Profile, interpolate
from tests.conftest import flat_profile


def test_interpolate_between_and_beyond() -> None:
    sizes, values = (1, 2, 4), (1.0, 2.0, 3.0)
    assert interpolate(sizes, values, 3) == pytest.approx(2.5)
    assert interpolate(sizes, values, 8) == pytest.approx(5.0)  # extrapolated from (2, 4)
    assert interpolate((4,), (2.0,), 8) == pytest.approx(4.0)


def profile() -> Profile:
    layers = (
        LayerProfile("a", (1, 4), (1.0, 2.0), (2.0, 4.0), 100, 10, 1000, 5.0, 0.5),
        LayerProfile("b", (1, 4), (3.0, 6.0), (6.0, 12.0), 200, 20, 2000, 5.0, 0.25),
    )
    return Profile("m", "", "cpu", "test", 50, layers)


def test_stage_costs_bytes_and_speed() -> None:
    devices = (Device("cpu", 1, 1.0, 0), Device("cpu", 1, 0.5, 1))
    cluster = Cluster(devices, Link(0.0, 1e3), Link(1.0, 1e2), action_overhead_s=0.1)
    cost = CostModel(profile(), cluster)
    assert cost.forward_s(("a", "b"), 4, 0) == pytest.approx(0.1 + 8.0)
    assert cost.forward_s(("a", "b"), 4, 1) == pytest.approx(0.1 + 16.0)
    assert cost.backward_s(("a",), 1, 0, True) == pytest.approx(0.1 + 3.0)
    assert cost.output_bytes(("a", "b"), 3) == 600
    assert cost.input_bytes(("a",), 2) == 100 and cost.input_bytes(("b",), 2) == 200
    assert cost.transfer_s(100, 0, 0) == pytest.approx(0.1)
    assert cost.transfer_s(100, 0, 1) == pytest.approx(2.0)  # across nodes
    assert cost.saved_bytes(("a", "b"), 2) == 60
    assert cost.step_s(("a", "b"), 1) == pytest.approx(0.1 + 1.5)  # a STEP pays the per-action overhead too
    assert list(cost.forward_table(("a",), 2, 0)) == pytest.approx([0.0, 1.1, 1.43333333])


def test_missing_device_profile_and_rank() -> None:
    with pytest.raises(UserError, match="no profile for device kind"):
        CostModel({"v100": profile()}, Cluster.local(2))
    with pytest.raises(UserError, match="rank 5 has no device"):
        CostModel(profile(), Cluster.local(2)).forward_s(("a",), 1, 5)


def test_cluster_json_round_trip_and_errors() -> None:
    cluster = Cluster.local(3, speed=0.86, link=Link(2e-4, 1e9), action_overhead_s=1e-4)
    assert Cluster.from_json(cluster.to_json()) == cluster
    probed = replace(cluster, collective=Link(3e-4, 2e9))
    assert Cluster.from_json(probed.to_json()) == probed
    old_file = json.loads(cluster.to_json())
    del old_file["collective"]  # written before the probe measured all-reduces
    assert Cluster.from_json(json.dumps(old_file)).collective is None
    with pytest.raises(UserError, match="collective"):
        Cluster.from_json(replace(cluster, collective=Link(-1.0, 2e9)).to_json())
    hosted = replace(cluster, message_host=MessageHost(send_s=5e-5, recv_s=7e-5, send_per_byte_s=3e-10))
    assert Cluster.from_json(hosted.to_json()) == hosted
    assert CostModel(flat_profile(2), hosted).send_host_s(1e6) == pytest.approx(5e-5 + 3e-4)  # priced from the cluster
    assert Cluster.from_json(json.dumps(old_file)).message_host == MessageHost()  # written before it was measured
    negative = json.loads(hosted.to_json())
    negative["message_host"]["recv_s"] = -1e-5
    with pytest.raises(UserError, match="message host costs must be finite and >= 0"):
        Cluster.from_json(json.dumps(negative))
    unknown = json.loads(hosted.to_json())
    unknown["message_host"]["send_us"] = 5
    with pytest.raises(UserError, match="malformed cluster JSON"):
        Cluster.from_json(json.dumps(unknown))
    assert cluster.with_ranks(2).n_devices == 2
    with pytest.raises(UserError, match="malformed cluster JSON"):
        Cluster.from_json('{"devices": []')
