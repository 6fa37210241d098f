"""The decoding engine: the loop, draft sources, window schedules, sampling, cached decoding. Imports torch and transformers' model classes only."""
