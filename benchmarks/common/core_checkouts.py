"""The plans the checkouts benchmark trains under two checkouts: a ``model batch method[:chunks]@m steps``
setting planned once, by this checkout, and written so that older checkouts read it too."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from common.core_plans import build_plan, parse_setting
from pipetrain import api
from pipetrain.cost import CostModel
from pipetrain.graph.aux_heads import default_aux
from pipetrain.graph.zoo import build_model
from pipetrain.plan.methods import LocalParams, Method, WeightPolicy
from pipetrain.plan.plan import Plan
from pipetrain.profile.table import Profile

__all__ = ["plan_text", "setting_plan"]


def setting_plan(setting: str, folder: Path) -> Plan:
    """The plan of ``setting`` on this machine's default 2-rank cluster, from the model's profile
    (saved in ``folder`` on first use). ``+recompute`` recomputes every stage; ``pipedream`` runs the
    1f1b plan asynchronously; ``local`` trains with the model's default heads."""
    model, batch, spec, _ = setting.split()
    path = folder / f"profile_{model}_{batch}.json"
    graph = build_model(model)
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(api.profile_model(graph, int(batch)).to_json())
    cost = CostModel(Profile.from_json(path.read_text()), api.local_cluster(2))
    name, _, micro = spec.partition("@")
    name, recompute = name.removesuffix("+recompute"), name.endswith("+recompute")
    asynchronous = name in (Method.PIPEDREAM.value, Method.LOCAL.value)
    _, method, chunks, m = parse_setting(f"{Method.ONE_F_ONE_B.value if asynchronous else name}@{micro}")
    plan = build_plan(graph, cost, int(batch), method, chunks, m).with_recompute(None if recompute else ())
    if name == Method.LOCAL.value:
        return replace(plan, method=Method.LOCAL, weights=WeightPolicy.LOCAL, params=LocalParams(default_aux(graph)))
    return plan.run_by(Method(name)) if asynchronous else plan


def plan_text(plan: Plan) -> str:
    """The plan's JSON, with a local plan's parameters also at the top level, where checkouts from
    before ``params`` read them (newer ones read ``params`` and ignore those)."""
    data = json.loads(plan.to_json())
    data.update(data.get("params", {}) if plan.method is Method.LOCAL else {})
    return json.dumps(data, indent=2)
