"""The device a captured layer's code names, and moving it to the device its inputs are on.

``torch.export`` records factory operations with the device they ran on
(``aten.arange.default(16, device=cpu)``, ``aten.to.device(mask, cpu, bool)``), so a layer traced on
the CPU would make its masks and positions there while its weights and inputs sit on a GPU, or on
the meta device while a plan is checked. A :class:`~pipetrain.graph.capture.CapturedLayer` whose
code names a device rewrites it, once per move, to the device of its first input::

    arange = torch.ops.aten.arange.default(16, device=device(type='cpu'))      traced
    arange = torch.ops.aten.arange.default(16, device=device(type='cuda', index=0))   on cuda:0

Code captured with ``torch.fx`` names no device (it reads ``x.device``), and is left alone.
"""

from __future__ import annotations

import torch
from torch import fx

__all__ = ["named_device", "retarget"]


def named_device(graph: fx.Graph) -> torch.device | None:
    """The device ``graph``'s operations name as an argument (the first found), or None."""
    for node in graph.nodes:
        for value in (*node.args, *node.kwargs.values()):
            if isinstance(value, torch.device):
                return value
    return None


def retarget(graph: fx.Graph, device: torch.device) -> None:
    """Make every device argument of ``graph``'s operations ``device`` (recompile the module after)."""
    for node in graph.nodes:
        node.args = tuple(device if isinstance(a, torch.device) else a for a in node.args)
        node.kwargs = {k: device if isinstance(v, torch.device) else v for k, v in node.kwargs.items()}
