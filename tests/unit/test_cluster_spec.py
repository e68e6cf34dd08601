"""Cluster spec files: examples, rank and node numbering, link units, kinds, errors, per-kind profiles."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import pytest

from pipetrain import api
from pipetrain.cluster import DEVICE_MODELS, Cluster, GiB, Link, MessageHost, device_model
from pipetrain.cluster_spec import ClusterSpec, ProfileSource, load_cluster_spec, parse_cluster_spec
from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph
from pipetrain.graph.zoo import build_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "clusters"
# example file -> (devices, nodes, kinds)
EXPECTED = {
    "2x4-v100.yaml": (8, 2, {"v100"}),
    "4x4-v100.yaml": (16, 4, {"v100"}),
    "2h100-2v100.yaml": (4, 2, {"h100", "v100"}),
    "v100-fpga.yaml": (4, 2, {"v100", "fpga"}),
    "pipedream-a.yaml": (16, 4, {"v100"}),
    "pipedream-b.yaml": (16, 2, {"v100"}),
    "8x8-a100.yaml": (64, 8, {"a100"}),
    "64x8-a100.yaml": (512, 64, {"a100"}),
}
LINKS = "links: {intra_node: {latency_us: 5, bandwidth_gb_per_s: 150}, inter_node: {latency_s: 0.001, " \
        "bandwidth_gbit_per_s: 25}}\n"


def spec(groups: str, links: str = LINKS) -> ClusterSpec:
    return parse_cluster_spec(f"groups:\n{groups}{links}")


@functools.cache
def mlp() -> LayerGraph:
    return build_model("mlp", n_layers=2)


def test_examples_are_all_tested() -> None:
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_loads_and_round_trips_through_json(name: str, tmp_path: Path) -> None:
    n_devices, n_nodes, kinds = EXPECTED[name]
    loaded = load_cluster_spec(EXAMPLES / name)
    cluster = loaded.cluster
    assert cluster.name == name.removesuffix(".yaml")
    assert cluster.n_devices == n_devices and len({d.node for d in cluster.devices}) == n_nodes
    assert set(loaded.profiles) == kinds == {d.kind for d in cluster.devices}
    assert Cluster.from_json(cluster.to_json()) == cluster
    cluster.save(tmp_path / "cluster.json")
    assert api.load_cluster(tmp_path / "cluster.json") == cluster == api.load_cluster(EXAMPLES / name)


def test_ranks_fill_nodes_group_by_group() -> None:
    loaded = spec("  - {device: v100, count: 4, per_node: 2}\n  - {device: h100, count: 3, per_node: 1}\n")
    devices = loaded.cluster.devices
    assert [d.node for d in devices] == [0, 0, 1, 1, 2, 3, 4]
    assert [d.kind for d in devices] == ["v100"] * 4 + ["h100"] * 3
    cluster = loaded.cluster
    assert cluster.link(0, 1) is cluster.intra_node and cluster.link(1, 2) is cluster.inter_node
    assert cluster.link(3, 4) is cluster.inter_node  # groups never share a node


def test_link_units() -> None:
    cluster = spec("  - {device: v100, count: 2, per_node: 1}\n").cluster
    assert cluster.intra_node == Link(latency_s=5e-6, bandwidth_bytes_per_s=150e9)
    assert cluster.inter_node == Link(latency_s=1e-3, bandwidth_bytes_per_s=25e9 / 8)
    assert cluster.inter_node.transfer_s(3.125e9) == pytest.approx(1.001)


def test_defaults_and_optional_fields() -> None:
    one_node = "links:\n  intra_node: {latency_s: 0, bandwidth_gbit_per_s: 8}\n"
    cluster = spec("  - {device: A100, count: 3}\n", one_node).cluster
    assert [d.node for d in cluster.devices] == [0, 0, 0]  # per_node defaults to the whole group
    assert cluster.devices[0] == replace(cluster.devices[0], kind="a100", memory_bytes=80 * GiB, speed=1.0)
    assert cluster.inter_node == cluster.intra_node == Link(0.0, 1e9)
    assert cluster.name == "cluster" and cluster.action_overhead_s == 0.0
    text = "name: small\naction_overhead_us: 250\ngroups:\n  - {device: cpu, count: 1, memory_gib: 0.5, speed: 0.8}\n"
    cluster = parse_cluster_spec(text + one_node).cluster
    assert cluster.name == "small" and cluster.action_overhead_s == pytest.approx(2.5e-4)
    assert (cluster.devices[0].memory_bytes, cluster.devices[0].speed) == (GiB // 2, 0.8)


def test_message_host_costs_are_given_in_their_units() -> None:
    one_node = "links:\n  intra_node: {latency_s: 0, bandwidth_gbit_per_s: 8}\n"
    groups = "groups:\n  - {device: cpu, count: 2}\n"
    assert parse_cluster_spec(groups + one_node).cluster.message_host == MessageHost()  # none given: free
    text = groups + one_node + "message_host: {send_us: 30, recv_us: 20, send_ns_per_byte: 0.5}\n"
    host = parse_cluster_spec(text).cluster.message_host
    assert (host.send_s, host.recv_s, host.send_per_byte_s, host.recv_per_byte_s) == pytest.approx(
        (3e-5, 2e-5, 5e-10, 0.0))
    with pytest.raises(UserError, match=r"message_host.recv_us must be a number >= 0, got -1"):
        parse_cluster_spec(groups + one_node + "message_host: {recv_us: -1}\n")
    with pytest.raises(UserError, match=r"send_ms"):
        parse_cluster_spec(groups + one_node + "message_host: {send_ms: 1}\n")


def test_yaml_anchors_share_group_settings() -> None:
    groups = "  - &server {device: v100, count: 4, per_node: 4}\n  - {<<: *server, name: b, count: 8, speed: 0.5}\n"
    devices = spec(groups).cluster.devices
    assert [(d.kind, d.node, d.speed) for d in devices[3:5]] == [("v100", 0, 1.0), ("v100#b", 1, 0.5)]
    assert devices[-1].node == 2


def test_heterogeneous_example_keeps_kinds_and_memory() -> None:
    loaded = load_cluster_spec(EXAMPLES / "2h100-2v100.yaml")
    devices = loaded.cluster.devices
    assert [(d.kind, d.node, d.memory_bytes // GiB) for d in devices] == [
        ("h100", 0, 80), ("h100", 0, 80), ("v100", 1, 16), ("v100", 1, 16)]
    assert loaded.profiles == {"h100": ProfileSource("h100"), "v100": ProfileSource("v100")}


def test_fpga_device_model_is_an_hbm_card() -> None:
    fpga = DEVICE_MODELS["fpga"]
    assert fpga.memory_bytes == 8 * GiB
    assert fpga.peak_flops < DEVICE_MODELS["v100"].peak_flops
    assert fpga.saturation_flops < DEVICE_MODELS["v100"].saturation_flops  # full at small work
    mixed = load_cluster_spec(EXAMPLES / "v100-fpga.yaml")
    assert [d.kind for d in mixed.cluster.devices] == ["v100"] * 2 + ["fpga"] * 2
    cost = CostModel(api.cluster_profiles(mlp(), mixed, batch_size=8), mixed.cluster)
    layers = tuple(mlp().names)
    assert cost.forward_s(layers, 8, 2) > cost.forward_s(layers, 8, 0)  # the FPGA (rank 2) is the slower


def test_named_group_is_a_kind_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "v100.json").write_text("{}")
    groups = "  - {device: v100, count: 2}\n  - {device: v100, name: pcie-16g, count: 2, memory_gib: 16, " \
             "profile: v100.json}\n  - {device: v100, count: 1}\n"
    loaded = parse_cluster_spec(f"groups:\n{groups}{LINKS}", base_dir=tmp_path)
    assert [d.kind for d in loaded.cluster.devices] == ["v100", "v100", "v100#pcie-16g", "v100#pcie-16g", "v100"]
    assert loaded.profiles == {"v100": ProfileSource("v100"),
                               "v100#pcie-16g": ProfileSource("v100", tmp_path / "v100.json")}
    assert device_model("v100#pcie-16g") is DEVICE_MODELS["v100"]


def test_groups_of_one_kind_must_be_identical() -> None:
    with pytest.raises(UserError, match=r"groups\[1\] and groups\[0\] are both of kind 'v100' but differ in "
                                        r"memory_gib, speed; .* give groups\[1\] a name"):
        spec("  - {device: v100, count: 2}\n  - {device: v100, count: 2, memory_gib: 16, speed: 0.9}\n")


ONE = "  - {device: v100, count: 2}\n"
ERRORS = {
    "missing field": ("groups:\n  - {device: v100}\n" + LINKS, r"groups\[0\]\.count is missing: give the number"),
    "missing links": ("groups:\n" + ONE, r"^links is missing"),
    "unknown key": ("groups:\n  - {device: v100, cont: 4}\n" + LINKS,
                    r"groups\[0\]\.cont is not a known key; groups\[0\] takes device, name, count"),
    "unknown top key": ("group:\n" + ONE + LINKS, r"^group is not a known key; the spec takes name, groups"),
    "unknown link key": ("groups:\n" + ONE + "links: {intra_node: {latency_us: 1, bandwith_gb_per_s: 1}}",
                         r"links\.intra_node\.bandwith_gb_per_s is not a known key"),
    "bad type": ("groups:\n  - {device: v100, count: '8'}\n" + LINKS,
                 r"groups\[0\]\.count must be a whole number >= 1, got '8'"),
    "boolean number": ("groups:\n  - {device: v100, count: 1, memory_gib: true}\n" + LINKS,
                       r"groups\[0\]\.memory_gib must be a number > 0, got True"),
    "negative count": ("groups:\n" + ONE + "  - {device: h100, count: -2}\n" + LINKS,
                       r"groups\[1\]\.count must be a whole number >= 1, got -2"),
    "unknown device model": ("groups:\n  - {device: v200, count: 1}\n" + LINKS,
                             r"groups\[0\]\.device must be a device model \(cpu, v100, a100, h100, fpga\), got 'v200'"),
    "both bandwidth keys": ("groups:\n" + ONE + "links: {intra_node: {latency_us: 1, bandwidth_gb_per_s: 1, "
                            "bandwidth_gbit_per_s: 8}}", r"links\.intra_node needs exactly one of "
                            r"bandwidth_gb_per_s or bandwidth_gbit_per_s, got both"),
    "no latency": ("groups:\n" + ONE + "links: {intra_node: {bandwidth_gb_per_s: 1}}",
                   r"links\.intra_node needs exactly one of latency_us or latency_s, got neither"),
    "negative latency": ("groups:\n" + ONE + "links: {intra_node: {latency_us: -1, bandwidth_gb_per_s: 1}}",
                         r"links\.intra_node\.latency_us must be a number >= 0, got -1"),
    "zero bandwidth": ("groups:\n" + ONE + "links: {intra_node: {latency_us: 1, bandwidth_gbit_per_s: 0}}",
                       r"links\.intra_node\.bandwidth_gbit_per_s must be a number > 0, got 0"),
    "per_node not dividing count": ("groups:\n  - {device: v100, count: 8, per_node: 3}\n" + LINKS,
                                    r"groups\[0\]\.per_node \(3\) must divide groups\[0\]\.count \(8\)"),
    "no inter-node link": ("groups:\n  - {device: v100, count: 4, per_node: 2}\n"
                           "links: {intra_node: {latency_us: 1, bandwidth_gb_per_s: 1}}",
                           r"links\.inter_node is missing: the cluster spans 2 nodes"),
    "no groups": ("groups: []\n" + LINKS, r"groups must be a non-empty list of device groups, got \[\]"),
    "not a mapping": ("- v100\n", r"the spec must be a mapping with keys name, groups, links"),
    "empty file": ("", r"the spec must be a mapping .* got None"),
    "bad group name": ("groups:\n  - {device: v100, count: 1, name: 'a#b'}\n" + LINKS,
                       r"groups\[0\]\.name must be a label of letters, digits"),
    "missing profile file": ("groups:\n  - {device: v100, count: 1, profile: nowhere.json}\n" + LINKS,
                             r"groups\[0\]\.profile: no file at nowhere\.json"),
    "key given twice": ("groups:\n  - device: v100\n    count: 1\n    count: 2\n" + LINKS,
                        r"line 4: key 'count' is given twice"),
    "invalid yaml": ("groups: [\n", r"not valid YAML"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_spec_errors_name_the_field(case: str) -> None:
    text, message = ERRORS[case]
    with pytest.raises(UserError, match=message):
        parse_cluster_spec(text)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - {device: v100, count: 0}\n" + LINKS)
    with pytest.raises(UserError, match=rf"^{bad}: groups\[0\]\.count must be"):
        load_cluster_spec(bad)
    with pytest.raises(UserError, match=r"must end in \.yaml or \.yml .* or \.json"):
        api.load_cluster(tmp_path / "cluster.toml")
    with pytest.raises(UserError, match="no cluster spec at"):
        api.load_cluster(tmp_path / "missing.yaml")


def test_n_ranks_cuts_a_spec_and_copies_a_probe(tmp_path: Path) -> None:
    first = load_cluster_spec(EXAMPLES / "2h100-2v100.yaml", n_ranks=2)
    assert [d.kind for d in first.cluster.devices] == ["h100", "h100"] and set(first.profiles) == {"h100"}
    assert load_cluster_spec(EXAMPLES / "2h100-2v100.yaml", n_ranks=4).cluster.name == "2h100-2v100"
    with pytest.raises(UserError, match="5 ranks asked of cluster '2h100-2v100', which has 4 devices"):
        api.load_cluster(EXAMPLES / "2h100-2v100.yaml", n_ranks=5)
    Cluster.local(2).save(tmp_path / "probe.json")
    assert api.load_cluster(tmp_path / "probe.json", n_ranks=3) == Cluster.local(2).with_ranks(3)


def test_cluster_profiles_one_per_kind_for_the_cost_model() -> None:
    loaded = load_cluster_spec(EXAMPLES / "2h100-2v100.yaml")
    profiles = api.cluster_profiles(mlp(), loaded, batch_size=8)
    assert {kind: p.device for kind, p in profiles.items()} == {"h100": "h100", "v100": "v100"}
    cost = CostModel(profiles, loaded.cluster)
    layers = tuple(mlp().names)
    assert cost.forward_s(layers, 8, 0) < cost.forward_s(layers, 8, 2)  # rank 0 is an H100, rank 2 a V100
    assert cost.step_s(layers, 0) < cost.step_s(layers, 2)  # memory-bound estimate: H100 bandwidth


def test_cluster_profiles_reads_measured_files_and_shares_estimates(tmp_path: Path) -> None:
    measured = replace(api.profile_model(mlp(), 8, estimate="cpu"), source="measured on a test machine")
    measured.save(tmp_path / "v100.json")
    groups = "  - {device: v100, count: 1}\n  - {device: v100, name: measured, count: 1, profile: v100.json}\n" \
             "  - {device: v100, name: slow, count: 1, speed: 0.5}\n"
    loaded = parse_cluster_spec(f"groups:\n{groups}{LINKS}", base_dir=tmp_path)
    profiles = api.cluster_profiles(mlp(), loaded, batch_size=8)
    assert profiles["v100#measured"] == measured
    assert profiles["v100"] is profiles["v100#slow"] and profiles["v100"].device == "v100"  # estimated once
    cost = CostModel(profiles, loaded.cluster)
    assert cost.step_s(tuple(mlp().names), 2) > 0  # a named kind resolves to its device model


def test_cluster_profiles_refuses_a_profile_of_another_model(tmp_path: Path) -> None:
    api.profile_model(build_model("mlp", n_layers=3), 8, estimate="v100").save(tmp_path / "other.json")
    loaded = parse_cluster_spec(f"groups:\n  - {{device: v100, count: 1, profile: other.json}}\n{LINKS}",
                                base_dir=tmp_path)
    with pytest.raises(UserError, match=r"other\.json is a profile of 'mlp' \(fingerprint \w+\), not of this 'mlp'"):
        api.cluster_profiles(mlp(), loaded, batch_size=8)


def test_cluster_profiles_given_profile_replaces_estimates() -> None:
    given = replace(api.profile_model(mlp(), 8, estimate="cpu"), source="measured here")
    homogeneous = load_cluster_spec(EXAMPLES / "2x4-v100.yaml")
    assert api.cluster_profiles(mlp(), homogeneous, 8, profile=given) == {"v100": given}
    assert api.cluster_profiles(mlp(), Cluster.local(2), 8, profile=given) == {"cpu": given}
    with pytest.raises(UserError, match=r"one profile cannot describe device kinds \['h100', 'v100'\]"):
        api.cluster_profiles(mlp(), load_cluster_spec(EXAMPLES / "2h100-2v100.yaml"), 8, profile=given)
    other = api.profile_model(build_model("mlp", n_layers=3), 8, estimate="cpu")
    with pytest.raises(UserError, match=r"the given profile is a profile of 'mlp' \(fingerprint \w+\), "
                                        r"not of this 'mlp' \(\w+\): another model"):
        api.cluster_profiles(mlp(), homogeneous, 8, profile=other)


def test_estimating_a_device_plans_for_a_cluster_of_that_device() -> None:
    from pipetrain import api

    cluster, assumed = api.estimated_cluster("v100", 12)
    assert {d.kind for d in cluster.devices} == {"v100"} and cluster.n_devices == 12
    assert [d.node for d in cluster.devices] == [0] * 8 + [1] * 4
    assert cluster.link(0, 1).bandwidth_bytes_per_s == 45e9 and cluster.link(0, 8).bandwidth_bytes_per_s < 45e9
    assert "assumed links" in assumed and "--cluster" in assumed
    local, _ = api.estimated_cluster("cpu", 2)
    assert {d.kind for d in local.devices} == {"cpu"}


def test_a_huge_device_count_is_refused_before_building_it() -> None:
    """Found by the CLI property tests: `count: 10000000000` built ten billion devices (16 GB and rising)."""
    text = ("groups:\n  - {device: v100, count: 10000000000}\n"
            "links:\n  intra_node: {latency_us: 10, bandwidth_gb_per_s: 45}\n"
            "  inter_node: {latency_us: 20, bandwidth_gbit_per_s: 25}\n")
    with pytest.raises(UserError, match="10000000000 devices, more than pipetrain plans for; give at most 65536"):
        parse_cluster_spec(text)
