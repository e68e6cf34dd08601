"""A rank's stage as the interpreter runs it: the state its handlers share, and its stage kernel.

:class:`RankContext` holds what every stage has whatever the method: its layers, optimizer,
transport, activation meter, the last stage's loss (:class:`LossTally`), replicas and clipping. What
differs between methods lives in the stage's :class:`StageKernel`, chosen once when the stage is
built from the method's traits (:func:`~pipetrain.runtime.interp.rank_setup.stage_kernel`): what F,
B, W and STEP do, what the stage keeps between them, and what its messages move (its
:class:`Ports`). The interpreter's handlers (:mod:`pipetrain.runtime.interp.executor`) call the
kernel and know no method.

Gradient weighting (docs/architecture.md §5.2): the loss of every micro-batch is the *sum* of its
samples' losses divided by the full batch size ``B`` (:meth:`LossTally.weighted`), so the accumulated
gradients equal single-process training on the whole batch for any micro-batching, equal or not.
Nothing else scales gradients: the replicas of a replicated stage each hold the sum over their own
micro-batches, so summing them over the stage's group at STEP gives the whole batch's gradient (no
averaging, no learning-rate scaling). Under ``pipedream`` (``MethodSpec.loss_per_microbatch``) each
micro-batch is a mini-batch of its own and its loss is divided by its own size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from pipetrain.data import Loss
from pipetrain.graph.layer_graph import TensorSpec
from pipetrain.runtime.interp.buffers import ChunkBuffer
from pipetrain.runtime.interp.memory import ActivationMeter
from pipetrain.runtime.interp.precision import StagePrecision
from pipetrain.runtime.interp.ties import TiedGradients
from pipetrain.runtime.interp.transport import Transport
from pipetrain.schedule.action import Action

__all__ = ["Clip", "ClipNorm", "LossScaling", "LossTally", "Ports", "Range", "RankContext", "StageKernel",
           "stage_outputs"]

Range = tuple[int, int]


class ClipNorm(Protocol):
    """A clipping started at STEP (:class:`~pipetrain.runtime.job.optim.ClipNorm`)."""

    @property
    def in_flight(self) -> bool:
        """Its norm is still being summed over the ranks without blocking (2bw): the step may finish later."""
        ...

    def finish(self) -> float:
        """Wait for the norm and scale the gradients; the total norm before clipping."""
        ...


class LossScaling(Protocol):
    """fp16's loss scaling as the stages of one rank see it
    (:class:`~pipetrain.runtime.job.loss_scale.RankLossScaling`)."""

    def skips(self) -> bool:
        """At STEP: whether every stage skips this step's update. The rank's first STEP of a step
        unscales the gradients of all its stages and agrees with every rank whether any is inf or
        NaN (and updates the scale); its later STEPs of the step get the same answer."""
        ...


Clip = Callable[[list[nn.Parameter]], ClipNorm]
"""Starts clipping the given gradients before the optimizer step (the norm the method defines:
docs/algorithms.md §3.5); the step finishes it."""


class Ports(Protocol):
    """What a stage's messages move, send and store (the message spec).

    For a communication action ``a`` of ``[lo, hi)``: :meth:`spec` is the per-sample spec of its
    tensor (``[hi - lo, *spec.shape]``), :meth:`buffer` the buffer a SEND takes it from or a RECV puts
    it into. A stage reading the model input finds it in :attr:`model_input`.
    """

    @property
    def reads_input(self) -> bool:
        """The stage loads the model input (stage 0 of a chain; a DAG's stages with source layers)."""
        ...

    @property
    def model_input(self) -> ChunkBuffer:
        """Where the batch's inputs are loaded by range."""
        ...

    @property
    def buffers(self) -> tuple[ChunkBuffer, ...]:
        """Every buffer of the stage's messages (and its model input)."""
        ...

    def spec(self, a: Action) -> TensorSpec:
        """The per-sample spec of the tensor communication action ``a`` moves."""
        ...

    def buffer(self, a: Action) -> ChunkBuffer:
        """Where SEND ``a`` takes its tensor from, or RECV ``a`` puts it."""
        ...

    def gather(self, a: Action) -> list[torch.Tensor]:
        """The stage's inputs for ``[lo, hi)``: the model input if it reads it, then each predecessor's
        message (a leaf that takes a gradient, while autograd records)."""
        ...

    def scatter(self, a: Action, outputs: Sequence[torch.Tensor]) -> None:
        """Store the stage's outputs for ``[lo, hi)``, one per successor, for their SEND_F."""
        ...

    def clear(self) -> None:
        """Empty every buffer (a new batch)."""
        ...


def stage_outputs(y: torch.Tensor | tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """A stage module's output as :meth:`Ports.scatter` takes it: one tensor per successor (a chain: one)."""
    return [y] if isinstance(y, torch.Tensor) else list(y)


class StageKernel(Protocol):
    """One stage's behaviour: what each compute action and STEP does, and what it keeps in between.

    Implementations: a chain's (:class:`~pipetrain.runtime.interp.chain.ChainKernel`, with recompute,
    split backward and weight versions as strategies), a DAG's
    (:class:`~pipetrain.runtime.interp.dag.DagKernel`), local learning's
    (:class:`~pipetrain.runtime.interp.local.LocalKernel`) and evaluation's
    (:class:`~pipetrain.runtime.interp.evaluation.EvaluationKernel`).
    """

    @property
    def ports(self) -> Ports:
        """What the stage's messages move, send and store."""
        ...

    @property
    def head(self) -> nn.Module | None:
        """A module the stage trains besides its layers (local learning's auxiliary head), or None."""
        ...

    @property
    def targets_everywhere(self) -> bool:
        """Every stage takes the batch's targets (local losses), not only the last."""
        ...

    def begin_step(self, ctx: RankContext, inputs: torch.Tensor | None) -> None:
        """A new batch (``inputs [B, ...]`` on the CPU where loaded): clear the messages and what the
        kernel kept, unless micro-batches stay in flight across steps."""
        ...

    def forward(self, ctx: RankContext, a: Action) -> None: ...

    def backward(self, ctx: RankContext, a: Action) -> None: ...

    def weight(self, ctx: RankContext, a: Action) -> None: ...

    def step(self, ctx: RankContext, a: Action) -> None: ...

    def held(self) -> dict[str, list[Range]]:
        """What the kernel keeps for later actions, by kind, as sample ranges (only kinds holding some)."""
        ...


@dataclass
class LossTally:
    """The loss of the last stage: how a micro-batch's loss is weighted, and the step's total.

    Attributes:
        loss: a micro-batch's loss, the sum over its samples.
        batch_size: ``B``, the divisor of every micro-batch's loss (module docstring).
        per_microbatch: divide each micro-batch's loss by its own size instead (``pipedream``).
        targets: the batch's targets ``[B, ...]`` on the device (the last stage; every stage when the
            kernel has local losses), or None.
        offset: the first sample of the loaded batch in the ranges the actions name (an asynchronous
            program spans the run).
        total: the step's loss this replica added since its last STEP, a 0-d tensor (the last stage),
            or None.
        count: the micro-batches in ``total``.
        summed: ``[loss, micro-batches]`` the replicas of a replicated last stage summed at their STEPs
            so far this step (:meth:`sum_over`), or None.
        scale: fp16's loss scale ``S`` (1 otherwise): back-propagation starts from the weighted loss
            times ``S``, so the gradients every stage computes and sends are ``S`` times the true ones
            until STEP unscales them; ``total`` keeps the unscaled loss.
    """

    loss: Loss
    batch_size: int
    per_microbatch: bool = False
    targets: torch.Tensor | None = None
    offset: int = 0
    total: torch.Tensor | None = None
    count: int = 0
    summed: torch.Tensor | None = None
    scale: float = 1.0

    def load(self, targets: torch.Tensor | None, offset: int) -> None:
        """A new batch: its targets (or None) at ``offset``; the total starts afresh."""
        self.targets, self.offset, self.total, self.count = targets, offset, None, 0
        self.summed = None

    def pending(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``[total, count]`` (``dtype``, on ``device``): what this replica added since its last STEP."""
        total = torch.zeros(1, dtype=dtype, device=device) if self.total is None else self.total.reshape(1).to(dtype)
        return torch.cat([total, torch.full((1,), float(self.count), dtype=dtype, device=device)])

    def sum_over(self, reduced: torch.Tensor) -> None:
        """Take ``reduced``, :meth:`pending` summed over the stage's replicas, into :attr:`summed`; a
        STEP of every replica adds each micro-batch once, however often they step per batch
        (``pipedream`` steps after every backward)."""
        self.summed = reduced if self.summed is None else self.summed + reduced
        self.total, self.count = None, 0

    def targets_of(self, a: Action) -> torch.Tensor:
        """The targets of ``a``'s samples, ``[hi - lo, ...]``."""
        if self.targets is None:
            raise ValueError(f"{a}: the stage has no targets; call begin_step first")
        return self.targets[a.lo - self.offset:a.hi - self.offset]

    def weighted(self, y: torch.Tensor, a: Action) -> torch.Tensor:
        """``a``'s weighted loss: ``loss(y, targets) / B`` (``/ (hi - lo)`` per micro-batch), times
        :attr:`scale` under fp16."""
        weighted = self.loss(y, self.targets_of(a)) / (a.size if self.per_microbatch else self.batch_size)
        return weighted if self.scale == 1.0 else weighted * self.scale

    def add(self, loss: torch.Tensor) -> None:
        """Add a micro-batch's weighted loss (as :meth:`weighted` made it) to the step's total, unscaled."""
        value = loss.detach() if self.scale == 1.0 else loss.detach() / self.scale
        self.total = value if self.total is None else self.total + value
        self.count += 1

    def step_loss(self) -> float | None:
        """The mini-batch loss (mean over samples) after the step, or None off the last stage; per
        micro-batch, the mean of the step's micro-batch (mini-batch) losses."""
        if self.total is None and self.summed is None:
            return None
        total = float(self.total) if self.total is not None else 0.0
        count = self.count
        if self.summed is not None:
            total, count = total + float(self.summed[0]), count + round(float(self.summed[1]))
        return total / (count if self.per_microbatch else 1)


@dataclass
class RankContext:
    """Everything one stage of a rank shares during a step, whatever its method.

    Attributes:
        rank: this process's global rank.
        stage: the stage it runs; ``n_stages`` the stage count.
        module: the stage's layers, in order, on ``transport.device``.
        optimizer: over ``module``'s parameters (and the kernel's head's); None without parameters.
        transport: sends and receives.
        meter: saved-activation bytes.
        tally: the last stage's loss and the batch's targets.
        kernel: what F, B, W and STEP do on this stage, and its messages (module docstring).
        replicas: the process group of the stage's ranks when it is replicated, else None.
        input_ranges: the first stage's sample ranges on this rank (its micro-batches); None: the
            whole batch.
        clip: starts clipping the gradients before the optimizer step (:data:`Clip`), or None.
        ties: sums the copies of tied parameters held by several stages before the step (on the
            rank's first STEP), or None.
        precision: the autocast its forwards run under and the dtype of its messages
            (:mod:`~pipetrain.runtime.interp.precision`; the plan's precision).
        scaler: fp16's loss scaling at STEP, shared by the rank's stages (:class:`LossScaling`), or None.
    """

    rank: int
    stage: int
    n_stages: int
    module: nn.Module
    optimizer: torch.optim.Optimizer | None
    transport: Transport
    meter: ActivationMeter
    tally: LossTally
    kernel: StageKernel
    replicas: dist.ProcessGroup | None = None
    input_ranges: tuple[Range, ...] | None = None
    clip: Clip | None = None
    ties: TiedGradients | None = None
    precision: StagePrecision = field(default_factory=StagePrecision)
    scaler: LossScaling | None = None

    @property
    def is_first(self) -> bool:
        """Whether the stage reads the model input (stage 0 of a chain; a DAG's stages with source layers)."""
        return self.kernel.ports.reads_input

    @property
    def is_last(self) -> bool:
        return self.stage == self.n_stages - 1

    @property
    def needs_batch(self) -> bool:
        """Whether the stage loads the batch: its inputs, or its targets."""
        return self.is_first or self.is_last or self.kernel.targets_everywhere

    def begin_step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None,
                   input_ranges: Sequence[Range] | None = None, offset: int = 0) -> None:
        """Load a mini-batch: ``inputs [B, ...]`` on the first stage, ``targets [B, ...]`` on the last.

        ``input_ranges``: the first stage's ranges to load (default :attr:`input_ranges`, else the
        whole batch); ``offset``: where the batch starts in the actions' ranges. The kernel clears its
        messages (and what it kept, unless micro-batches stay in flight across steps).
        """
        self.kernel.begin_step(self, inputs)
        device = self.transport.device
        wanted = self.is_last or self.kernel.targets_everywhere
        self.tally.load(targets.to(device) if wanted and targets is not None else None, offset)
        if not self.is_first:
            return
        if inputs is None:
            raise ValueError("the first stage needs the batch's inputs")
        chosen = input_ranges if input_ranges is not None else self.input_ranges
        for lo, hi in chosen if chosen is not None else ((0, inputs.shape[0]),):
            self.kernel.ports.model_input.put(lo + offset, hi + offset, inputs[lo:hi].to(device))

    def step_loss(self) -> float | None:
        """The mini-batch loss on the last stage after its step (:meth:`LossTally.step_loss`); else None."""
        return self.tally.step_loss()
