"""What several benchmarks share: model and cluster builders, the torch baselines, measured-run setup.

Benchmark scripts import from here and from :mod:`harness` only, never from each other; nothing
here imports a benchmark script.
"""
