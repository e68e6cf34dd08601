"""Per-stage cost tables by micro-batch size, the input of every UEDP evaluator.

UMPIPE's model (Zhou, Tian, Buyya, Wu, IEEE TPDS 2025, doi:10.1109/TPDS.2024.3515804; pipetrain's
reconstruction, docs/algorithms.md §2.3) times a plan from four per-stage functions of the
micro-batch size ``b``: forward ``f[k](b)``, backward ``g[k](b)`` and the two link sends
``cF[k](b)``, ``cB[k](b)``. :class:`StageTables` holds them as ``[K, B + 1]`` arrays (stage ``k``
of ``K``, sizes ``0 .. B``), with the per-stage step seconds ``[K]``, the backward with a forward
re-run (recompute, docs/algorithms.md §2.6) and, optionally, the split backward's ``B`` and ``W``
(Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024). It also keeps the lookups its readers
want: :attr:`StageTables.chain_costs` (``[2, 3K (B + 1)]``) for the vectorised evaluator
(:mod:`pipetrain.simulate.vectorised`), :attr:`StageTables.rows` and
:attr:`StageTables.split_rows` (Python lists) for the per-micro-batch loops
(:mod:`pipetrain.simulate.loop_time`, :mod:`pipetrain.simulate.chain`).
:meth:`StageTables.from_cost_model` costs every size exactly as the event simulator costs actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from pipetrain.cost import CostModel
from pipetrain.errors import UserError
from pipetrain.plan.plan import Plan

__all__ = ["FloatArray", "StageTables"]

FloatArray = npt.NDArray[np.float64]


def _frozen(values: npt.ArrayLike) -> FloatArray:
    out = np.array(values, dtype=np.float64)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class StageTables:
    """Per-stage cost tables indexed by micro-batch size, in seconds.

    Attributes:
        forward_s: ``f``, ``[K, B + 1]``: forward seconds of stage ``k`` on ``b`` samples.
        backward_s: ``g``, ``[K, B + 1]``: backward seconds (with the forward re-run on a stage that
            recomputes, :attr:`~pipetrain.plan.plan.StagePlan.recompute`).
        send_forward_s: ``cF``, ``[K, B + 1]``: seconds to send ``b`` samples' activations on the
            link ``k -> k + 1`` (row ``K - 1`` is unused).
        send_backward_s: ``cB``, ``[K, B + 1]``: seconds to send ``b`` samples' input gradients on
            the link ``k -> k - 1`` (row 0 is unused).
        step_s: ``[K]``: the optimizer step after the last backward; empty means zeros.
        backward_recompute_s: ``g`` of a stage that recomputes, ``[K, B + 1]``: backward plus the
            forward re-run; used where a plan's backward partition differs from its forward one.
            Empty means the same as ``backward_s`` (recompute costs nothing: the paper's model).
        backward_input_s: ``B`` of a split backward (method ``zb1``; Qi et al., "Zero Bubble
            Pipeline Parallelism", ICLR 2024), ``[K, B + 1]``: the input-gradient seconds (with the
            forward re-run on a stage that recomputes).
        weight_grad_s: ``W`` of a split backward, ``[K, B + 1]``: the weight-gradient seconds.
            Give both or neither; empty (the default) means the tables cannot time a split backward.

    Column 0 (size 0) is never read; :meth:`from_cost_model` sets it to 0. Arrays are copied and
    made read-only.
    """

    forward_s: FloatArray
    backward_s: FloatArray
    send_forward_s: FloatArray
    send_backward_s: FloatArray
    step_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    backward_recompute_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    backward_input_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    weight_grad_s: FloatArray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if not np.size(self.backward_recompute_s):
            object.__setattr__(self, "backward_recompute_s", self.backward_s)
        split = ("backward_input_s", "weight_grad_s")
        if bool(np.size(self.backward_input_s)) != bool(np.size(self.weight_grad_s)):
            raise ValueError("give both backward_input_s and weight_grad_s (a split backward), or neither")
        names = ("forward_s", "backward_s", "send_forward_s", "send_backward_s", "backward_recompute_s",
                 *(split if np.size(self.backward_input_s) else ()))
        tables = {name: _frozen(getattr(self, name)) for name in names}
        shape = tables["forward_s"].shape
        if len(shape) != 2 or shape[0] < 1 or shape[1] < 2:
            raise ValueError(f"forward_s must have shape [K >= 1, B + 1 >= 2], got {shape}")
        for name, table in tables.items():
            if table.shape != shape:
                raise ValueError(f"{name} has shape {table.shape}; every table must be {shape}")
            if not (np.all(np.isfinite(table)) and np.all(table >= 0.0)):
                raise ValueError(f"{name} must hold finite, non-negative seconds")
            object.__setattr__(self, name, table)
        step = _frozen(self.step_s) if np.size(self.step_s) else _frozen(np.zeros(shape[0]))
        if step.shape != (shape[0],) or not np.all(np.isfinite(step)):
            raise ValueError(f"step_s must hold {shape[0]} finite seconds, got shape {step.shape}")
        object.__setattr__(self, "step_s", step)

    @property
    def n_stages(self) -> int:
        return int(self.forward_s.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.forward_s.shape[1]) - 1

    @cached_property
    def recompute_costs(self) -> bool:
        """Whether any stage's recompute table differs from its plain backward table."""
        return not np.array_equal(self.backward_s, self.backward_recompute_s)

    @cached_property
    def chain_costs(self) -> FloatArray:
        """``[2, 3K (B + 1)]``, the vectorised evaluator's lookup: row 0 holds the compute seconds
        ``f``, ``g`` and ``g`` with recompute, row 1 the matching link seconds ``cF``, ``cB``, ``cB``,
        each as ``K`` rows of ``B + 1`` sizes, flattened (``cut_layout._Layout.code`` indexes them)."""
        compute = np.concatenate((self.forward_s, self.backward_s, self.backward_recompute_s))
        link = np.concatenate((self.send_forward_s, self.send_backward_s, self.send_backward_s))
        return np.stack((compute.reshape(-1), link.reshape(-1)))

    @cached_property
    def rows(self) -> tuple[list[list[float]], ...]:
        """The tables as Python lists, for the per-micro-batch loop of
        :func:`~pipetrain.simulate.loop_time.iteration_time`."""
        tables = (self.forward_s, self.backward_s, self.send_forward_s, self.send_backward_s,
                  self.backward_recompute_s)
        return tuple([[float(v) for v in row] for row in table] for table in tables)

    @cached_property
    def split_rows(self) -> tuple[list[list[float]], list[list[float]]]:
        """``B`` and ``W`` of a split backward as Python lists, ``[K][B + 1]`` each.

        Raises:
            ValueError: the tables have no split-backward costs.
        """
        if not np.size(self.weight_grad_s):
            raise ValueError("these tables cannot time a split backward (method zb1): build them with "
                             "StageTables.from_cost_model, or give backward_input_s and weight_grad_s")
        b_in, w = ([[float(v) for v in row] for row in table] for table in (self.backward_input_s, self.weight_grad_s))
        return b_in, w

    @classmethod
    def from_cost_model(
        cls,
        cost: CostModel,
        stages: Sequence[Sequence[str]],
        ranks: Sequence[int],
        batch: int,
        recompute: Sequence[bool] = (),
    ) -> StageTables:
        """Cost every size ``0..batch`` exactly as the event simulator costs actions, the split
        backward's ``B`` and ``W`` included.

        The step seconds include the all-reduce of tied parameters' gradients on each rank's first
        stage (:meth:`~pipetrain.cost.CostModel.tied_allreduce_s`), and the clipping norm's over ``ranks``
        when the cost model clips (:meth:`~pipetrain.cost.CostModel.clip_allreduce_s`).

        Args:
            cost: the cost model (its per-action overhead is part of ``f`` and ``g``).
            stages: each stage's layer names, in pipeline order.
            ranks: the rank that runs each stage.
            batch: samples per mini-batch ``B``.
            recompute: per stage, include the forward re-run in ``g`` and in a split backward's ``B``
                (the stage's :attr:`~pipetrain.plan.plan.StagePlan.recompute`); empty: none does.
                ``backward_recompute_s`` includes it in any case.
        """
        n = len(stages)
        if len(ranks) != n:
            raise ValueError(f"{n} stages but {len(ranks)} ranks; give one rank per stage")
        recomputes = list(recompute) or [False] * n
        if len(recomputes) != n:
            raise ValueError(f"{n} stages but {len(recomputes)} recompute flags; give one per stage")
        sizes = range(batch + 1)
        f, g, g_rc, c_f, c_b, b_in, w = (np.zeros((n, batch + 1)) for _ in range(7))
        for k, (layers, rank, again) in enumerate(zip(stages, ranks, recomputes, strict=True)):
            f[k] = cost.forward_table(layers, batch, rank)
            b_in[k, 1:] = [cost.backward_input_s(tuple(layers), b, rank, again) for b in sizes[1:]]
            w[k, 1:] = [cost.weight_grad_s(tuple(layers), b, rank) for b in sizes[1:]]
            g_rc[k] = cost.backward_table(layers, batch, rank, True)
            g[k] = g_rc[k] if again else cost.backward_table(layers, batch, rank, False)
            if k + 1 < n:
                c_f[k, 1:] = [cost.transfer_s(cost.output_bytes(layers, b), rank, ranks[k + 1]) for b in sizes[1:]]
            if k > 0:
                c_b[k, 1:] = [cost.transfer_s(cost.input_bytes(layers, b), rank, ranks[k - 1]) for b in sizes[1:]]
        step = np.array([cost.step_s(layers, rank) for layers, rank in zip(stages, ranks, strict=True)])
        held = [(layers, (rank,)) for layers, rank in zip(stages, ranks, strict=True)]
        clip = cost.clip_allreduce_s(sorted(set(ranks)))
        for rank in set(ranks):  # the tied copies' and the norm's all-reduces, at the rank's first STEP (as events)
            step[list(ranks).index(rank)] += cost.tied_allreduce_s(held, rank) + clip
        return cls(f, g, c_f, c_b, step, g_rc, b_in, w)

    @classmethod
    def from_plan(cls, plan: Plan, cost: CostModel) -> StageTables:
        """Tables for a chain plan's stages, ranks, batch and stages' ``recompute`` (one rank per stage)."""
        replicated = [k for k, s in enumerate(plan.stages) if len(s.ranks) != 1]
        if replicated:
            raise UserError(f"stage {replicated[0]} runs on several ranks; uedp plans need one rank per stage")
        return cls.from_cost_model(
            cost, [s.layers for s in plan.stages], [s.ranks[0] for s in plan.stages], plan.batch_size,
            [s.recompute for s in plan.stages],
        )
