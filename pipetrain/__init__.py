"""pipetrain: pipeline-parallel training for PyTorch, planned automatically.

    import pipetrain
    result = pipetrain.train(my_module, "my_data:make", ranks=2, epochs=3)   # see pipetrain.quick

Importing pipetrain does no I/O, probes no devices and starts no processes.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["plan", "train"]

if TYPE_CHECKING:
    from pipetrain.quick import plan, train


def __getattr__(name: str) -> Any:
    """``pipetrain.train`` and ``pipetrain.plan`` (:mod:`pipetrain.quick`), imported on first use."""
    if name in ("plan", "train"):
        from pipetrain import quick

        return getattr(quick, name)
    raise AttributeError(f"module 'pipetrain' has no attribute {name!r}")
