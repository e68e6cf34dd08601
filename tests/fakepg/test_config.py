"""Settings, data and bookkeeping that need no process group (level a)."""

from __future__ import annotations

import pytest
import torch

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec
from pipetrain.runtime import FaultInjection, TrainConfig, TrainJob, reference_train, train
from pipetrain.runtime.interp.memory import ActivationMeter
from pipetrain.runtime.job.checks import check_job
from pipetrain.runtime.job.data import make_batch
from pipetrain.runtime.process.spawn import describe_exit

from ..gloo.models import chain_plan, mlp_graph


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 0}, "steps >= 1"),
        ({"steps": 2, "warmup_steps": 2}, "at least one step is timed"),
        ({"optimizer": "lamb"}, "use one of sgd, sgd-momentum, adam"),
        ({"data": "imagenet"}, "use digits, text, synthetic, text:PATH or module.path:callable"),
        ({"backend": "mpi"}, "'gloo' or 'nccl'"),
        ({"lr": 0.0}, "the learning rate must be > 0"),
        ({"optimizer": "adam", "momentum": 0.9}, "--momentum applies to sgd"),
        ({"lr_schedule": "warmup-cosine", "lr_warmup_steps": 0}, "--warmup-steps"),
        ({"clip_grad_norm": 0.0}, "--clip-grad-norm"),
        ({"timeout_s": 0.0}, "timeout_s must be > 0"),
        ({"steps": 3, "fault": FaultInjection(0, 3)}, "past the last step"),
    ],
)
def test_config_rejects(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(UserError, match=match):
        TrainConfig(**kwargs)  # type: ignore[arg-type]


def test_fault_kind_is_checked() -> None:
    with pytest.raises(UserError, match="'raise', 'kill' or 'interrupt'"):
        FaultInjection(0, 0, "explode")  # type: ignore[arg-type]


def test_backend_defaults_to_gloo_without_cuda() -> None:
    expected = "nccl" if torch.cuda.is_available() else "gloo"
    assert TrainConfig().resolved_backend() == expected


def test_synthetic_batches_are_deterministic_per_step_and_seed() -> None:
    graph = mlp_graph()
    x0, y0 = make_batch(graph, 6, 0, 0, "synthetic")
    x0b, y0b = make_batch(graph, 6, 0, 0, "synthetic")
    x1, _ = make_batch(graph, 6, 1, 0, "synthetic")
    xs, _ = make_batch(graph, 6, 0, 1, "synthetic")
    assert torch.equal(x0, x0b) and torch.equal(y0, y0b)
    assert not torch.equal(x0, x1) and not torch.equal(x0, xs)
    assert x0.shape == (6, 8) and x0.dtype == torch.float32
    assert y0.shape == (6,) and y0.dtype == torch.int64 and 0 <= y0.min() and y0.max() < 4


def test_digits_batches() -> None:
    graph = mlp_graph(features=64, classes=10)
    x, y = make_batch(graph, 32, 0, 0, "digits")
    assert x.shape == (32, 64) and y.shape == (32,) and y.max() < 10
    assert abs(float(x.mean())) < 0.5
    epoch_start, _ = make_batch(graph, 32, 1437 // 32, 0, "digits")  # first batch of epoch 1 (1,437 train samples)
    assert not torch.equal(epoch_start, x)
    with pytest.raises(UserError, match="64 features"):
        make_batch(mlp_graph(), 4, 0, 0, "digits")


def test_check_job_rejects_before_launch() -> None:
    graph = mlp_graph()
    plan = chain_plan(graph, 2, 8, 2)
    with pytest.raises(UserError, match="fault rank 5"):
        check_job(TrainJob(graph, plan, TrainConfig(fault=FaultInjection(5, 0))))
    with pytest.raises(UserError, match="64 features"):
        check_job(TrainJob(graph, plan, TrainConfig(data="digits")))
    with pytest.raises(UserError, match="not in the model"):
        train(mlp_graph(n_blocks=3), plan, TrainConfig(progress=False))


def test_describe_exit() -> None:
    assert describe_exit(-9) == "exit code -9 / signal SIGKILL"
    assert describe_exit(1) == "exit code 1"


def test_activation_meter_counts_each_storage_once() -> None:
    weight = torch.randn(4, 4, requires_grad=True)
    meter = ActivationMeter([weight])
    x = torch.randn(3, 4, requires_grad=True)
    with meter.track("a"):
        y = (x @ weight).relu()  # saves x (and the weight, not counted) and the relu output
        z = y * y  # saves y twice: one storage
    expected = x.untyped_storage().nbytes() + y.untyped_storage().nbytes()
    assert meter.live_bytes == meter.peak_bytes == expected
    z.sum().backward()
    meter.release("a")
    assert meter.live_bytes == 0 and meter.peak_bytes == expected


def test_reference_train_timeline_and_losses() -> None:
    graph = LayerGraph.from_layers(
        [("lin", torch.nn.Linear(3, 2))], input=TensorSpec((3,)), target=TensorSpec((2,)), loss=LossKind.MSE
    )
    result = reference_train(graph, 5, TrainConfig(steps=4, lr=0.1, progress=False))
    assert len(result.losses) == 4 and result.losses[-1] < result.losses[0] * 1.5
    assert [str(e.action) for e in result.timeline.events] == ["0F0[0:5]", "0B0[0:5]", "0STEP"]
    assert len(result.timeline.iterations_s) == 3 and result.samples_per_s > 0
    assert set(result.state_dict) == {"lin.weight", "lin.bias"}
