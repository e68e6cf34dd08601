"""Profile: per-layer costs as a function of micro-batch size (docs/architecture.md §2).

Forward and backward seconds are stored on a grid of micro-batch sizes (powers of two up to the
batch, plus the batch) and interpolated piecewise-linearly in between; beyond the grid they are
extrapolated from the last two points. Measured and estimated profiles have this same type, so the
planner cannot tell them apart except by ``source``.

A split backward (method ``zb1``; Qi et al. 2024, "Zero Bubble Pipeline Parallelism") needs the
backward's two parts. A measured profile times them as the runtime runs them: ``input_grad_s`` (B)
and ``weight_grad_s`` (W), per grid size; together they may cost more than ``backward_s`` (the price
of splitting on that device). A profile with ``weight_grad_s`` alone (an estimated one, or one
written before ``input_grad_s`` existed) holds W as a part of the backward, at most all of it, and
B is the rest. A profile with neither splits each layer with parameters at
:data:`DEFAULT_WEIGHT_GRAD_SHARE` of its backward (a matmul's input and weight gradients cost the
same FLOPs), and gives a layer without parameters no W.

Between a micro-batch's B and its W a stage keeps the gradients of its parameter owners' outputs:
``held_grad_bytes_per_sample`` per layer, measured or estimated like the saved bytes (0 for a layer
without parameters, and in a profile written before the field existed).

A profile is at one numeric ``precision`` (:mod:`pipetrain.profile.precision`): ``fp32``, or mixed
``bf16``/``fp16``, whose times are the layers' under ``torch.autocast`` (measured) or at the
device's tensor-core peak (estimated), and whose activation bytes (output, saved, held gradients)
are in the compute dtype: a floating-point output is a message of half its float32 bytes. The
parameter bytes stay float32 (the master copy); ``cast_weight_bytes`` are the casts of them to the
compute dtype that autocast makes and autograd keeps from a micro-batch's forward to its backward
(per micro-batch, not per sample; 0 at fp32). It is written to the JSON only when mixed, so
profiles written before the field existed read as fp32. A plan is costed only with profiles at its
own precision (:meth:`Profile.check_precision`).

A measured profile says how steady its timings were and how loaded the machine was
(``noise``, :class:`~pipetrain.profile.noise.ProfileNoise`); estimated profiles, and files written
before the field existed, have none.

A layer's optimizer step is its own per optimizer (:mod:`pipetrain.profile.optimizer_step`):
``step_s`` is SGD's (the field predates the others), ``optimizer_step_s`` the other optimizers' by
name, and ``clip_s`` its share of clipping the gradient norm; a measured profile holds all of them.
One written before the others were measured (``step_s`` alone) prices them as SGD's scaled by their
memory passes (:meth:`LayerProfile.step_for`), and an estimated one holds none: the cost model prices
them from the parameter bytes (:meth:`pipetrain.cost.CostModel.step_s`).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from pipetrain.errors import UserError
from pipetrain.fileio import write_atomic
from pipetrain.profile.noise import ProfileNoise
from pipetrain.profile.optimizer_step import CLIP_PASSES, OPTIMIZER_NAMES, STEP_PASSES, OptimizerName, scaled_from_sgd
from pipetrain.profile.precision import Precision, parse_precision

__all__ = ["DEFAULT_WEIGHT_GRAD_SHARE", "LayerProfile", "Profile", "TiedBytes", "interpolate"]

DEFAULT_WEIGHT_GRAD_SHARE = 0.5
"""The weight-gradient share of a layer's backward when its profile does not say (module docstring)."""


def interpolate(sizes: tuple[int, ...], values: tuple[float, ...], b: float) -> float:
    """Piecewise-linear ``values`` over ``sizes`` at ``b``, extrapolated linearly at both ends.

    Results are clamped at 0 so extrapolation never predicts negative time.
    """
    if len(sizes) == 1:
        return values[0] * b / sizes[0]
    i = bisect.bisect_left(sizes, b)
    i = min(max(i, 1), len(sizes) - 1)
    x0, x1, y0, y1 = sizes[i - 1], sizes[i], values[i - 1], values[i]
    return max(0.0, y0 + (y1 - y0) * (b - x0) / (x1 - x0))


