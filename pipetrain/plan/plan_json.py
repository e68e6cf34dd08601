"""A plan's JSON form: the hand-editable artefact ``pipetrain plan`` writes (docs/architecture.md §2).

    text = plan_to_json(plan)          # also plan.to_json()
    plan = plan_from_json(text)        # also Plan.from_json(text)

The object has the :class:`~pipetrain.plan.plan.Plan` fields by name; ``method`` and ``weights`` are
their enum values; ``params``, the method's own parameters as an object (``{"aux": "linear",
"queue_depth": 2}`` for method ``local``), appears only when the method has some. On reading,
``backward_sizes`` defaults to ``forward_sizes``, ``edges`` to the chain, ``weights`` to the method's
first policy and ``params`` to the method's defaults. A stage's ``recompute`` appears only when set;
plans written when recompute was one flag for the whole plan keep loading: their top-level
``"recompute": true`` sets it on every stage. Plans written before ``params`` existed keep
loading: their top-level ``aux`` and ``queue_depth`` (method ``local``) become its ``params``.
``precision``, ``optimizer`` and ``clip_grad_norm`` appear only when not their defaults (``fp32``,
``sgd``, ``false``), so plans written before them read as before; ``measurements`` (the profile and
cluster files saved beside the plan) appears only when recorded, without its unset entries. The two
functions are exact inverses on every plan (a round-trip test checks it).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from pipetrain.errors import UserError
from pipetrain.plan.memory import check_optimizer
from pipetrain.plan.methods import METHODS, Method, MethodParams, WeightPolicy
from pipetrain.plan.plan import Plan, PlanSources, Prediction, StagePlan
from pipetrain.profile.precision import parse_precision

__all__ = ["plan_from_json", "plan_to_json"]


def plan_to_json(plan: Plan) -> str:
    """The plan as indented JSON text (module docstring)."""
    data: dict[str, Any] = asdict(plan)
    data["method"] = plan.method.value
    data["weights"] = plan.weights.value
    for stage in data["stages"]:
        if not stage["recompute"]:
            del stage["recompute"]  # the default: plans without recompute read as before
    for name, default in (("precision", "fp32"), ("optimizer", "sgd"), ("clip_grad_norm", False)):
        if data[name] == default:
            del data[name]  # the default: plans without the field read as before
    if plan.measurements is None:
        del data["measurements"]  # unrecorded: plans read as before
    else:
        data["measurements"] = {k: v for k, v in data["measurements"].items() if v is not None}
    params = plan.params.to_json()
    if params:
        data["params"] = params
    else:
        del data["params"]
    return json.dumps(data, indent=2)


def _stage(s: dict[str, Any], recompute: bool) -> StagePlan:
    """One stage; ``recompute``: an older plan's top-level flag, which sets every stage's."""
    return StagePlan(
        layers=tuple(str(n) for n in s["layers"]),
        ranks=tuple(int(r) for r in s["ranks"]),
        forward_sizes=tuple(int(x) for x in s["forward_sizes"]),
        backward_sizes=tuple(int(x) for x in s.get("backward_sizes", s["forward_sizes"])),
        recompute=recompute or bool(s.get("recompute", False)),
    )


def _prediction(pred: dict[str, Any] | None) -> Prediction | None:
    if pred is None:
        return None
    return Prediction(float(pred["iteration_s"]), float(pred["bubble_fraction"]),
                      tuple(int(x) for x in pred["peak_memory_bytes"]), str(pred["basis"]))


def _measurements(given: Any) -> PlanSources | None:
    """``measurements``: an object of file names (``profile``, ``cluster``), each optional."""
    if given is None:
        return None
    if not isinstance(given, dict):
        raise UserError('plan JSON\'s "measurements" must be an object, e.g. {"profile": "plan.profile.json", '
                        '"cluster": "plan.cluster.json"}; fix it or drop it to measure anew')
    profile, cluster = given.get("profile"), given.get("cluster")
    return PlanSources(None if profile is None else str(profile), None if cluster is None else str(cluster))


_LEGACY_PARAMS = ("aux", "queue_depth")
"""Top-level fields of plans written before ``params``: method ``local``'s parameters."""


def _params(method: Method, data: dict[str, Any]) -> MethodParams:
    """The method's parameters from ``data["params"]``, or from an older plan's top-level fields."""
    given = data.get("params")
    if given is None:
        given = {k: data[k] for k in _LEGACY_PARAMS if data.get(k) is not None}
    if not isinstance(given, dict):
        raise UserError('plan JSON\'s "params" must be an object, e.g. {"aux": "linear"}; fix it or re-create the '
                        "plan")
    if not given:
        return METHODS[method].default_params() or MethodParams()
    return METHODS[method].params_from_json(given)


def _flag(value: object, name: str) -> bool:
    """A JSON boolean field; a UserError naming it otherwise (``"false"`` is not false)."""
    if not isinstance(value, bool):
        raise UserError(f"plan JSON's {name!r} is {value!r}; give true or false")
    return value


def plan_from_json(text: str) -> Plan:
    """Parse a plan; any malformation raises :class:`UserError` naming the field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"plan is not valid JSON ({e}); fix the file or re-create it with `pipetrain plan`") from None
    if not isinstance(data, dict):
        raise UserError("plan JSON must be an object with fields model, batch_size, method, stages")
    try:
        method = Method(data["method"])
        return Plan(
            model=str(data["model"]),
            model_fingerprint=str(data.get("model_fingerprint", "")),
            batch_size=int(data["batch_size"]),
            method=method,
            stages=tuple(_stage(s, bool(data.get("recompute", False))) for s in data["stages"]),
            edges=tuple((int(a), int(b)) for a, b in data.get("edges", ())),
            weights=WeightPolicy(data.get("weights", METHODS[method].weights[0].value)),
            prediction=_prediction(data.get("prediction")),
            params=_params(method, data),
            precision=parse_precision(str(data.get("precision", "fp32"))),
            optimizer=check_optimizer(str(data.get("optimizer", "sgd"))),
            clip_grad_norm=_flag(data.get("clip_grad_norm", False), "clip_grad_norm"),
            measurements=_measurements(data.get("measurements")),
        )
    except KeyError as e:
        raise UserError(f"plan JSON lacks the field {e.args[0]!r}; add it or re-create the plan") from None
    except (TypeError, ValueError, OverflowError, AttributeError) as e:
        raise UserError(f"plan JSON has a malformed field ({e}); fix it or re-create the plan") from None
