"""Checkpoints: every stage writes its shard, the manifest is written last; resume, reshard, export.

On disk, one folder per checkpoint under the checkpoint directory ``D``::

    D/step-00000040/rank-0.pt        torch.save of {"model": {name: tensor}, "optimizer": {name/key: tensor},
    D/step-00000040/rank-1.pt                       "rng": {"torch": uint8 tensor}} (flat dicts of tensors)
    D/step-00000040/manifest.json    written last, atomically: the checkpoint is whole once it exists

``name`` is the model's own name of a parameter or buffer (:meth:`~pipetrain.graph.layer_graph.Layer.qualified`,
e.g. ``blocks.0.up.weight``), so a checkpoint does not depend on how the model was cut: any plan can
read the tensors of its layers from whichever shards hold them (resharding). Optimizer state is keyed
``"{name}/{key}"`` (``exp_avg``, ``momentum_buffer``, ``step``...). The replicas of a replicated stage
hold the same state, so only its first rank writes it; every rank writes its RNG state. A tied tensor
(:mod:`pipetrain.graph.ties`), whose copies hold the same value and optimizer state, is written once,
by the stage of its first layer under its first name, and read back into every copy.

``manifest.json`` records the step, the samples seen, the model (name, fingerprint, layers), the
plan's layout (each stage's layers and ranks), the optimizer and, per shard, its file, size, SHA-256
and keys. A run killed while saving leaves a folder without a manifest, which :func:`newest_checkpoint`
skips, so the previous checkpoint stays the newest whole one.

Why not ``torch.distributed.checkpoint``: its file-system reader unpickles the ``.metadata`` file with
plain ``pickle`` (torch 2.13), so a tampered checkpoint could run arbitrary code. Here every shard is
read with ``torch.load(weights_only=True)`` after its hash is checked, and the manifest is JSON.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipetrain.errors import UserError
from pipetrain.fileio import write_atomic
from pipetrain.graph.layer_graph import Layer, LayerGraph
from pipetrain.graph.ties import Tie, saved_by, saved_name
from pipetrain.plan.plan import Plan

__all__ = [
    "MANIFEST",
    "Checkpoint",
    "ShardEntry",
    "export_checkpoint",
    "newest_checkpoint",
    "open_checkpoint",
    "restore_stage",
    "stage_state",
    "write_manifest",
    "write_shard",
]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_FORMAT = 1
State = dict[str, dict[str, torch.Tensor]]
"""``{"model": {name: tensor}, "optimizer": {"name/key": tensor}, "rng": {"torch": tensor}}``."""


@dataclass(frozen=True)
class ShardEntry:
    """One rank's file in a checkpoint, as the manifest lists it."""

    file: str
    rank: int
    bytes: int
    sha256: str
    keys: tuple[str, ...]


def step_folder(directory: Path, step: int) -> Path:
    """``D/step-00000040``: the folder of the checkpoint taken after ``step`` optimizer steps."""
    return Path(directory) / f"step-{step:08d}"


def plan_layout(plan: Plan) -> list[dict[str, list[Any]]]:
    """Each stage's layers and ranks: a resumed run with the same layout restores RNG states too."""
    return [{"layers": list(s.layers), "ranks": list(s.ranks)} for s in plan.stages]


# ---- writing --------------------------------------------------------------------------------------


def stage_state(module: nn.Module, layers: Sequence[Layer], optimizer: torch.optim.Optimizer | None,
                *, owner: bool, ties: Sequence[Tie] = ()) -> State:
    """What a rank saves: its stage's parameters, buffers and optimizer state when it is the stage's
    first rank (``owner``), and its RNG state.

    Args:
        module: the stage, one child per layer of ``layers``, in order.
        ties: the model's ties: a tied tensor is saved only by its first layer (:func:`~pipetrain.graph.ties.saved_by`).
    """
    state: State = {"rng": {"torch": torch.get_rng_state()}}
    if torch.cuda.is_available() and any(p.is_cuda for p in module.parameters()):
        state["rng"]["cuda"] = torch.cuda.get_rng_state()
    if not owner:
        return state
    children = zip(layers, module.children(), strict=True)
    state["model"] = {layer.qualified(k): v.detach().cpu() for layer, child in children
                      for k, v in child.state_dict().items() if saved_by(layer.name, layer.qualified(k), ties)}
    state["optimizer"] = _optimizer_state(module, layers, optimizer, ties)
    return state


def _parameter_names(module: nn.Module, layers: Sequence[Layer]) -> list[tuple[str, str]]:
    """``(layer, model's name)`` of each of ``module.parameters()``, in that order (the optimizer's
    order; a parameter tied between two of the layers is listed once, by the first)."""
    seen: set[int] = set()
    names = []
    for layer, child in zip(layers, module.children(), strict=True):
        for k, p in child.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                names.append((layer.name, layer.qualified(k)))
    return names


