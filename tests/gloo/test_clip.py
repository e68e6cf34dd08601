"""Global gradient clipping over pipeline stages equals ``torch.nn.utils.clip_grad_norm_`` on the
whole model in one process: a model's parameters split over 2 and 3 gloo ranks, with a replicated
stage (counted once) and an idle rank (contributing nothing, but taking part in the all-reduce)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from pipetrain.runtime.job.optim import clip_grad_norm_global

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

N_PARAMS = 8  # 4 Linear layers: weight and bias each
MAX_NORMS = (0.5, 1e3)  # one clips, one does not

# Per case: for each rank, the indices of the parameters it holds and how many ranks hold them.
Layout = tuple[tuple[tuple[int, ...], int], ...]
CASES: dict[str, Layout] = {
    "2 stages": (((0, 1, 2, 3), 1), ((4, 5, 6, 7), 1)),
    "3 stages": (((0, 1), 1), ((2, 3, 4, 5), 1), ((6, 7), 1)),
    "stage 1 on 2 replicas": (((0, 1, 2), 1), ((3, 4, 5, 6, 7), 2), ((3, 4, 5, 6, 7), 2)),
    "idle rank 2": (((0, 1, 2, 3, 4), 1), ((5, 6, 7), 1), ((), 1)),
}


def _model() -> nn.Sequential:
    """4 Linear layers with fixed weights and gradients (seeded): 8 parameter tensors."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 9), nn.Linear(9, 7), nn.Linear(7, 5), nn.Linear(5, 3))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    return model


def _reference(max_norm: float) -> tuple[float, list[torch.Tensor]]:
    """The single-process answer: the total norm and every clipped gradient."""
    params = list(_model().parameters())
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    return norm, [p.grad.clone() for p in params if p.grad is not None]


def _rank(rank: int, world_size: int, port: int, cases: list[str], results: Any) -> None:
    """Join the group, then per case and norm clip this rank's share; report norm and gradients."""
    store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=timedelta(seconds=30))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    for case in cases:
        indices, replicas = CASES[case][rank]
        for max_norm in MAX_NORMS:
            params = [p for i, p in enumerate(_model().parameters()) if i in indices]
            norm = clip_grad_norm_global(params, max_norm, world=dist.group.WORLD, replicas=replicas)
            # numpy pickles by value: a tensor would be shared through a file descriptor that
            # vanishes when this rank exits before the parent reads the queue
            grads = {i: p.grad.numpy().copy() for i, p in zip(indices, params, strict=True) if p.grad is not None}
            results.put((case, max_norm, rank, norm, grads))
    dist.barrier()
    dist.destroy_process_group()


def _run(world_size: int, cases: list[str]) -> list[tuple[str, float, int, float, dict[int, np.ndarray]]]:
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, True, wait_for_workers=False)  # type: ignore[attr-defined]
    context = mp.get_context("spawn")
    results = context.Queue()
    procs = [context.Process(target=_rank, args=(r, world_size, store.port, cases, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    out = [results.get(timeout=150) for _ in range(world_size * len(cases) * len(MAX_NORMS))]
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0] * world_size
    return out


@pytest.mark.parametrize(("world_size", "cases"), [(2, ["2 stages"]),
                                                   (3, ["3 stages", "stage 1 on 2 replicas", "idle rank 2"])])
def test_clip_over_ranks_equals_single_process(world_size: int, cases: list[str]) -> None:
    reports = _run(world_size, cases)
    references = {m: _reference(m) for m in MAX_NORMS}
    for case, max_norm, rank, norm, grads in reports:
        torch_norm, torch_grads = references[max_norm]
        assert norm == pytest.approx(torch_norm, rel=1e-6, abs=1e-6), (case, rank)
        for i, grad in grads.items():
            torch.testing.assert_close(torch.from_numpy(grad), torch_grads[i], atol=1e-6, rtol=0,
                                       msg=f"{case}, rank {rank}, p{i}")
    covered: dict[tuple[str, float], set[int]] = {(c, m): set() for c in cases for m in MAX_NORMS}
    for case, max_norm, _, _, grads in reports:
        covered[(case, max_norm)] |= set(grads)
    assert all(c == set(range(N_PARAMS)) for c in covered.values())
    assert references[MAX_NORMS[0]][0] > MAX_NORMS[0] > 0  # the small norm really clips
