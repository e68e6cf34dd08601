"""--device and --backend: which device, backend and GPU each rank gets, with torch.cuda faked."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from pipetrain.device_select import Backend, Device, check_placement, rank_device, resolve_backend, resolve_device
from pipetrain.errors import UserError
from pipetrain.runtime import TrainConfig

See = Callable[[int], None]


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> See:
    """Pretend torch sees ``n`` GPUs: ``gpus(n)``."""

    def see(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return see


@pytest.mark.parametrize(("n", "backend", "expected"), [(0, None, "cpu"), (2, None, "cuda"), (2, "gloo", "cpu"),
                                                        (2, "nccl", "cuda")])
def test_auto_is_cuda_when_a_gpu_is_visible_unless_gloo(gpus: See, n: int, backend: Backend | None,
                                                          expected: str) -> None:
    gpus(n)
    assert resolve_device("auto", backend) == expected


def test_cuda_without_a_gpu_names_the_fix(gpus: See) -> None:
    gpus(0)
    with pytest.raises(UserError, match="--device cpu"):
        resolve_device("cuda")
    assert resolve_device("cpu") == "cpu"


@pytest.mark.parametrize(("device", "backend", "expected"), [("cuda", None, "nccl"), ("cpu", None, "gloo"),
                                                             ("cuda", "gloo", "gloo"), ("cuda", "nccl", "nccl")])
def test_backend_defaults_to_the_device(device: Device, backend: Backend | None, expected: str) -> None:
    assert resolve_backend(device, backend) == expected


def test_nccl_on_the_cpu_is_refused() -> None:
    with pytest.raises(UserError, match="NCCL runs on GPUs only"):
        resolve_backend("cpu", "nccl")
    with pytest.raises(UserError, match="NCCL runs on GPUs only"):
        TrainConfig(device="cpu", backend="nccl")
    with pytest.raises(UserError, match="'auto', 'cuda' or 'cpu'"):
        TrainConfig(device="tpu")  # type: ignore[arg-type]


def test_ranks_are_pinned_round_robin_by_local_rank(gpus: See) -> None:
    gpus(2)
    assert [rank_device("cuda", r) for r in range(5)] == [torch.device("cuda", i) for i in (0, 1, 0, 1, 0)]
    assert rank_device("cpu", 3) == torch.device("cpu")


def test_nccl_refuses_more_ranks_than_gpus_gloo_shares_them(gpus: See) -> None:
    gpus(1)
    check_placement("cuda", "nccl", 1)
    check_placement("cuda", "gloo", 4)
    check_placement("cpu", "gloo", 64)
    with pytest.raises(UserError, match="NCCL refuses two ranks on one GPU; use --backend gloo"):
        check_placement("cuda", "nccl", 2)
    gpus(0)
    with pytest.raises(UserError, match="sees no GPU"):
        check_placement("cuda", "gloo", 1)


def test_config_resolves_device_and_backend(gpus: See) -> None:
    gpus(1)
    assert (TrainConfig().resolved_device(), TrainConfig().resolved_backend()) == ("cuda", "nccl")
    assert TrainConfig(backend="gloo").resolved_device() == "cpu"
    assert TrainConfig(device="cuda", backend="gloo").resolved_backend() == "gloo"
    gpus(0)
    assert (TrainConfig().resolved_device(), TrainConfig().resolved_backend()) == ("cpu", "gloo")


def test_train_refuses_nccl_on_a_shared_gpu_before_starting_ranks(gpus: See) -> None:
    from pipetrain.graph.zoo import build_model
    from pipetrain.plan.methods import Method
    from pipetrain.plan.plan import Plan, StagePlan
    from pipetrain.runtime import train

    gpus(1)
    graph = build_model("mlp-digits")
    stages = (StagePlan(graph.names[:2], (0,), (4, 4), (4, 4)), StagePlan(graph.names[2:], (1,), (4, 4), (4, 4)))
    plan = Plan(graph.name, graph.fingerprint(), 8, Method.GPIPE, stages)
    with pytest.raises(UserError, match="2 ranks on this machine but 1 GPU: NCCL refuses"):
        train(graph, plan, TrainConfig(steps=2, progress=False, device="cuda"))


def test_torchrun_checks_the_machine_s_ranks_against_its_gpus(gpus: See, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipetrain.runtime.process.torchrun import _check_gpu

    gpus(2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    _check_gpu(TrainConfig(device="cuda"), 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(UserError, match="4 ranks on this machine but 2 GPUs"):
        _check_gpu(TrainConfig(device="cuda"), 0)
    _check_gpu(TrainConfig(device="cuda", backend="gloo"), 3)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(UserError, match="3 ranks on this machine"):  # without it: at least LOCAL_RANK + 1
        _check_gpu(TrainConfig(), 2)


def test_cli_takes_device_and_backend() -> None:
    from pipetrain.cli.main import build_parser

    parser = build_parser()
    args = parser.parse_args(["train", "--device", "cuda", "--backend", "gloo"])
    assert (args.device, args.backend) == ("cuda", "gloo")
    assert parser.parse_args(["profile"]).device == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--device", "tpu"])
