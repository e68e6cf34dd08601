"""A plan's consistency rules, read from its method's traits (:mod:`pipetrain.plan.methods`).

    validate_plan(plan)                                   # also plan.validate()
    validate_plan(plan, graph.names, graph.fingerprint()) # and against the model

Every rule names the stage at fault and what to change (docs/architecture.md §5.5). The rules, in
the order they are checked:

* the batch and every stage's layers, ranks and size vectors (each sums to ``B``); the method's
  :class:`~pipetrain.plan.methods.SizeRule`: forward = backward unless ``per-pass``, one partition
  for every stage under ``one``;
* stage edges: the chain, or for a ``dag`` method any DAG in topological order with one sink;
* replicated stages, where the method allows them: one partition, a micro-batch per replica;
* recompute, where the method allows it; the method's ``params`` type; its weight policies;
* asynchronous methods (no flush): one partition, the replica rules (no vertical sync, whole
  micro-batches per replica);
* a micro-batch per stage where the method needs it (2BW's delay), per replica with replicated stages;
* ranks: one stage per rank, or the method's multi-stage placement;
* against a model: its fingerprint, and every layer once, in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipetrain.errors import UserError
from pipetrain.plan.methods import METHODS, SizeRule, StageGraph, WeightPolicy
from pipetrain.plan.placement import Placement, placed_ranks
from pipetrain.plan.plan import MAX_BATCH_SIZE, Plan, StagePlan

__all__ = ["validate_plan"]


def validate_plan(plan: Plan, layer_names: Sequence[str] | None = None, fingerprint: str | None = None) -> None:
    """Check ``plan`` against its method's traits, and against a model if given (module docstring).

    Raises:
        UserError: naming the stage and what to change.
    """
    if not 1 <= plan.batch_size <= MAX_BATCH_SIZE:
        raise UserError(f"batch_size is {plan.batch_size}; it must be between 1 and {MAX_BATCH_SIZE}")
    if not plan.stages:
        raise UserError("the plan has no stages; give at least one")
    for k, stage in enumerate(plan.stages):
        _check_stage(plan, k, stage)
    _check_edges(plan)
    if plan.replicated:
        _check_replicas(plan)
    _check_recompute(plan)
    _check_params(plan)
    _check_weights(plan)
    if not plan.spec.flush:
        _check_async(plan)
    _check_microbatch_count(plan)
    _check_ranks(plan)
    if fingerprint is not None and plan.model_fingerprint and fingerprint != plan.model_fingerprint:
        raise UserError(
            f"this plan was made for another model (fingerprint {plan.model_fingerprint}, the model "
            f"has {fingerprint}); re-plan with `pipetrain plan --model {plan.model}`"
        )
    if layer_names is not None:
        _check_layers(plan, list(layer_names))


def _check_stage(plan: Plan, k: int, stage: StagePlan) -> None:
    if not stage.layers:
        raise UserError(f"stage {k} has no layers; give every stage at least one layer")
    if not stage.ranks:
        raise UserError(f"stage {k} has no ranks; give every stage at least one rank")
    for label, sizes in (("forward", stage.forward_sizes), ("backward", stage.backward_sizes)):
        if not sizes or min(sizes) < 1:
            raise UserError(f"stage {k}: {label} micro-batch sizes {list(sizes)} must all be >= 1")
        if sum(sizes) != plan.batch_size:
            raise UserError(
                f"stage {k}: {label} micro-batch sizes {list(sizes)} sum to {sum(sizes)} but the "
                f"batch has {plan.batch_size} samples; make them sum to {plan.batch_size}"
            )
    rule, name = plan.spec.sizes, plan.method.value
    if rule is not SizeRule.PER_PASS and stage.backward_sizes != stage.forward_sizes:
        per_pass = ", ".join(m.value for m, s in METHODS.items() if s.sizes is SizeRule.PER_PASS)
        raise UserError(
            f"stage {k}: method {name} needs the same micro-batch sizes for forward and backward (stage {k} "
            f"differs: forward {list(stage.forward_sizes)}, backward {list(stage.backward_sizes)}); give stage {k} "
            f"one partition for both, or use method {per_pass!r} for unequal forward and backward partitions"
        )
    first = plan.stages[0].forward_sizes
    if rule is SizeRule.ONE and stage.forward_sizes != first:
        per_stage = ", ".join(m.value for m, s in METHODS.items()
                              if s.sizes is not SizeRule.ONE and s.placement is plan.placement and s.flush)
        raise UserError(f"stage {k}: method {name} needs one partition for every stage, the same micro-batch sizes "
                        f"on each (stage 0 has {list(first)}, stage {k} {list(stage.forward_sizes)}); use one "
                        f"partition for the whole plan, or a method with per-stage partitions ({per_stage})")


def _check_edges(plan: Plan) -> None:
    """Chain methods run the chain 0 -> 1 -> ...; a DAG method any DAG of stages in topological
    order with the last stage as its only sink (GraphPipe §3.2)."""
    n = plan.n_stages
    chain = tuple((k, k + 1) for k in range(n - 1))
    if plan.spec.graph is StageGraph.CHAIN:
        if plan.edges and tuple(plan.edges) != chain:
            dag = " or ".join(m.value for m, s in METHODS.items() if s.graph is StageGraph.DAG)
            raise UserError(f"the plan's stage edges {list(plan.edges)} form a graph, not the chain 0 -> 1 -> ...; "
                            f"stages that form a DAG run with method {dag}, not {plan.method.value}: set "
                            f'"method": "{dag}" or remove "edges"')
        return
    name = plan.method.value
    edges = [tuple(e) for e in plan.stage_edges]
    bad = [e for e in edges if not 0 <= e[0] < e[1] < n]
    if bad or len(set(edges)) != len(edges):
        raise UserError(f"method {name}: stage edges {bad[:3] or edges} must each go from a lower to a higher stage "
                        f"of 0..{n - 1}, once; number the stages in a topological order")
    sinks = [k for k in range(n) if not plan.stage_successors(k)]
    if sinks != [n - 1]:
        raise UserError(f"method {name}: stages {sinks} have no successors; only the last stage (the one with the "
                        "model's last layer) may, so connect the others to a later stage")


def _check_replicas(plan: Plan) -> None:
    """Replicated stages take whole micro-batches round-robin, so every stage must cut the batch
    the same way (a message then goes to exactly one replica) and have a micro-batch per replica."""
    if not plan.spec.replicas:
        allowed = ", ".join(m.value for m, s in METHODS.items() if s.replicas)
        raise UserError(f"method {plan.method.value} cannot run replicated stages; use {allowed}, or give every "
                        "stage one rank")
    sizes = plan.stages[0].forward_sizes
    for k, stage in enumerate(plan.stages):
        if stage.forward_sizes != sizes or stage.backward_sizes != sizes:
            raise UserError(
                f"stage {k}: with replicated stages every stage needs the same micro-batch sizes for "
                f"forward and backward (stage 0 has {list(sizes)}); use one partition for the whole plan"
            )
        if len(stage.ranks) > len(sizes):
            raise UserError(
                f"stage {k} runs on {len(stage.ranks)} ranks but the batch has only {len(sizes)} "
                f"micro-batches; use at least {len(stage.ranks)} micro-batches or fewer replicas"
            )


def _check_recompute(plan: Plan) -> None:
    """Only a method that may recompute has stages that chose to."""
    chosen = plan.recompute_stages
    if chosen and not plan.spec.recompute:
        allowed = ", ".join(m.value for m, s in METHODS.items() if s.recompute)
        raise UserError(f'method {plan.method.value} cannot recompute (stage {chosen[0]} sets "recompute"): its '
                        f'stages train on their own losses; drop "recompute" from the plan, or use a method '
                        f"that recomputes ({allowed})")


def _check_params(plan: Plan) -> None:
    """The plan's ``params`` are of its method's type, with values it can run."""
    spec, params = plan.spec, plan.params
    if type(params) is not spec.params:
        if spec.default_params() is None:  # a method whose parameters must be given
            raise UserError(f"method {spec.name} needs its {spec.params.what} (\"params\"); re-plan with "
                            f"--method {spec.name}")
        owners = " or ".join(m.value for m, s in METHODS.items() if s.params is type(params))
        raise UserError(f"method {spec.name} takes no {type(params).what} (parameters of method {owners}); remove "
                        f"\"params\" from the plan or use method {owners}")
    params.check(spec.name)


def _check_weights(plan: Plan) -> None:
    spec, policy = plan.spec, plan.weights
    if policy in spec.weights:
        return
    allowed = " or ".join(repr(w.value) for w in spec.weights)
    versioned = policy not in (WeightPolicy.SYNC, WeightPolicy.LOCAL)
    owners = " or ".join(m.value for m, s in METHODS.items() if (not s.flush if versioned else policy in s.weights))
    why = f"{'versioned' if versioned else policy.value} weights need method {owners}" \
        if versioned or policy is not WeightPolicy.SYNC else f"method {spec.name} runs {allowed} weights"
    raise UserError(f"method {spec.name} cannot run weight policy {policy.value!r} (the two do not go together: "
                    f"{why}); set \"weights\" to {allowed} or change the method")


def _check_microbatch_count(plan: Plan) -> None:
    """A method that needs a micro-batch per stage (:attr:`MethodSpec.microbatches_per_stage`) gets them;
    with replicated stages, every replica as many as it keeps in flight (:func:`_replica_depths`)."""
    m = min(len(s.forward_sizes) for s in plan.stages)
    if not plan.spec.microbatches_per_stage:
        return
    if not plan.replicated:
        if m < plan.n_stages:
            raise UserError(f"method {plan.method.value} needs at least as many micro-batches as stages "
                            f"({plan.n_stages}), got {m}; use more micro-batches or fewer stages")
        return
    need = [len(s.ranks) * depth for s, depth in zip(plan.stages, _replica_depths(plan), strict=True)]
    k = max(range(plan.n_stages), key=need.__getitem__)
    if m < need[k]:
        raise UserError(f"method {plan.method.value} needs every replica of a stage to run at least as many "
                        f"micro-batches per batch as it keeps in flight: stage {k} on {len(plan.stages[k].ranks)} "
                        f"ranks keeps {need[k] // len(plan.stages[k].ranks)} each, so the batch needs at least "
                        f"{need[k]} micro-batches (it has {m}); use more micro-batches, or fewer replicas or stages")


def _replica_depths(plan: Plan) -> list[int]:
    """Per stage of a chain, the micro-batches each replica keeps in flight under 1F1B-RR:
    ``(R_k − 1) // r_k + 1`` with ``r_k`` the stage's ranks and ``R_k`` those of stages ``k…K−1``
    (PipeDream's warm-up rule, docs/algorithms.md §3.4); ``K − k`` without replicas, so a 2BW plan of
    ``d`` stages each on ``w`` ranks needs ``m >= w · d``: the paper's ``m >= d`` per pipeline."""
    depths, downstream = [], 0
    for stage in reversed(plan.stages):
        downstream += len(stage.ranks)
        depths.append((downstream - 1) // len(stage.ranks) + 1)
    return depths[::-1]


def _check_async(plan: Plan) -> None:
    """An asynchronous method needs one partition for every stage and pass (its size rule) and, with
    replicated stages: no vertical sync and a whole number of micro-batches per replica. Any stage may
    be replicated, the last one too (its replicas sum the loss they added since their previous STEP,
    :func:`~pipetrain.runtime.interp.step.start_step`), so one stage on every rank is PipeDream's
    data parallelism."""
    sizes = plan.stages[0].forward_sizes
    replicas = [len(s.ranks) for s in plan.stages]
    if max(replicas) == 1:
        return
    if plan.weights is WeightPolicy.VERTICAL_SYNC:
        raise UserError("vertical sync cannot run replicated stages (their versions advance at another rate); "
                        "drop --vertical-sync or give every stage one rank")
    bad = [k for k, r in enumerate(replicas) if len(sizes) % r]
    if bad:
        raise UserError(f"stage {bad[0]} runs on {replicas[bad[0]]} ranks, which do not divide the {len(sizes)} "
                        "micro-batches; use a multiple of every stage's replica count")


def _check_ranks(plan: Plan) -> None:
    """Each of ranks 0..R-1 runs exactly one stage; under a multi-stage placement every rank the same
    number of stages, placed as the method says (:mod:`pipetrain.plan.placement`)."""
    ranks = sorted(r for s in plan.stages for r in s.ranks)
    if plan.placement is Placement.SINGLE:
        if ranks != list(range(len(ranks))):
            raise UserError(f"stages use ranks {ranks}; each of ranks 0..{len(ranks) - 1} must run exactly one "
                            "stage")
        return
    n = plan.n_ranks
    placed = placed_ranks(plan.placement, plan.n_stages, n)
    v_count = plan.placement is not Placement.V or plan.n_stages == 2 * n  # V: exactly 2 stages per rank
    if tuple(s.ranks for s in plan.stages) != placed or plan.n_stages % n or sorted(set(ranks)) != list(range(n)) \
            or not v_count:
        rule = "s mod R" if plan.placement is Placement.LOOPING else "s (s < R) or 2R-1-s (s >= R), 2R stages"
        raise UserError(f"method {plan.method.value} places stage s on rank {rule}, every rank the same number "
                        f"of stages (here {plan.n_stages} stages on {n} ranks); give the stages the ranks "
                        f"{[list(r) for r in placed or ()]}")


def _check_layers(plan: Plan, model: list[str]) -> None:
    planned = [name for s in plan.stages for name in s.layers]
    if plan.spec.graph is StageGraph.DAG:  # stages of a DAG need not be consecutive (the graph checks the rest)
        planned = sorted(planned, key=lambda n: model.index(n) if n in model else -1)
    if planned != model:
        raise UserError(f"the plan's stages do not cover the model's {len(model)} layers once, in order: "
                        f"{_layer_difference(planned, model)}; re-plan for this model")


def _layer_difference(planned: list[str], model: list[str]) -> str:
    """What differs, e.g. ``"missing 'block2'"``, ``"'x' is not a layer of the model"``,
    ``"'block1' twice"`` or ``"at position 3 the plan has 'block3' where the model has 'block2'"``."""
    missing = [n for n in model if n not in planned]
    unknown = [n for n in planned if n not in model]
    repeated = sorted({n for n in planned if planned.count(n) > 1})
    parts = ([f"missing {', '.join(map(repr, missing[:5]))}"] if missing else []) + (
        [f"{', '.join(map(repr, unknown[:5]))} not in the model"] if unknown else []) + (
        [f"{', '.join(map(repr, repeated[:5]))} more than once"] if repeated else [])
    if parts:
        return "; ".join(parts)
    i = next(i for i, (a, b) in enumerate(zip(planned, model, strict=True)) if a != b)
    return f"at position {i} the plan has {planned[i]!r} where the model has {model[i]!r}"