def _check_layer(i: int, layer: LayerProfile) -> None:
    """A profile file's layer: a grid of increasing sizes >= 1, one finite time >= 0 per size, bytes >= 0."""
    where = f"layers[{i}] ({layer.name!r})"
    sizes = layer.sizes
    if not sizes or sizes[0] < 1 or any(a >= b for a, b in pairwise(sizes)):
        raise UserError(f"profile JSON {where}: sizes {list(sizes)} must be increasing micro-batch sizes >= 1; "
                        "re-create it with `pipetrain profile`")
    for field in ("forward_s", "backward_s", "weight_grad_s", "input_grad_s"):
        values = getattr(layer, field)
        if values is None:
            continue
        if len(values) != len(sizes) or not all(0 <= v < math.inf for v in values):
            raise UserError(f"profile JSON {where}: {field} needs one finite number of seconds >= 0 per size "
                            f"({len(sizes)}), got {list(values)}; re-create it with `pipetrain profile`")
    for field in ("output_bytes_per_sample", "saved_bytes_per_sample", "parameter_bytes",
                  "saved_input_bytes_per_sample", "saved_output_bytes_per_sample", "held_grad_bytes_per_sample",
                  "cast_weight_bytes"):
        if getattr(layer, field) < 0:
            raise UserError(f"profile JSON {where}: {field} is {getattr(layer, field)}; give 0 or more bytes")
    steps = [layer.step_s, layer.clip_s, *layer.optimizer_step_s.values()]
    if not 0 <= layer.flops_per_sample < math.inf or not all(s is None or 0 <= s < math.inf for s in steps):
        raise UserError(f"profile JSON {where}: flops_per_sample, step_s, clip_s and optimizer_step_s must be "
                        "finite and >= 0; re-create it with `pipetrain profile`")
    others = [name for name in OPTIMIZER_NAMES if name != "sgd"]
    if not set(layer.optimizer_step_s) <= set(others):
        raise UserError(f"profile JSON {where}: optimizer_step_s names {sorted(layer.optimizer_step_s)}; it holds "
                        f"the steps of {', '.join(others)} (SGD's is step_s)")


def _optional_times(layer: dict[str, Any], field: str) -> tuple[float, ...] | None:
    return None if layer.get(field) is None else tuple(float(v) for v in layer[field])


def _optional_seconds(layer: dict[str, Any], field: str) -> float | None:
    return None if layer.get(field) is None else float(layer[field])


