"""LayerGraph: a model as named layers and the tensors between them (docs/architecture.md §2).

A layer is a *picklable factory* that builds its module, so every rank can build exactly the layers
of its own stage with the same initial weights as an unpipelined reference: layer ``i`` is always
built under the seed ``graph.seed * 100_003 + i``. Models form a chain unless ``edges`` makes them
a DAG (branches, as GraphPipe partitions them; :mod:`pipetrain.graph.dataflow` runs any set of
layers of either).

The DAG contract: ``layers`` are in a topological order and every edge goes from an earlier layer to
a later one; the last layer is the only sink (its output goes to the loss); a layer without
incoming edges (a *source*) is called on the model input, any other as ``module(*inputs)`` with its
inputs in the order its incoming edges appear in ``edges``; every layer returns one tensor.

Shapes are per sample: an input spec ``(3, 32, 32)`` means tensors of shape ``[b, 3, 32, 32]`` for a
micro-batch of ``b`` samples.
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import pairwise
from typing import TypeVar

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.graph.ties import Tie, find_ties, retie

__all__ = ["Field", "Layer", "LayerGraph", "LossKind", "TensorSpec", "loss_sum"]

_DTYPES = {"float32": torch.float32, "int64": torch.int64, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "bool": torch.bool, "int32": torch.int32}


@dataclass(frozen=True)
class Field:
    """One keyword input of a model that takes several (``input_ids [T] int64``), per sample."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "int64"

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one sample's tensor.

    Attributes:
        shape: per-sample shape (without the batch dimension).
        dtype: ``"float32"`` or ``"int64"``.
        high: for integer tensors, values are drawn from ``[0, high)``.
        fields: for a model of several keyword inputs (Hugging Face: ``input_ids``, ``attention_mask``),
            their names, shapes and dtypes, in the order :func:`pipetrain.graph.packing.pack` lays them
            into the one ``[b, *shape]`` tensor this spec describes; empty for a model of one tensor.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None
    fields: tuple[Field, ...] = ()

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def bytes_per_sample(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.torch_dtype).element_size()

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorSpec:
        """The per-sample spec of a batched tensor ``[b, *shape]``."""
        return cls(tuple(tensor.shape[1:]), str(tensor.dtype).removeprefix("torch."))


class LossKind(str, Enum):
    """How the last stage turns outputs and targets into a loss."""

    CROSS_ENTROPY = "cross_entropy"  # output [b, C], target [b] int64
    LM = "lm"  # output [b, T, V], target [b, T] int64; per-sample loss = mean over T
    MSE = "mse"  # output and target of equal shape; per-sample loss = mean over elements
    CAUSAL_LM = "causal_lm"  # output [b, T, V], target [b, T] int64 = the inputs (Hugging Face ``labels``):
    # position t predicts target t + 1; targets of -100 are ignored; per-sample loss = mean over the rest


