"""assistgen: see, measure and explain assisted generation (speculative decoding)."""
from .engine.decoding import GenerationResult, Step, generate

__all__ = ["generate", "GenerationResult", "Step"]