@dataclass(frozen=True)
class LayerProfile:
    """One layer's costs.

    Attributes:
        name: the layer's name in the LayerGraph.
        sizes: micro-batch sizes of the grid, increasing.
        forward_s: forward seconds at each grid size.
        backward_s: backward seconds at each grid size (input and weight gradients).
        output_bytes_per_sample: bytes of the layer's output per sample (what a stage boundary sends).
        saved_bytes_per_sample: bytes autograd keeps per sample between forward and backward.
        parameter_bytes: bytes of the layer's parameters.
        flops_per_sample: forward FLOPs per sample.
        step_s: seconds of an SGD step over the layer's parameters, if measured.
        saved_input_bytes_per_sample: of the saved bytes, those of the layer's input (0: not saved).
        saved_output_bytes_per_sample: of the saved bytes, those of the layer's output (0: not saved).
        weight_grad_s: seconds of the weight gradients (the split backward's W) at each grid size;
            None: the default split (module docstring).
        input_grad_s: seconds of the split backward's B at each grid size, as measured beside W;
            None: B is the backward minus W (module docstring).
        held_grad_bytes_per_sample: bytes per sample a split backward's B keeps until its W: the
            gradients of the layer's parameter owners' outputs (0: none, or not recorded).
        cast_weight_bytes: under mixed precision, bytes of the compute-dtype casts of the layer's
            parameters that autograd keeps from a micro-batch's forward to its backward, whatever
            its size (module docstring; 0 at fp32).
        optimizer_step_s: seconds of the other optimizers' steps over the layer's parameters, by
            name (``sgd-momentum``, ``adam``, ``adamw``), as measured; empty: not measured.
        clip_s: seconds of the layer's share of clipping the gradient norm (the norm of its gradients
            and their scaling), if measured.
    """

    name: str
    sizes: tuple[int, ...]
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    output_bytes_per_sample: int
    saved_bytes_per_sample: int
    parameter_bytes: int
    flops_per_sample: float
    step_s: float | None = None
    saved_input_bytes_per_sample: int = 0
    saved_output_bytes_per_sample: int = 0
    weight_grad_s: tuple[float, ...] | None = None
    input_grad_s: tuple[float, ...] | None = None
    held_grad_bytes_per_sample: int = 0
    cast_weight_bytes: int = 0
    optimizer_step_s: dict[OptimizerName, float] = dataclasses.field(default_factory=dict, hash=False)
    clip_s: float | None = None

    def step_for(self, optimizer: OptimizerName) -> float | None:
        """Seconds of ``optimizer``'s step over the layer's parameters: as measured, else (a profile
        with SGD's alone) SGD's scaled by the optimizers' memory passes; None when nothing was measured."""
        if optimizer == "sgd":
            return self.step_s
        measured = self.optimizer_step_s.get(optimizer)
        if measured is not None or self.step_s is None:
            return measured
        return scaled_from_sgd(self.step_s, STEP_PASSES[optimizer])

    def clip_for(self) -> float | None:
        """Seconds of the layer's share of clipping the gradient norm: as measured, else from SGD's
        step scaled by the passes (None when nothing was measured; module docstring)."""
        if self.clip_s is not None or self.step_s is None:
            return self.clip_s
        return scaled_from_sgd(self.step_s, CLIP_PASSES)

    def forward_at(self, b: float) -> float:
        return interpolate(self.sizes, self.forward_s, b)

    def backward_at(self, b: float) -> float:
        return interpolate(self.sizes, self.backward_s, b)

    def weight_grad_at(self, b: float) -> float:
        """Seconds of the weight-gradient part (W) of the backward on ``b`` samples, at most the backward."""
        whole = self.backward_at(b)
        if self.weight_grad_s is None:
            return DEFAULT_WEIGHT_GRAD_SHARE * whole if self.parameter_bytes > 0 else 0.0
        w = interpolate(self.sizes, self.weight_grad_s, b)
        return w if self.input_grad_s is not None else min(whole, w)

    def input_grad_at(self, b: float) -> float:
        """Seconds of the input-gradient part (B) of the backward on ``b`` samples: as measured, or
        the rest of the backward."""
        if self.input_grad_s is not None:
            return interpolate(self.sizes, self.input_grad_s, b)
        return self.backward_at(b) - self.weight_grad_at(b)


@dataclass(frozen=True)
class TiedBytes:
    """A parameter that several layers hold (tied weights, :mod:`pipetrain.graph.ties`): each layer's
    ``parameter_bytes`` counts it, a stage holding several of them keeps one copy, and the stages
    holding it sum its gradients with an all-reduce before their step.

    Attributes:
        layers: the layers holding it (two or more).
        parameter_bytes: its bytes.
    """

    layers: tuple[str, ...]
    parameter_bytes: int


