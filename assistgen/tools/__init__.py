"""The command line (`python -m assistgen`), its benchmarks, and what they share."""
