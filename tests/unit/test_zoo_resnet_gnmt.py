"""ResNet-50 and GNMT in the zoo: sizes against the papers, shapes, the LSTM, estimates, training."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec, loss_sum
from pipetrain.graph.zoo import build_model
from pipetrain.graph.zoo.lstm import LSTM
from pipetrain.profile.estimate import estimate_profile, trace_kernels
from pipetrain.runtime import TrainConfig, reference_train
from pipetrain.runtime.job.data import make_batch

H, V, T = 1024, 32000, 50  # the gnmt preset


def n_params(graph: LayerGraph) -> int:
    return sum(p.numel() for i in range(len(graph)) for p in graph.build_layer(i, "meta").parameters())


def lstm_params(inputs: int, hidden: int) -> int:
    return 4 * hidden * (inputs + hidden) + 8 * hidden  # weight_ih, weight_hh, two biases


@pytest.mark.parametrize(
    ("name", "names"),
    [
        ("resnet50", ("conv1", *(f"conv{s}_{j}" for s, n in ((2, 3), (3, 4), (4, 6), (5, 3))
                                 for j in range(1, n + 1)), "fc")),
        ("resnet50-32", None),
        ("gnmt", ("embed", *(f"enc{i}" for i in range(8)), *(f"dec{i}" for i in range(8)), "head")),
        ("gnmt-tiny", ("embed", "enc0", "enc1", "enc2", "dec0", "dec1", "dec2", "head")),
    ],
)
def test_layer_names(name: str, names: tuple[str, ...] | None) -> None:
    graph = build_model(name)
    assert graph.name == name
    assert graph.names == (names or build_model("resnet50").names)
    assert len(graph) == (8 if name == "gnmt-tiny" else 18)


def test_resnet50_matches_the_paper() -> None:
    graph = build_model("resnet50")
    assert n_params(graph) == 25_557_032  # the usual "25.6 M"; torchvision's exact count
    specs = graph.output_specs()
    assert specs[0].shape == (64, 56, 56)  # the stem's stride 2 and max-pool
    assert [specs[i].shape for i in (3, 4, 7, 8, 13, 14, 16)] == [
        (256, 56, 56), (512, 28, 28), (512, 28, 28), (1024, 14, 14), (1024, 14, 14), (2048, 7, 7), (2048, 7, 7)
    ]
    assert specs[-1].shape == (1000,)
    assert graph.input == TensorSpec((3, 224, 224))
    assert graph.target == TensorSpec((), "int64", high=1000)
    assert graph.loss is LossKind.CROSS_ENTROPY
    first = graph.build_layer(graph.index("conv3_1"), "meta")
    assert first.shortcut[0].stride == (2, 2) and first.branch[3].stride == (2, 2)  # v1.5: stride on 3×3
    assert isinstance(graph.build_layer(graph.index("conv3_2"), "meta").shortcut, nn.Identity)


def test_resnet_settings_change_the_graph() -> None:
    shallow = build_model("resnet50-32", conv2_blocks=1, conv3_blocks=1, conv4_blocks=2, conv5_blocks=1, width=0.125)
    assert shallow.names == ("conv1", "conv2_1", "conv3_1", "conv4_1", "conv4_2", "conv5_1", "fc")
    assert [s.shape for s in shallow.output_specs()] == [
        (8, 32, 32), (32, 32, 32), (64, 16, 16), (128, 8, 8), (128, 8, 8), (256, 4, 4), (10,)
    ]
    assert build_model("resnet50", image=64).output_specs()[-2].shape == (2048, 2, 2)


def test_gnmt_sizes() -> None:
    graph = build_model("gnmt")
    encoder = 2 * lstm_params(H, H) + lstm_params(2 * H, H) + 6 * lstm_params(H, H)
    attention = 2 * H * H + 2 * H  # W_q, W_k and its bias b, v
    decoder = lstm_params(H, H) + attention + 7 * lstm_params(2 * H, H)
    assert n_params(graph) == V * H + encoder + decoder + H * V + V == 243_967_232
    specs = graph.output_specs()
    assert specs[0].shape == (T, 2 * H)
    assert specs[1].shape == (T, 3 * H)  # two directions and the decoder embeddings
    assert all(s.shape == (T, 2 * H) for s in specs[2:-1])
    assert specs[-1].shape == (T, V)
    assert graph.input == TensorSpec((2, T), "int64", high=V)
    assert graph.target == TensorSpec((T,), "int64", high=V)
    assert graph.loss is LossKind.LM
    residual = [graph.build_layer(i, "meta").residual for i in range(2, 17) if i != 9]  # not enc0, dec0
    assert residual == [False] + [True] * 6 + [False] + [True] * 6  # from the third layer on


def _run_layers(graph: LayerGraph, batch: int) -> list[tuple[int, ...]]:
    """Feed a synthetic batch through every layer on the CPU; each layer's output shape."""
    x = make_batch(graph, batch, 0, 0, "synthetic")[0]
    shapes = []
    for i, spec in enumerate(graph.output_specs()):
        x = graph.build_layer(i)(x)
        assert x.shape == (batch, *spec.shape) and x.dtype == torch.float32
        shapes.append(tuple(x.shape[1:]))
    return shapes


