"""DLRM: dense feed-forward towers and sparse embedding bags, concatenated, then FF (a DAG).

After Naumov et al., "Deep Learning Recommendation Model for Personalization and Recommendation
Systems" (2019), as GraphPipe configures it (App. A.2; docs/algorithms.md §5): 7 dense
branches of 4 FF layers (hidden 4096) and 7 sparse branches (embedding bags of 100 indices into
tables of dimension 64), concatenated, then FF 4096. Differences, chosen for pipetrain: the
feature interaction is the concatenation (as the paper describes it, not DLRM's pairwise dot
products); the click is scored as 2 logits with ``LossKind.CROSS_ENTROPY`` (DLRM: one logit and
binary cross-entropy, the same model); tables have ``rows = 10_000`` by default, so the model builds
on a CPU (the paper's 1M-row tables: ``rows=1_000_000``, 1.8 GB of tables, fine on the meta device).

**The input is one float tensor** ``[D·F + S·bag]``: the D dense towers' ``F`` features each, then
the S bags' ``bag`` indices each, *stored as floats* (exact up to 2²⁴ rows) so the model input is
one tensor of one dtype, as the runtime sends it. The embedding layer casts them back:
``floor(x).long() mod rows``; the modulo keeps any float valid, so the synthetic data (normal
floats) and profiling run the model too. With ``H`` hidden and ``E`` the embedding dimension::

    d{i}_ff0     x[:, i·F:(i+1)·F] → ReLU(Linear(F → H))                   [b, D·F + S·bag] → [b, H]
    d{i}_ff{j}   ReLU(Linear(H → H)), j = 1 … L−1                                           → [b, H]
    s{i}_bag     EmbeddingBag(rows, E, sum) of its ``bag`` indices                          → [b, E]
    concat       the dense towers, then the bags                                          → [b, D·H + S·E]
    top0 …       ReLU(Linear(· → H)), ``top`` of them                                        → [b, H]
    head         Linear(H → 2)                                                             → [b, 2]

A sparse branch is one layer (a bag is one lookup, as in the paper), so a stage holds whole bags;
dense towers split anywhere. Layers are ordered dense towers, bags, ``concat``,
``top0 …``, ``head``: ``D·L + S + top + 2`` layers, 40 for ``dlrm``. ``dlrm-tiny``: 2 towers of 3
layers with F = 8, H = 32 and 2 bags of 4 indices into 50 rows of dimension 8.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec
from pipetrain.graph.zoo.branches import FF, Concat, DagBuilder

__all__ = ["DLRMConfig", "SparseBag", "build"]

EXACT_FLOAT_INDEX = 2**24  # float32 represents every integer up to this exactly


@dataclass(frozen=True)
class DLRMConfig:
    """Sizes of a DLRM.

    Attributes:
        dense: dense FF towers, D.
        layers: FF layers per dense tower, L.
        features: dense input features per tower, F.
        hidden: width of the FF layers, H.
        sparse: embedding-bag branches, S.
        bag: indices per bag (summed).
        dim: embedding dimension, E.
        rows: rows per embedding table (at most 2²⁴: indices travel as float32).
        top: FF layers after the merge.
    """

    dense: int = 7
    layers: int = 4
    features: int = 13
    hidden: int = 4096
    sparse: int = 7
    bag: int = 100
    dim: int = 64
    rows: int = 10_000
    top: int = 3

    def __post_init__(self) -> None:
        if self.rows > EXACT_FLOAT_INDEX:
            raise UserError(f"dlrm: rows={self.rows} is more than float32 indices can address "
                            f"exactly ({EXACT_FLOAT_INDEX}); choose fewer rows")


class SparseBag(nn.Module):
    """A sparse branch: its ``bag`` indices ``x[:, start:start+bag]`` of the model input ``[b, n]``
    (floats, cast to ``floor(x).long() mod rows``), summed from an embedding table: → ``[b, E]``.
    The table starts from U(±√(1/rows)), as in DLRM."""

    def __init__(self, start: int, bag: int, rows: int, dim: int) -> None:
        super().__init__()
        self.start, self.bag, self.rows = start, bag, rows
        self.table = nn.EmbeddingBag(rows, dim, mode="sum")
        bound = (1.0 / rows) ** 0.5
        nn.init.uniform_(self.table.weight, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        indices = x[:, self.start : self.start + self.bag].detach().floor().long().remainder(self.rows)
        out: torch.Tensor = self.table(indices)
        return out


def build(config: DLRMConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: towers ``d{i}_ff0 …``, bags ``s{i}_bag``, ``concat``, ``top0 …``, ``head``."""
    c = config
    dag = DagBuilder()
    ends = dag.ff_towers("d", c.dense, c.features, c.hidden, c.layers)
    offset = c.dense * c.features
    for i in range(c.sparse):
        ends.append(dag.add(f"s{i}_bag", functools.partial(SparseBag, offset + i * c.bag, c.bag, c.rows, c.dim)))
    merged = dag.add("concat", Concat, ends)
    widths = [c.dense * c.hidden + c.sparse * c.dim] + [c.hidden] * (c.top - 1)
    last = dag.chain("top", [functools.partial(FF, w, c.hidden) for w in widths], after=merged)
    dag.add("head", functools.partial(FF, c.hidden, 2, False), (last,))
    return dag.graph(
        name,
        input=TensorSpec((offset + c.sparse * c.bag,)),
        target=TensorSpec((), "int64", high=2),
        loss=LossKind.CROSS_ENTROPY,
        seed=seed,
    )
