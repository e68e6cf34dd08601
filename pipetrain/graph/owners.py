"""Which layer owns a module: where a captured model is cut (issue 26 §2).

A capture (torch.fx in :mod:`pipetrain.graph.capture`, torch.export in
:mod:`pipetrain.graph.export_capture`) records for every node the module whose ``forward`` ran it.
:class:`Owners` maps that module's path to the *layer* that owns it, by walking down from the
root:

* a container (``ModuleList``, ``Sequential``, ``ModuleDict``) is always walked into, at any
  depth, and each of its entries is a layer (``transformer.h.3``, ``layer1.0``, ``features.2``),
  even if the entry holds containers itself (a ResNet block with its ``downsample``), unless the
  entry is a container too: a Sequential of Sequentials (torchvision's ``Conv2dNormActivation``
  inside ``features``) splits again (``features.0.0``, ``features.0.1``);
* a module that is not a container entry but holds a container somewhere below it (GPT-2's
  ``transformer`` holding ``h``, a ViT's ``encoder`` holding ``layers``) is walked through: its
  children are owned as the root's are, and the code of its own ``forward`` is *glue*;
* a module the capture keeps whole (a leaf) is a layer wherever the walk meets it;
* any other module is a layer.

Glue (owner None: the root's own code, a walked-through module's, a container's) runs with the
node before it (:func:`group`). :func:`merge_stateless` then folds every run whose owner holds no
parameter and no persistent buffer (activations, pooling, dropout, flatten) into the layer before
it, so that no layer is only such an op: a layer of an in-place ``ReLU`` alone is no unit worth
a stage boundary, and would modify the tensor its stage received, which autograd refuses.

    >>> owners = Owners(gpt2)                                               # doctest: +SKIP
    >>> owners("transformer.h.0.attn.c_attn"), owners("transformer.wte"), owners("transformer")  # doctest: +SKIP
    ('transformer.h.0', 'transformer.wte', None)
    >>> runs = merge_stateless(group(owned_nodes), owners.stateless)         # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from torch import nn

__all__ = ["CONTAINERS", "Owners", "group", "merge_stateless"]

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)

T = TypeVar("T")


def _never(module: nn.Module) -> bool:
    return False


class Owners:
    """Maps a module path to the path of the layer that owns it, or None for glue; memoised.

    Args:
        root: the captured model.
        whole: whether the capture keeps a module whole (runs it as one node); such a module is
            a layer even where it would be walked through. Never true for a ``ModuleList`` or
            ``ModuleDict`` (they are never called).
    """

    def __init__(self, root: nn.Module, whole: Callable[[nn.Module], bool] = _never) -> None:
        self.root = root
        self.whole = whole
        self.cache: dict[str, str | None] = {}

    def __call__(self, path: str) -> str | None:
        """The owner of the module at ``path`` (``"transformer.h.0.attn"`` → ``"transformer.h.0"``);
        None for the root (``""``), a container or a module walked through."""
        if path not in self.cache:
            self.cache[path] = self._owner(path.split(".") if path else [])
        return self.cache[path]

    def _owner(self, parts: list[str]) -> str | None:
        module, entry = self.root, isinstance(self.root, CONTAINERS)
        for depth in range(1, len(parts) + 1):
            module = module.get_submodule(parts[depth - 1])
            if self.whole(module):
                return ".".join(parts[:depth])
            if isinstance(module, CONTAINERS):
                entry = True
            elif entry or not _holds_container(module):
                return ".".join(parts[:depth])
        return None

    def stateless(self, owner: str) -> bool:
        """Whether the layer ``owner`` holds no parameter and no persistent buffer; glue before the
        first layer (owner ``""``, see :func:`group`) counts as stateless."""
        return not owner or not self.root.get_submodule(owner).state_dict()


def _holds_container(module: nn.Module) -> bool:
    return any(isinstance(m, CONTAINERS) for m in module.modules())


def group(owned: Iterable[tuple[T, str | None]]) -> list[tuple[str, list[T]]]:
    """Nodes with their owners (None: glue), in execution order → runs ``(owner, nodes)`` of
    consecutive nodes of one owner, each glue node in the run before it; glue before any owner
    forms a run of owner ``""``."""
    runs: list[tuple[str, list[T]]] = []
    for node, owner in owned:
        if runs and owner in (None, runs[-1][0]):
            runs[-1][1].append(node)
        else:
            runs.append((owner or "", [node]))
    return runs


def merge_stateless(runs: Sequence[tuple[str, list[T]]], stateless: Callable[[str], bool]) -> list[tuple[str, list[T]]]:
    """``runs`` (owner, its consecutive nodes; in execution order) with every run whose owner is
    ``stateless`` appended to the run before it (the first ones prepended to the first run that
    is not), then neighbouring runs of one owner joined. All stateless: one run, the first owner's.

    The owners that remain are the layers: ``conv1, bn1, relu, maxpool, layer1.0`` →
    ``conv1, bn1 (+relu, maxpool), layer1.0``.
    """
    merged: list[tuple[str, list[T]]] = []
    waiting: list[T] = []  # stateless nodes before the first stateful run
    for owner, nodes in runs:
        if stateless(owner) and merged:
            merged[-1][1].extend(nodes)
        elif stateless(owner):
            waiting.extend(nodes)
        elif merged and merged[-1][0] == owner:
            merged[-1][1].extend(nodes)
        else:
            merged.append((owner, waiting + list(nodes)))
            waiting = []
    if not merged:
        return [(runs[0][0], waiting)] if runs else []
    return merged
