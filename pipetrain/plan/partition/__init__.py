"""Partitioners: which layers form each stage."""

from pipetrain.plan.partition.balanced import balanced_partition

__all__ = ["balanced_partition"]