def test_small_presets_run_every_layer_on_cpu() -> None:
    resnet = _run_layers(build_model("resnet50-32"), 3)
    assert resnet[0] == (16, 32, 32)  # CIFAR stem: no downsampling
    assert resnet[1:4] == [(64, 32, 32)] * 3
    assert resnet[16:] == [(512, 4, 4), (10,)]
    gnmt = _run_layers(build_model("gnmt-tiny"), 3)
    assert gnmt == [(16, 128), (16, 192), *[(16, 128)] * 5, (16, 256)]


@pytest.mark.parametrize("reverse", [False, True])
def test_lstm_matches_torch(reverse: bool) -> None:
    ours = LSTM(5, 7, reverse=reverse).double()
    theirs = nn.LSTM(5, 7, batch_first=True).double()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 6, 5, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out = ours(x)
    want = theirs(x_ref.flip(1))[0].flip(1) if reverse else theirs(x_ref)[0]
    torch.testing.assert_close(out, want)
    grad = torch.randn_like(out)
    out.backward(grad)
    want.backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_lstm_fused_kernels_on_cuda_match_the_cpu() -> None:
    cpu = LSTM(16, 32, reverse=True)
    cuda = LSTM(16, 32, reverse=True).cuda()
    cuda.load_state_dict(cpu.state_dict())
    x = torch.randn(4, 9, 16, requires_grad=True)
    x_cuda = x.detach().cuda().requires_grad_()
    out, out_cuda = cpu(x), cuda(x_cuda)
    torch.testing.assert_close(out_cuda.cpu(), out, atol=1e-5, rtol=1e-4)
    out.square().sum().backward()
    out_cuda.square().sum().backward()
    torch.testing.assert_close(x_cuda.grad.cpu(), x.grad, atol=1e-5, rtol=1e-4)
    for p, q in zip(cuda.parameters(), cpu.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-4, rtol=1e-4)


def test_lstm_traces_two_kernels_per_step() -> None:
    with torch.device("meta"):
        lstm = LSTM(64, 64)
    forward, backward = trace_kernels(lstm, torch.empty(2, T, 64, device="meta"))
    assert 2 * T <= len(forward) <= 2 * T + 8  # a GEMM and a fused cell per step
    assert 3 * T - 2 <= len(backward) <= 3 * T + 12  # fused cell backward, GEMM, add per step
    assert sum(k.flops for k in forward) == 2 * 2 * T * 4 * 64 * (64 + 64)
    assert sum(k.flops for k in backward) == pytest.approx(2 * sum(k.flops for k in forward), rel=0.02)


def test_resnet50_estimate_matches_the_paper_flops() -> None:
    profile = estimate_profile(build_model("resnet50"), "v100", batch_size=8)
    # 4.1 G multiply-adds per 224×224 image (v1.5), 2 FLOPs each
    assert sum(layer.flops_per_sample for layer in profile.layers) == pytest.approx(8.2e9, rel=0.1)
    for layer in profile.layers:
        assert all(0 < a <= b for a, b in zip(layer.forward_s, layer.forward_s[1:], strict=False))
    for layer in profile.layers[1:]:  # the stem's forward also copies the images to the device (PCIe)
        assert layer.backward_at(8) > layer.forward_at(8)
    conv2_1 = profile.layers[1]
    assert conv2_1.forward_at(8) > 2 * conv2_1.forward_at(1)  # large activations: time grows with b