def _optimizer_state(module: nn.Module, layers: Sequence[Layer], optimizer: torch.optim.Optimizer | None,
                     ties: Sequence[Tie]) -> dict[str, torch.Tensor]:
    if optimizer is None:
        return {}
    names = _parameter_names(module, layers)
    out: dict[str, torch.Tensor] = {}
    for index, entry in optimizer.state_dict()["state"].items():
        layer, name = names[index]
        for key, value in entry.items():
            if value is not None and saved_by(layer, name, ties):
                out[f"{name}/{key}"] = torch.as_tensor(value).detach().cpu()
    return out


def write_shard(directory: Path, step: int, rank: int, state: State) -> ShardEntry:
    """Write ``rank``'s shard of the checkpoint after ``step`` steps (atomically) and describe it."""
    folder = step_folder(directory, step)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank-{rank}.pt"
    partial = path.with_suffix(".pt.partial")
    torch.save(state, partial)
    partial.replace(path)
    keys = tuple(state.get("model", {}))
    return ShardEntry(path.name, rank, path.stat().st_size, _sha256(path), keys)


def write_manifest(directory: Path, step: int, shards: Sequence[ShardEntry], fields: dict[str, Any],
                   keep: int | None) -> Path:
    """Rank 0, once every shard is written: the manifest (last, atomically), then prune to the
    newest ``keep`` whole checkpoints (None keeps all). Returns the checkpoint's folder."""
    folder = step_folder(directory, step)
    manifest = {"format": _FORMAT, "step": step, "created": time.time(), **fields,
                "shards": [asdict(s) for s in sorted(shards, key=lambda s: s.rank)]}
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1))
    if keep is not None:
        for old in _whole_folders(Path(directory))[keep:]:
            (old / MANIFEST).unlink()  # no longer whole, even if the rest cannot be removed
            shutil.rmtree(old, ignore_errors=True)
        for unfinished in Path(directory).glob("step-*"):  # saves that never got their manifest
            if unfinished.name < folder.name and not (unfinished / MANIFEST).exists():
                shutil.rmtree(unfinished, ignore_errors=True)
    return folder


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _checked_sha256(path: Path) -> str:
    """:func:`_sha256` of a shard being checked, read once per process while the file keeps its size
    and modification time: a resume checks every shard before launch (the CLI, then the launcher), and
    each shard again when a rank reads it, in its own process."""
    status = path.stat()
    key = (str(path.resolve()), status.st_size, status.st_mtime_ns)
    if key not in _CHECKED:
        _CHECKED[key] = _sha256(path)
    return _CHECKED[key]


_CHECKED: dict[tuple[str, int, int], str] = {}
""":func:`_checked_sha256`'s results, by file, size and modification time (nanoseconds)."""


# ---- reading --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A whole checkpoint: its folder and manifest."""

    folder: Path
    manifest: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def shards(self) -> list[ShardEntry]:
        return [ShardEntry(s["file"], s["rank"], s["bytes"], s["sha256"], tuple(s["keys"]))
                for s in self.manifest["shards"]]

    def check_model(self, graph: LayerGraph) -> None:
        """Raises UserError when the checkpoint is of another model (other layers or parameters)."""
        if self.manifest.get("fingerprint") != graph.fingerprint():
            raise UserError(f"checkpoint {self.folder} is of model {self.manifest.get('model')!r} (fingerprint "
                            f"{self.manifest.get('fingerprint')}), not of this {graph.name!r} ({graph.fingerprint()}); "
                            "resume with the model it was trained with, or start without --resume")

    def load(self, keys: Sequence[str], *, rank: int | None = None) -> State:
        """The tensors ``keys`` (model names) and their optimizer state from whichever shards hold
        them, and ``rank``'s RNG state when given (same layout only)."""
        wanted = set(keys)
        state: State = {"model": {}, "optimizer": {}, "rng": {}}
        for shard in self.shards:
            if not wanted & set(shard.keys) and shard.rank != rank:
                continue
            data = self._read(shard)
            state["model"].update({k: v for k, v in data.get("model", {}).items() if k in wanted})
            state["optimizer"].update({k: v for k, v in data.get("optimizer", {}).items()
                                       if k.rpartition("/")[0] in wanted})
            if shard.rank == rank:
                state["rng"] = data.get("rng", {})
        missing = wanted - set(state["model"])
        if missing:
            raise UserError(f"checkpoint {self.folder} lacks {len(missing)} of the layers' tensors (e.g. "
                            f"{sorted(missing)[0]!r}); resume with the model it was trained with")
        return state

    def verify(self) -> None:
        """Raises UserError unless every shard the manifest lists is there with its size and SHA-256."""
        for shard in self.shards:
            self._check(shard)

    def _check(self, shard: ShardEntry) -> None:
        path = self.folder / shard.file
        if not path.is_file() or path.stat().st_size != shard.bytes or _checked_sha256(path) != shard.sha256:
            raise UserError(f"checkpoint shard {path} is missing, truncated or altered (its size or SHA-256 differs "
                            "from the manifest); resume from another checkpoint (delete this folder)")

    def _read(self, shard: ShardEntry) -> dict[str, dict[str, torch.Tensor]]:
        path = self.folder / shard.file
        self._check(shard)
        try:
            data: dict[str, dict[str, torch.Tensor]] = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:
            raise UserError(f"checkpoint shard {path} cannot be read safely ({type(error).__name__}); resume from "
                            "another checkpoint") from None
        return data


