"""Partitioners: which layers form each stage."""

from pipetrain.planners.partition.balanced import balanced_partition

__all__ = ["balanced_partition"]
