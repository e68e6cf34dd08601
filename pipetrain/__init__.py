"""pipetrain: pipeline-parallel training for PyTorch, planned automatically.

    import pipetrain
    result = pipetrain.train(my_module, "my_data:make", ranks=2, epochs=3)   # see pipetrain.quick
    plan = pipetrain.plan(my_module, "my_data:make", ranks=2)

Importing pipetrain does no I/O, probes no devices and starts no processes; :mod:`pipetrain.quick`
(and torch) load on the first call.
"""

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["plan", "train"]

# ``pipetrain.plan`` is also the package of plan values (pipetrain/plan/). Python binds a package's
# name on its parent when the package is first imported, so it is imported here, before the
# function of the same name is defined: later imports of ``pipetrain.plan.*`` leave the function be.
importlib.import_module("pipetrain.plan")

if TYPE_CHECKING:
    from pipetrain.quick import plan, train
else:

    def plan(*args: Any, **kwargs: Any) -> Any:
        """:func:`pipetrain.quick.plan`: the best plan for a model on local ranks."""
        from pipetrain.quick import plan as quick_plan

        return quick_plan(*args, **kwargs)

    def train(*args: Any, **kwargs: Any) -> Any:
        """:func:`pipetrain.quick.train`: train a model with pipeline parallelism on local ranks."""
        from pipetrain.quick import train as quick_train

        return quick_train(*args, **kwargs)
