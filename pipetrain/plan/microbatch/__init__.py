"""Micro-batch planners: how each stage splits the batch."""