def loss_sum(kind: LossKind, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum over samples of each sample's loss (the runtime divides by the batch size once).

    Summing rather than averaging per micro-batch is what makes pipelined gradients equal the
    unpipelined ones for any micro-batching, equal or not (docs/algorithms.md §2.6, docs/architecture.md §5.2).
    """
    if kind is LossKind.CROSS_ENTROPY:
        return nn.functional.cross_entropy(output, target, reduction="sum")
    if kind is LossKind.LM:
        per_token = nn.functional.cross_entropy(
            output.flatten(0, 1), target.flatten(), reduction="none"
        )
        return per_token.view(target.shape).mean(dim=1).sum()
    if kind is LossKind.CAUSAL_LM:
        return _next_token_sum(output, target)
    per_elem = nn.functional.mse_loss(output, target, reduction="none")
    return per_elem.reshape(len(per_elem), -1).mean(dim=1).sum()  # a scalar target per sample too: [b]


IGNORED = -100
"""A target that no loss counts (Hugging Face's ``ignore_index``: padding, prompts)."""


def _next_token_sum(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum over samples of the mean next-token cross-entropy of each: the loss a Hugging Face causal
    LM computes from ``labels`` (its own ``loss`` when every sample counts as many targets)."""
    logits, following = output[:, :-1], target[:, 1:]
    per_token = nn.functional.cross_entropy(logits.flatten(0, 1).float(), following.flatten(), reduction="none",
                                            ignore_index=IGNORED).view(following.shape)
    counted = (following != IGNORED).sum(dim=1).clamp(min=1)
    return (per_token.sum(dim=1) / counted).sum()


class _Copy:
    """A picklable factory that returns a deep copy of a given module."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self) -> nn.Module:
        return copy.deepcopy(self.module)


@dataclass(frozen=True)
class Layer:
    """A named layer.

    Attributes:
        name: unique within the graph.
        build: picklable zero-argument factory (a class, a ``functools.partial``, or ``_Copy``).
        prefix: what turns a name in the built module's ``state_dict`` into the model's own name:
            None means ``"{name}."`` (a child of a Sequential); ``""`` means the built module
            already uses the model's names (a layer captured with torch.fx).
    """

    name: str
    build: Callable[[], nn.Module]
    prefix: str | None = None

    def qualified(self, local: str) -> str:
        """The model's name for ``local``, a key of the built module's ``state_dict``.

        >>> Layer("block0", nn.Linear).qualified("0.weight")
        'block0.0.weight'
        """
        return f"{self.name}.{local}" if self.prefix is None else f"{self.prefix}{local}"


@dataclass(frozen=True)
class LayerGraph:
    """Layers and the edges between them; a chain unless ``edges`` says otherwise.

    Attributes:
        name: the model's name (a zoo name or the user's label).
        layers: in a valid execution order.
        input: spec of one input sample (fed to the first layer).
        target: spec of one target sample (for the loss at the last layer).
        loss: the loss kind.
        seed: base seed for layer initialisation.
        edges: ``(src, dst)`` layer-name pairs; empty means the chain ``layers[0] -> layers[1] ...``;
            otherwise a DAG under the contract of the module docstring.
        ties: the tensors several layers hold (tied weights, :mod:`pipetrain.graph.ties`): each
            layer builds its own copy, which a module of several layers makes one again.
        module: for a model captured from an ``nn.Module`` (:func:`pipetrain.graph.capture.capture`),
            a picklable factory of a copy of it; see :meth:`build_module`.
    """

    name: str
    layers: tuple[Layer, ...]
    input: TensorSpec
    target: TensorSpec
    loss: LossKind = LossKind.CROSS_ENTROPY
    seed: int = 0
    edges: tuple[tuple[str, str], ...] = field(default=())
    ties: tuple[Tie, ...] = field(default=())
    module: Callable[[], nn.Module] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.layers:
            raise UserError(f"model {self.name!r} has no layers; give at least one")
        names = [layer.name for layer in self.layers]
        if len(set(names)) != len(names):
            raise UserError(f"model {self.name!r} has duplicate layer names; make them unique")
        if self.edges:
            self._check_dag(names)
        strangers = [layer for tie in self.ties for layer in tie.layers if layer not in names]
        if strangers or any(len(tie.layers) < 2 for tie in self.ties):
            raise UserError(f"model {self.name!r}: a tie names layers {strangers[:3] or 'fewer than 2'}; list each "
                            "tied tensor with the two or more layers of the model that hold it")

    def _check_dag(self, names: list[str]) -> None:
        """The DAG contract (module docstring), with the first broken rule named."""
        where = {name: i for i, name in enumerate(names)}
        edges = [tuple(edge) for edge in self.edges]
        bad = [e for e in edges if len(e) != 2 or e[0] not in where or e[1] not in where]
        if bad:
            raise UserError(f"model {self.name!r}: edges {bad[:3]} name layers the model does not have; "
                            "give (src, dst) pairs of its layer names")
        backward = [e for e in edges if where[e[0]] >= where[e[1]]]
        if backward or len(set(edges)) != len(edges):
            shown = backward[:3] or [e for e in edges if edges.count(e) > 1][:1]
            raise UserError(f"model {self.name!r}: edges {shown} go backward or repeat; list the layers in a "
                            "topological order and each edge once")
        has_successor = {src for src, _ in edges}
        sinks = [name for name in names[:-1] if name not in has_successor]
        if sinks or names[-1] in has_successor:
            found = sinks or [names[-1] + " with successors"]
            raise UserError(f"model {self.name!r}: the last layer must be the only one without successors "
                            f"(found {found}); merge the branches into the last layer")

    # ---- builders ----------------------------------------------------------------------------

    @classmethod
    def from_sequential(
        cls,
        model: nn.Sequential,
        *,
        input: TensorSpec,
        target: TensorSpec,
        loss: LossKind = LossKind.CROSS_ENTROPY,
        name: str = "sequential",
        seed: int = 0,
    ) -> LayerGraph:
        """One layer per child of ``model``; each rank gets a copy of the given weights (children
        sharing a tensor are tied, :mod:`pipetrain.graph.ties`)."""
        if not isinstance(model, nn.Sequential):
            raise UserError("from_sequential needs an nn.Sequential; wrap your layers in one")
        layers = tuple(Layer(n, _Copy(m)) for n, m in model.named_children())
        ties = find_ties([(layer, m) for layer, m in zip(layers, model.children(), strict=True)])
        return cls(name, layers, input, target, loss, seed, ties=ties)

    @classmethod
    def from_layers(
        cls,
        layers: Sequence[tuple[str, nn.Module | Callable[[], nn.Module]]],
        *,
        input: TensorSpec,
        target: TensorSpec,
        loss: LossKind = LossKind.CROSS_ENTROPY,
        name: str = "layers",
        seed: int = 0,
    ) -> LayerGraph:
        """From ``(name, module or picklable factory)`` pairs, in execution order. Modules sharing a
        tensor are tied (:mod:`pipetrain.graph.ties`); factories are not looked into (each builds its own)."""
        built = tuple(
            Layer(n, _Copy(m) if isinstance(m, nn.Module) else m) for n, m in layers
        )
        given = [(layer, m) for layer, (_, m) in zip(built, layers, strict=True) if isinstance(m, nn.Module)]
        return cls(name, built, input, target, loss, seed, ties=find_ties(given))

    # ---- queries -----------------------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise UserError(f"model {self.name!r} has no layer {name!r}") from None

    @property
    def is_chain(self) -> bool:
        """Whether the layers form the chain ``layers[0] -> layers[1] -> ...`` (edges empty or exactly it)."""
        return not self.edges or sorted(tuple(e) for e in self.edges) == list(pairwise(self.names))

    def predecessors(self, i: int) -> tuple[int, ...]:
        """Indices of layer ``i``'s inputs, in call order; ``()`` for a source layer (it takes the model input)."""
        if not self.edges:
            return (i - 1,) if i > 0 else ()
        name = self.layers[i].name
        return tuple(self.index(src) for src, dst in self.edges if dst == name)

    def successors(self, i: int) -> tuple[int, ...]:
        """Indices of the layers that read layer ``i``'s output (``()`` for the last layer)."""
        if not self.edges:
            return (i + 1,) if i + 1 < len(self) else ()
        name = self.layers[i].name
        return tuple(sorted(self.index(dst) for src, dst in self.edges if src == name))

    def layers_named(self, names: Sequence[str]) -> tuple[Layer, ...]:
        """The layers called ``names``, in that order (e.g. a stage's)."""
        return tuple(self.layers[self.index(name)] for name in names)

    def build_layer(self, i: int, device: torch.device | str | None = None) -> nn.Module:
        """Build layer ``i`` with its deterministic initial weights."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 100_003 + i)
            if device is not None and torch.device(device).type == "meta":
                # Factories build on meta for free; copies of existing modules are moved there.
                with torch.device("meta"):
                    return self.layers[i].build().to("meta")
            module = self.layers[i].build()
        return module.to(device) if device is not None else module

    def build_sequential(self, indices: Sequence[int] | None = None) -> nn.Sequential:
        """The (sub)model as one ``nn.Sequential``: the unpipelined reference of a chain (a DAG's
        layers are wired by :class:`pipetrain.graph.dataflow.StageModule`, whose children are the same).

        Raises:
            UserError: the model is a DAG (build its stages with ``pipetrain.graph.dataflow``).
        """
        if not self.is_chain:
            raise UserError(f"model {self.name!r} branches, so its layers are not a Sequential; build them with "
                            "pipetrain.graph.dataflow.chain_stage or whole_model")
        chosen = range(len(self)) if indices is None else indices
        return self.tied(nn.Sequential(*(self.build_layer(i) for i in chosen)), chosen)

    def tied(self, module: M, indices: Sequence[int]) -> M:
        """``module``, whose children are the layers ``indices`` built one by one, with the copies of
        each tied tensor made one (:func:`~pipetrain.graph.ties.retie`); returns it."""
        retie([(self.layers[i], child) for i, child in zip(indices, module.children(), strict=True)], self.ties)
        return module

    def build_module(self) -> nn.Module:
        """The whole model as one module whose ``state_dict`` keys are the pipeline's names
        (:meth:`Layer.qualified`) and whose forward is the model's: a copy of the captured module,
        else ``nn.Sequential`` of the layers by name (a DAG: the layers by name, wired by its edges).
        Checkpoints load into it with ``strict=True``.

        Raises:
            UserError: a layer name with a dot, or a layer with its own prefix, in a graph that
                was not captured (no module keeps those names).
        """
        if self.module is not None:
            return self.module()
        odd = [layer.name for layer in self.layers if "." in layer.name or layer.prefix is not None]
        if odd:
            raise UserError(f"model {self.name!r} cannot be built as one module: layer names {odd} have dots or "
                            "their own prefix; rename the layers, or capture the model from its nn.Module")
        if not self.is_chain:
            from pipetrain.graph.dataflow import MODEL_INPUT, StageModule  # dataflow builds on this module

            every = range(len(self))
            return StageModule(self, every, [(MODEL_INPUT,)], [(len(self) - 1,)], names=self.names)
        whole = nn.Sequential(OrderedDict((layer.name, self.build_layer(i)) for i, layer in enumerate(self.layers)))
        return self.tied(whole, range(len(self)))

    def output_specs(self) -> tuple[TensorSpec, ...]:
        """Per-sample output spec of every layer, found by a forward pass on the meta device (of 2
        samples: batch normalisation refuses 1 in training mode)."""
        x = torch.empty((2, *self.input.shape), dtype=self.input.torch_dtype, device="meta")
        outputs: list[torch.Tensor] = []
        for i in range(len(self)):
            args = [outputs[j] for j in self.predecessors(i)] or [x]
            with torch.no_grad():
                outputs.append(self.build_layer(i, device="meta")(*args))
        return tuple(TensorSpec.of(y) for y in outputs)

    def input_specs(self, i: int) -> tuple[TensorSpec, ...]:
        """Per-sample specs of layer ``i``'s inputs, in call order (the model input for a source layer)."""
        specs = self.output_specs()
        return tuple(specs[j] for j in self.predecessors(i)) or (self.input,)

    def fingerprint(self) -> str:
        """A short hash of the input spec, layer names, parameters (model's names, shapes) and ties;
        plans and profiles record it.

        The name is left out: the same layers built under another name (a zoo name, a
        ``module:callable`` reference, a label) are the same model to a plan.
        """
        digest = hashlib.sha256(f"{self.input.shape}{self.input.dtype}".encode())
        if not self.is_chain:
            digest.update(repr(sorted(tuple(e) for e in self.edges)).encode())
        if self.ties:
            digest.update(repr(self.ties).encode())
        for i, layer in enumerate(self.layers):
            digest.update(layer.name.encode())
            for pname, p in self.build_layer(i, device="meta").named_parameters():
                digest.update(f"{layer.qualified(pname)}{tuple(p.shape)}".encode())
        return digest.hexdigest()[:16]