def _whole_folders(directory: Path) -> list[Path]:
    """Checkpoint folders that have a manifest, newest first."""
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.glob("step-*") if (p / MANIFEST).is_file()), reverse=True)


def open_checkpoint(folder: str | Path) -> Checkpoint:
    """The checkpoint in its ``step-…`` folder, as its manifest describes it; each shard is checked
    when it is read (:meth:`Checkpoint.load`). For a folder :func:`newest_checkpoint` chose."""
    folder = Path(folder)
    try:
        return Checkpoint(folder, json.loads((folder / MANIFEST).read_text()))
    except (OSError, ValueError) as error:
        raise UserError(f"checkpoint {folder} cannot be read ({error}); resume from another checkpoint") from None


def newest_checkpoint(directory: str | Path) -> Checkpoint | None:
    """The newest whole checkpoint in ``directory`` (or ``directory`` itself when it is a checkpoint's
    ``step-…`` folder), or None. Folders without a manifest, with one that does not parse, or with a
    shard missing, truncated or altered (size or SHA-256; every shard is read) are skipped with a log
    line saying why, so an older checkpoint is used instead."""
    directory = Path(directory)
    folders = [directory] if (directory / MANIFEST).is_file() else _whole_folders(directory)
    for folder in folders:
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            if manifest.get("format") != _FORMAT:
                raise ValueError(f"format {manifest.get('format')}")
            checkpoint = Checkpoint(folder, manifest)
            checkpoint.verify()  # a UserError is a ValueError
            return checkpoint
        except (ValueError, OSError, KeyError, TypeError) as error:
            log.warning("skipping checkpoint %s: %s", folder, error)
    return None


def restore_stage(state: State, module: nn.Module, layers: Sequence[Layer],
                  optimizer: torch.optim.Optimizer | None, ties: Sequence[Tie] = ()) -> None:
    """Load ``state`` (from :meth:`Checkpoint.load`) into a stage: parameters and buffers by the
    model's names (a tied tensor's copy by its first name, ``ties``), the optimizer state of each
    parameter, and the RNG state when present."""
    model = state["model"]
    for layer, child in zip(layers, module.children(), strict=True):
        local = {k: model[saved_name(layer.qualified(k), ties)] for k in child.state_dict()}
        child.load_state_dict(local, strict=True)
    if optimizer is not None and state["optimizer"]:
        names = [saved_name(name, ties) for _, name in _parameter_names(module, layers)]
        _restore_optimizer(state["optimizer"], names, optimizer)
    if "torch" in state["rng"]:
        torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["rng"]["cuda"])


def _restore_optimizer(saved: dict[str, torch.Tensor], names: list[str], optimizer: torch.optim.Optimizer) -> None:
    current = optimizer.state_dict()
    entries: dict[int, dict[str, torch.Tensor]] = {}
    for index, name in enumerate(names):
        keys = {k.rpartition("/")[2]: v for k, v in saved.items() if k.rpartition("/")[0] == name}
        if keys:
            entries[index] = keys
    optimizer.load_state_dict({"state": entries, "param_groups": current["param_groups"]})


# ---- export ---------------------------------------------------------------------------------------


def export_checkpoint(directory: str | Path, out: str | Path, *, with_heads: bool = False
                      ) -> tuple[Checkpoint, int, int]:
    """Write the newest whole checkpoint's model state, one ``state_dict`` under the model's own
    names (what the original module loads with ``load_state_dict(..., strict=True)``), to ``out``;
    a tied tensor under each of its names, one tensor that ``torch.save`` writes once.
    Local learning's auxiliary heads (``aux{k}.<name>``) are left out unless ``with_heads``; they
    then follow the model's tensors, in name order.

    Returns:
        The checkpoint, the number of tensors and their bytes.

    Raises:
        UserError: no whole checkpoint in ``directory``, or a damaged shard.
    """
    checkpoint = newest_checkpoint(directory)
    if checkpoint is None:
        raise UserError(f"no whole checkpoint in {directory}; train with --checkpoint-dir {directory} first")
    keys = [k for shard in checkpoint.shards for k in shard.keys]
    model = checkpoint.load(keys)["model"]
    first = {name: names[0] for names in checkpoint.manifest.get("ties", []) for name in names}
    ordered = {k: model[first.get(k, k)] for k in checkpoint.manifest.get("state_keys", keys)
               if first.get(k, k) in model}
    if with_heads:
        ordered.update({k: model[k] for k in sorted(model) if k not in ordered})
    buffer = Path(out)
    buffer.parent.mkdir(parents=True, exist_ok=True)
    partial = buffer.with_name(buffer.name + ".partial")
    torch.save(ordered, partial)
    partial.replace(buffer)
    return checkpoint, len(ordered), sum(t.numel() * t.element_size() for t in ordered.values())
