"""Benchmark scripts and their inputs (run from the repository root: python -m bench.scripts.NAME)."""
