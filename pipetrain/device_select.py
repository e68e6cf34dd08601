"""Which device a run computes on, which backend its ranks talk over, and which GPU each rank gets.

    device = resolve_device("auto")                  # "cuda" where torch sees a GPU, else "cpu"
    backend = resolve_backend(device, None)          # "nccl" on cuda, "gloo" on cpu
    check_placement(device, backend, ranks_per_node=2)
    torch_device = rank_device(device, local_rank)   # cuda:{local_rank mod GPUs}, or cpu

``--device auto`` (the default) means CUDA when torch sees a GPU, except with ``--backend gloo``,
which keeps meaning a CPU run as it did before ``--device`` existed (``--device cuda --backend
gloo`` runs gloo on GPUs).

Ranks are pinned to GPUs by their local rank: ``LOCAL_RANK`` under torchrun, the rank itself for
ranks that ``pipetrain train`` spawns on one machine. Rank ``i`` of a machine with ``G`` visible
GPUs computes on ``cuda:(i mod G)``. More ranks than GPUs on a machine is allowed with gloo only:
NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected"), so
:func:`check_placement` stops such a launch with a message naming the fix, before any rank starts.

Gloo on CUDA tensors: gloo's all-reduce and broadcast take CUDA tensors, but its point-to-point
``send``/``recv`` take CPU tensors only, so the transport stages every message through host memory
on that path (:class:`~pipetrain.runtime.interp.transport.Transport`, ``host_staged``). It is the
way to run two ranks on one GPU, and slower than NCCL where each rank has a GPU of its own.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from pipetrain.errors import UserError

__all__ = [
    "BACKENDS",
    "DEVICE_CHOICES",
    "Backend",
    "Device",
    "DeviceChoice",
    "check_backend",
    "check_device_choice",
    "check_placement",
    "rank_device",
    "resolve_backend",
    "resolve_device",
]

DeviceChoice = Literal["auto", "cuda", "cpu"]
"""What the user asks for: ``--device``."""

Device = Literal["cuda", "cpu"]
"""What a run computes on, once ``"auto"`` is resolved."""

Backend = Literal["gloo", "nccl"]
"""The ``torch.distributed`` backend the ranks talk over."""

DEVICE_CHOICES: tuple[DeviceChoice, ...] = get_args(DeviceChoice)
BACKENDS: tuple[Backend, ...] = get_args(Backend)


def check_device_choice(choice: str) -> None:
    """Raises:
        UserError: ``choice`` is not one of :data:`DEVICE_CHOICES`."""
    if choice not in DEVICE_CHOICES:
        raise UserError(f"device {choice!r} is unknown; use 'auto', 'cuda' or 'cpu'")


def check_backend(backend: str | None, choice: DeviceChoice) -> None:
    """Check a backend (None: the device's default) against the device asked for.

    Raises:
        UserError: an unknown backend, or NCCL with ``--device cpu``.
    """
    if backend is not None and backend not in BACKENDS:
        raise UserError(f"backend {backend!r} is unknown; use 'gloo' or 'nccl'")
    if backend == "nccl" and choice == "cpu":
        raise UserError("NCCL runs on GPUs only: use --backend gloo with --device cpu, or --device cuda with NCCL")


def resolve_device(choice: DeviceChoice, backend: Backend | None = None) -> Device:
    """The device of ``choice``: ``"auto"`` is CUDA when torch sees a GPU (and ``backend`` is not
    gloo; see the module docstring), else the CPU.

    Raises:
        UserError: ``"cuda"`` where torch sees no GPU.
    """
    check_device_choice(choice)
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() and backend != "gloo" else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but torch sees no GPU (a CPU build of torch, no driver, or "
                        "CUDA_VISIBLE_DEVICES hides them): use --device cpu, or auto to take a GPU when there is one")
    return choice


def resolve_backend(device: Device, backend: Backend | None) -> Backend:
    """``backend`` as given, or the device's default: NCCL on CUDA, gloo on the CPU.

    Raises:
        UserError: NCCL on the CPU.
    """
    check_backend(backend, device)
    if backend is not None:
        return backend
    return "nccl" if device == "cuda" else "gloo"


def check_placement(device: Device, backend: Backend, ranks_per_node: int) -> None:
    """Check that ``ranks_per_node`` ranks of one machine can run on its GPUs (nothing on the CPU).

    Raises:
        UserError: no GPU visible, or more ranks than GPUs under NCCL (which refuses two ranks on one GPU).
    """
    if device != "cuda":
        return
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise UserError("--device cuda but torch sees no GPU; use --device cpu")
    if backend == "nccl" and ranks_per_node > gpus:
        raise UserError(f"{ranks_per_node} ranks on this machine but {gpus} GPU{'' if gpus == 1 else 's'}: NCCL "
                        "refuses two ranks on one GPU; use --backend gloo to share the GPUs round-robin (messages "
                        "then travel through host memory), fewer stages, or a machine with more GPUs")


def rank_device(device: Device, local_rank: int) -> torch.device:
    """Where the rank with ``local_rank`` on its machine computes: ``cuda:(local_rank mod GPUs)``, or the CPU."""
    if device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())
