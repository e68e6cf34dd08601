"""CANDLE-Uno: feature-encoding branches of feed-forward layers, concatenated, then a regressor (a DAG).

CANDLE Uno (the ECP-CANDLE pilot 1 model) predicts a tumour's growth under a drug (dose response) from several
feature sets (cell-line gene expression, drug descriptors, fingerprints), each encoded by its own
feed-forward tower; the towers are concatenated and dense layers regress the response. GraphPipe
(App. A.2; docs/algorithms.md §5) uses 7 branches × 4 FF layers of hidden 4096 and sweeps the
branch count up to 16, which ``branches`` sets. The paper does not give the input widths or the
layers after the merge; ours: ``features`` inputs per branch, ``top`` FF layers of ``hidden`` after
the merge and a one-value regression head (Uno's growth), scored with ``LossKind.MSE``. With ``B``
branches of ``L`` layers, ``F`` features and ``H`` hidden::

    b{i}_ff0       x[:, i·F:(i+1)·F] → ReLU(Linear(F → H))      [b, B·F] → [b, H]
    b{i}_ff{j}     ReLU(Linear(H → H)), j = 1 … L−1                      → [b, H]
    concat         the B branches' last layers                           → [b, B·H]
    top0           ReLU(Linear(B·H → H)); top{k}: ReLU(Linear(H → H))    → [b, H]
    head           Linear(H → outputs)                                   → [b, outputs]

Layers are ordered branch by branch, then ``concat``, ``top0 …``, ``head``: ``B·L + top + 2``
layers, 33 for ``candle-uno``. ``candle-uno-tiny`` has 4 branches of 4 layers with F = 16, H = 32.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pipetrain.graph.layer_graph import LayerGraph, LossKind, TensorSpec
from pipetrain.graph.zoo.branches import FF, Concat, DagBuilder

__all__ = ["CandleUnoConfig", "build"]


@dataclass(frozen=True)
class CandleUnoConfig:
    """Sizes of a CANDLE-Uno.

    Attributes:
        branches: feature-encoding towers, B (the paper: 7, swept up to 16).
        layers: FF layers per tower, L.
        features: input features per tower, F (the input is ``[B·F]``).
        hidden: width of every FF layer, H.
        top: FF layers after the merge.
        outputs: regression targets per sample.
    """

    branches: int = 7
    layers: int = 4
    features: int = 1024
    hidden: int = 4096
    top: int = 3
    outputs: int = 1


def build(config: CandleUnoConfig, name: str, seed: int) -> LayerGraph:
    """The LayerGraph of ``config``: B towers ``b{i}_ff0 …``, ``concat``, ``top0 …``, ``head``."""
    c = config
    dag = DagBuilder()
    ends = dag.ff_towers("b", c.branches, c.features, c.hidden, c.layers)
    merged = dag.add("concat", Concat, ends)
    widths = [c.branches * c.hidden] + [c.hidden] * (c.top - 1)
    last = dag.chain("top", [functools.partial(FF, w, c.hidden) for w in widths], after=merged)
    dag.add("head", functools.partial(FF, c.hidden, c.outputs, False), (last,))
    return dag.graph(
        name,
        input=TensorSpec((c.branches * c.features,)),
        target=TensorSpec((c.outputs,)),
        loss=LossKind.MSE,
        seed=seed,
    )