def test_gnmt_estimate_counts_the_lstm_flops() -> None:
    graph = build_model("gnmt")
    profile = estimate_profile(graph, "v100", batch_size=8)
    flops = {layer.name: layer.flops_per_sample for layer in profile.layers}
    per_step = 2 * 4 * H  # a multiply-add per gate unit and input or hidden feature
    assert flops["enc0"] == 2 * T * per_step * (H + H)  # two directions
    assert flops["enc1"] == flops["dec1"] == T * per_step * (2 * H + H)
    assert flops["enc2"] == T * per_step * (H + H)
    assert flops["head"] == 2 * T * H * V
    for layer in profile.layers[1:-1]:
        # A recurrence is launch-bound: 8 samples cost little more than one.
        assert layer.forward_at(8) < 1.5 * layer.forward_at(1), layer.name
        assert layer.saved_bytes_per_sample > 0


def test_gnmt_decoder_is_causal_and_sees_the_whole_source() -> None:
    graph = build_model("gnmt-tiny")
    model = graph.build_sequential()
    tokens = make_batch(graph, 2, 0, 0, "synthetic")[0]
    with torch.no_grad():
        logits = model(tokens)
        later_target = tokens.clone()
        later_target[:, 1, 10] = (later_target[:, 1, 10] + 1) % 256
        changed = model(later_target)
        torch.testing.assert_close(changed[:, :10], logits[:, :10])
        assert not torch.allclose(changed[:, 10], logits[:, 10])
        last_source = tokens.clone()
        last_source[:, 0, -1] = (last_source[:, 0, -1] + 1) % 256
        assert not torch.allclose(model(last_source)[:, 0], logits[:, 0])


@pytest.mark.parametrize("name", ["resnet50", "resnet50-32", "gnmt", "gnmt-tiny"])
def test_graphs_pickle_and_rebuild_the_same_weights(name: str) -> None:
    graph = build_model(name, seed=5)
    copy = pickle.loads(pickle.dumps(graph))
    assert copy.fingerprint() == graph.fingerprint()
    if name.endswith(("-32", "-tiny")):  # real weights; the full-size ones only on meta
        for i in range(len(graph)):
            want = graph.build_layer(i).state_dict()
            assert all(torch.equal(v, want[k]) for k, v in copy.build_layer(i).state_dict().items())


@pytest.mark.parametrize("name", ["resnet50-32", "gnmt-tiny"])
def test_training_steps_give_finite_losses_and_every_parameter_a_gradient(name: str) -> None:
    graph = build_model(name)
    result = reference_train(graph, 2, TrainConfig(steps=1, warmup_steps=0, progress=False))
    assert len(result.losses) == 1 and math.isfinite(result.losses[0])
    if name == "gnmt-tiny":  # weights in ±0.04 give near-uniform predictions over the 256 tokens
        assert result.losses[0] == pytest.approx(math.log(256), abs=0.01)
    model = graph.build_sequential()
    x, y = make_batch(graph, 2, 0, 0, "synthetic")
    loss_sum(graph.loss, model(x), y).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and bool(p.grad.abs().max() > 0), pname


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("resnet50", {"stem_stride": 2}, "stem_stride=2 is not a stem"),
        ("resnet50", {"image": 100}, "multiple of 32 and at least 64.*image=96"),
        ("resnet50-32", {"stem_stride": 4}, "image=32 with stem_stride=4.*image=64"),
        ("resnet50", {"conv4_blocks": 0}, "conv4_blocks must be a positive integer"),
        ("gnmt", {"encoder_layers": 1}, "encoder_layers=1 is too few"),
        ("gnmt-tiny", {"layers": 4}, "no setting 'layers'.*decoder_layers"),
    ],
)
def test_bad_settings_are_user_errors(name: str, overrides: dict[str, int], message: str) -> None:
    with pytest.raises(UserError, match=message):
        build_model(name, **overrides)
