"""Draft sources behind one narrow protocol: propose candidate tokens for the target to verify."""
from __future__ import annotations

from typing import Protocol

import torch

from .kv import CachedDecoder
from .sampling import Sampler


class CandidateGenerator(Protocol):
    """What the decoding loop needs from a draft source (cf. transformers' ``CandidateGenerator``)."""

    passes: int  # forward passes of a draft model, 0 for model-free sources

    def get_candidates(self, tokens: list[int], num_candidates: int,
                       sampler: Sampler | None) -> tuple[list[int], torch.Tensor | None]:
        """Up to `num_candidates` tokens to follow `tokens`, and ``(len(candidates), vocab)`` probabilities they were
        sampled from (``None`` for greedy or deterministic candidates)."""
        ...


class AssistantCandidates:
    """A smaller model with the target's tokenizer drafts autoregressively, with its own KV cache."""

    def __init__(self, assistant: CachedDecoder, eos_token_ids: set[int]):
        self.assistant = assistant
        self.eos_token_ids = eos_token_ids

    @property
    def passes(self) -> int:
        return self.assistant.passes

    def get_candidates(self, tokens, num_candidates, sampler):
        candidates: list[int] = []
        probs: list[torch.Tensor] = []
        for _ in range(num_candidates):
            logits = self.assistant.logits(tokens + candidates)[0]
            if sampler is None:
                token = int(logits.argmax())
            else:
                q = sampler.probs(logits)
                token = sampler.sample(q)
                probs.append(q)
            candidates.append(token)
            if token in self.eos_token_ids:  # nothing can follow an accepted EOS
                break
        return candidates, (torch.stack(probs) if probs else None)


class PromptLookupCandidates:
    """Model-free drafts (prompt lookup decoding): find the latest earlier occurrence of the sequence's last n-gram
    (n from `max_ngram_size` down to 1) in the prompt and the text generated so far, and propose what followed it."""

    passes = 0

    def __init__(self, max_ngram_size: int = 3):
        self.max_ngram_size = max_ngram_size

    def get_candidates(self, tokens, num_candidates, sampler):
        for n in range(min(self.max_ngram_size, len(tokens) - 1), 0, -1):
            ngram = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start:start + n] == ngram:
                    return tokens[start + n:start + n + num_candidates], None
        return [], None
