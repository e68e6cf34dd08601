"""pipetrain: pipeline-parallel training for PyTorch, planned automatically.

Importing pipetrain does no I/O, probes no devices and starts no processes.
"""

__version__ = "0.1.0"
