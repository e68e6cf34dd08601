"""``pipetrain.train`` and ``pipetrain.plan``: a module and its data in, a trained pipeline out
(level c); the returned weights load into the user's module by name, and the module then computes
what the pipeline evaluated."""

from __future__ import annotations

import pytest
import torch

import pipetrain
from examples.custom_model import build, digits_data
from pipetrain.data import EvalTally, resolve_loss

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

DATA = "examples.custom_model:digits_data"


def test_train_a_module_in_one_call() -> None:
    model = build()
    plan = pipetrain.plan(model, DATA, ranks=2, batch_size=64, progress=False)
    assert plan.n_ranks == 2 and plan.model == "ResidualMLP"
    result = pipetrain.train(model, DATA, plan=plan, steps=30, lr=0.05, progress=False)
    assert result.losses[-1] < 0.5 * result.losses[0]
    model.load_state_dict(result.state_dict, strict=True)  # every parameter, under the module's names
    final = result.final_eval
    assert final is not None and final.eval_accuracy is not None and final.eval_accuracy > 0.8
    tally = EvalTally()
    model.eval()
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(digits_data()[1], batch_size=64):
            tally.add(resolve_loss(None, pipetrain.api.resolve_model(model, data=DATA).target), model(x), y)
    assert tally.result().accuracy == pytest.approx(final.eval_accuracy, abs=1e-9)
    assert tally.result().loss == pytest.approx(final.eval_loss, abs=1e-5)