@dataclass(frozen=True)
class Profile:
    """A model's per-layer costs on one device.

    Attributes:
        model: the model's name.
        fingerprint: ``LayerGraph.fingerprint()`` of the profiled model.
        device: the device the costs are for (``"cpu"``, ``"v100"``, ...).
        source: ``"measured"`` or ``"estimated"``, with details (threads, repeats).
        input_bytes_per_sample: bytes of one input sample (what stage 0 reads).
        layers: one entry per layer, in graph order.
        loss_saved_bytes_per_sample: what the loss adds to the last layer's saved bytes (its input
            only where the last layer does not already save its output).
        edges: the model's layer edges when it is a DAG (``LayerGraph.edges``); empty for a chain.
            They say which outputs cross a stage boundary (:meth:`cut_bytes_per_sample`,
            :meth:`edge_bytes_per_sample`).
        ties: the tied parameters (``LayerGraph.ties``'s parameters, with their bytes).
        precision: the precision the costs are for (module docstring); ``"fp32"`` by default.
        noise: how steady a measured profile's timings were (module docstring); None: not measured.
    """

    model: str
    fingerprint: str
    device: str
    source: str
    input_bytes_per_sample: int
    layers: tuple[LayerProfile, ...]
    loss_saved_bytes_per_sample: int = 0
    edges: tuple[tuple[str, str], ...] = ()
    ties: tuple[TiedBytes, ...] = ()
    precision: Precision = "fp32"
    noise: ProfileNoise | None = None

    def check_precision(self, precision: Precision, what: str = "the profile") -> Profile:
        """``self`` when it is at ``precision``; else a UserError saying how to get one that is.

        Times and activation bytes differ between precisions, so a plan at one precision is never
        costed with another's profile (module docstring)."""
        if self.precision != precision:
            raise UserError(f"{what} of {self.model!r} is at {self.precision} but the plan is at {precision}: "
                            f"profile at {precision} (`pipetrain profile --precision {precision}`, or "
                            f"--estimate DEVICE --precision {precision}), or plan at {self.precision}")
        return self

    def layer(self, name: str) -> LayerProfile:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise UserError(f"the profile of {self.model!r} has no layer {name!r}; re-profile this model")

    def saved_bytes_per_sample(self, names: Sequence[str]) -> int:
        """Bytes per sample a stage of the consecutive layers ``names`` keeps for backward.

        The layers' saved bytes, with a tensor saved on both sides of a boundary inside the stage
        (one layer's output that the next layer saves as its input, e.g. ReLU then Linear) counted
        once, plus the loss's on the stage that ends with the last layer.
        """
        layers = [self.layer(n) for n in names]
        shared = sum(
            min(a.saved_output_bytes_per_sample, b.saved_input_bytes_per_sample) for a, b in pairwise(layers)
        )
        loss = self.loss_saved_bytes_per_sample if names[-1] == self.layers[-1].name else 0
        return sum(lp.saved_bytes_per_sample for lp in layers) - shared + loss

    def cast_weight_bytes(self, names: Sequence[str]) -> int:
        """Bytes a micro-batch of a stage of the layers ``names`` keeps of its weights' compute-dtype
        casts (module docstring), the sum over its layers; 0 at fp32."""
        return sum(self.layer(n).cast_weight_bytes for n in names)

    def held_grad_bytes_per_sample(self, names: Sequence[str]) -> int:
        """Bytes per sample a stage of the layers ``names`` keeps from a split backward's B to its W
        (the output gradients its W needs; module docstring), the sum over its layers."""
        return sum(self.layer(n).held_grad_bytes_per_sample for n in names)

    def readers(self, name: str | None) -> tuple[str, ...]:
        """The layers that read ``name``'s output (``None``: the model input)."""
        names = [lp.name for lp in self.layers]
        if not self.edges:
            i = -1 if name is None else names.index(name)
            return tuple(names[i + 1:i + 2])
        targets = {dst for _, dst in self.edges}
        if name is None:
            return tuple(n for n in names if n not in targets)
        return tuple(dst for src, dst in self.edges if src == name)

    def _value_bytes(self, name: str | None) -> int:
        return self.input_bytes_per_sample if name is None else self.layer(name).output_bytes_per_sample

    def cut_bytes_per_sample(self, after: int) -> int:
        """Bytes per sample crossing the cut after the first ``after + 1`` layers of a chain plan
        (``after = -1``: before the first layer): every value made before it and read after it
        (:func:`pipetrain.graph.dataflow.live_after`); the last layer's output after the last layer."""
        names = [lp.name for lp in self.layers]
        if after >= len(names) - 1:
            return self.layers[-1].output_bytes_per_sample
        later = set(names[after + 1:])
        values: list[str | None] = [None, *names[:after + 1]]
        return sum(self._value_bytes(v) for v in values if later.intersection(self.readers(v)))

    def edge_bytes_per_sample(self, src: Sequence[str], dst: Sequence[str]) -> int:
        """Bytes per sample stage ``src`` (its layer names) sends stage ``dst`` on their stage edge."""
        wanted = set(dst)
        return sum(self._value_bytes(v) for v in src if wanted.intersection(self.readers(v)))

    # ---- JSON -------------------------------------------------------------------------------

    def to_json(self) -> str:
        data = asdict(self)
        if self.precision == "fp32":
            del data["precision"]  # the default: fp32 profiles read as before the field existed
        if self.noise is None:
            del data["noise"]
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        try:
            data: dict[str, Any] = json.loads(text)
            layers = tuple(
                LayerProfile(
                    name=str(x["name"]),
                    sizes=tuple(int(v) for v in x["sizes"]),
                    forward_s=tuple(float(v) for v in x["forward_s"]),
                    backward_s=tuple(float(v) for v in x["backward_s"]),
                    output_bytes_per_sample=int(x["output_bytes_per_sample"]),
                    saved_bytes_per_sample=int(x["saved_bytes_per_sample"]),
                    parameter_bytes=int(x["parameter_bytes"]),
                    flops_per_sample=float(x["flops_per_sample"]),
                    step_s=_optional_seconds(x, "step_s"),
                    saved_input_bytes_per_sample=int(x.get("saved_input_bytes_per_sample", 0)),
                    saved_output_bytes_per_sample=int(x.get("saved_output_bytes_per_sample", 0)),
                    weight_grad_s=_optional_times(x, "weight_grad_s"),
                    input_grad_s=_optional_times(x, "input_grad_s"),
                    held_grad_bytes_per_sample=int(x.get("held_grad_bytes_per_sample", 0)),
                    cast_weight_bytes=int(x.get("cast_weight_bytes", 0)),
                    optimizer_step_s={str(k): float(v)  # type: ignore[misc]  # names checked by _check_layer
                                      for k, v in dict(x.get("optimizer_step_s") or {}).items()},
                    clip_s=_optional_seconds(x, "clip_s"),
                )
                for x in data["layers"]
            )
            for i, layer in enumerate(layers):
                _check_layer(i, layer)
            for field in ("input_bytes_per_sample", "loss_saved_bytes_per_sample"):
                if int(data.get(field, 0)) < 0:
                    raise UserError(f"profile JSON: {field} is {data[field]}; give 0 or more bytes")
            return cls(
                model=str(data["model"]),
                fingerprint=str(data["fingerprint"]),
                device=str(data["device"]),
                source=str(data["source"]),
                input_bytes_per_sample=int(data["input_bytes_per_sample"]),
                layers=layers,
                loss_saved_bytes_per_sample=int(data.get("loss_saved_bytes_per_sample", 0)),
                edges=tuple((str(a), str(b)) for a, b in data.get("edges", ())),
                ties=tuple(TiedBytes(tuple(str(n) for n in t["layers"]), int(t["parameter_bytes"]))
                           for t in data.get("ties", ())),
                precision=parse_precision(str(data.get("precision", "fp32"))),
                noise=None if data.get("noise") is None else ProfileNoise.from_dict(data["noise"]),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError, AttributeError) as e:
            raise UserError(f"malformed profile JSON ({e!r}); re-create it with `pipetrain profile`") from None

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        try:
            return cls.from_json(Path(path).read_text())
        except FileNotFoundError:
            raise UserError(f"no profile at {path}; create one with `pipetrain profile`") from None
        except UserError as e:
            raise UserError(f"{path}: {e}") from None
