"""Draft sources behind one narrow protocol: propose candidate tokens for the target to verify."""
from __future__ import annotations

from typing import Callable, NamedTuple, Protocol

import torch

from .kv import CachedDecoder
from .sampling import Sampler


class Draft(NamedTuple):
    tokens: list[int]
    probs: torch.Tensor | None = None   # (len(tokens), vocab): what each token was sampled from; None when not sampled
    confidences: list[float] | None = None  # the draft model's probability of each token; None for model-free drafts


class CandidateGenerator(Protocol):
    """What the decoding loop needs from a draft source (cf. transformers' ``CandidateGenerator``)."""

    passes: int  # forward passes of a draft model, 0 for model-free sources

    def get_candidates(self, tokens: list[int], num_candidates: int, sampler: Sampler | None,
                       keep_drafting: Callable[[list[float]], bool] | None = None) -> Draft:
        """Up to `num_candidates` tokens to follow `tokens`. A source with confidences asks `keep_drafting` (given
        the confidences so far) after each token whether to draft another."""
        ...


class AssistantCandidates:
    """A smaller model with the target's tokenizer drafts autoregressively, with its own KV cache."""

    def __init__(self, assistant: CachedDecoder, eos_token_ids: set[int]):
        self.assistant = assistant
        self.eos_token_ids = eos_token_ids

    @property
    def passes(self) -> int:
        return self.assistant.passes

    def get_candidates(self, tokens, num_candidates, sampler, keep_drafting=None):
        candidates: list[int] = []
        probs: list[torch.Tensor] = []
        confidences: list[float] = []
        for _ in range(num_candidates):
            logits = self.assistant.logits(tokens + candidates)[0]
            if sampler is None:
                token = int(logits.argmax())
                confidences.append(float(torch.softmax(logits, -1)[token]))
            else:
                q = sampler.probs(logits)
                token = sampler.sample(q)
                probs.append(q)
                confidences.append(float(q[token]))
            candidates.append(token)
            if token in self.eos_token_ids:  # nothing can follow an accepted EOS
                break
            if keep_drafting is not None and not keep_drafting(confidences):
                break
        return Draft(candidates, torch.stack(probs) if probs else None, confidences)


class PromptLookupCandidates:
    """Model-free drafts (prompt lookup decoding): find the latest earlier occurrence of the sequence's last n-gram
    (n from `max_ngram_size` down to 1) in the prompt and the text generated so far, and propose what followed it."""

    passes = 0

    def __init__(self, max_ngram_size: int = 3):
        self.max_ngram_size = max_ngram_size

    def get_candidates(self, tokens, num_candidates, sampler, keep_drafting=None):
        return Draft(lookup_continuation(tokens, num_candidates, min_ngram=1, max_ngram=self.max_ngram_size))


def lookup_continuation(tokens: list[int], limit: int, *, min_ngram: int = 2, max_ngram: int = 4) -> list[int]:
    """What followed the latest earlier occurrence of the sequence's last n-gram (n from `max_ngram` down to
    `min_ngram`), at most `limit` tokens; [] when the context does not repeat itself."""
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        ngram = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == ngram:
                return tokens[start + n:start + n + limit]
    return []


class AssistantWithLookupCandidates:
    """Prompt lookup where the context repeats itself, the assistant everywhere else, both in one draft: a draft
    starts from a lookup continuation when the last 2 to 4 tokens occurred before (in the prompt or the text so far:
    a summary or an answer quoting its passage copies runs of it), and otherwise from the assistant, whose draft is
    then extended by a lookup continuation wherever it ends on a repeated n-gram.

    Lookup tokens cost no model pass. Each carries, as its confidence, how often a lookup token was accepted once
    the ones before it were (learnt online from what the target kept, a prior of 1 in 2), so the adaptive schedule
    prices both kinds alike. With sampling a lookup token is a deterministic proposal (q is one-hot on it), the
    assistant's are drawn from q: the acceptance rule keeps the output exact for either.
    """

    def __init__(self, assistant: CandidateGenerator, eos_token_ids: set[int], *,
                 min_ngram: int = 2, max_ngram: int = 4):
        self.assistant = assistant
        self.eos = eos_token_ids
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.lookup_accepted, self.lookup_tried = 1.0, 2.0
        self._last: tuple[int, list[int], int] | None = None   # (context length, candidates, lookup start)

    @property
    def passes(self) -> int:
        return self.assistant.passes

    @property
    def lookup_confidence(self) -> float:
        return self.lookup_accepted / self.lookup_tried

    def _learn(self, tokens: list[int]) -> None:
        """How many of the last draft's lookup tokens the target kept, read off the sequence that came back."""
        if self._last is None:
            return
        length, candidates, start = self._last
        self._last = None
        kept = 0
        while kept < len(candidates) and length + kept < len(tokens) and tokens[length + kept] == candidates[kept]:
            kept += 1
        lookup = len(candidates) - start
        if lookup == 0 or kept < start:   # the lookup part was never reached
            return
        accepted = kept - start
        self.lookup_accepted += accepted
        self.lookup_tried += accepted + (accepted < lookup)

    def _extend(self, tokens: list[int], draft: list[int], limit: int, keep_drafting,
                confidences: list[float] | None) -> list[int]:
        """A lookup continuation after `tokens + draft`, cut where the schedule would stop drafting (`confidences`:
        those of the draft so far, extended in place; None when the drafts carry none)."""
        more = lookup_continuation(tokens + draft, limit, min_ngram=self.min_ngram, max_ngram=self.max_ngram)
        out = []
        for token in more:
            out.append(token)
            if confidences is not None:
                confidences.append(self.lookup_confidence)
                if keep_drafting is not None and not keep_drafting(confidences):
                    break
        return out

    def get_candidates(self, tokens, num_candidates, sampler, keep_drafting=None):
        self._learn(tokens)
        confidences: list[float] = []
        lookup = self._extend(tokens, [], num_candidates, keep_drafting, confidences)
        if lookup:   # deterministic proposals: no distributions to carry
            draft, start = Draft(lookup, None, confidences), 0
        else:
            draft = self.assistant.get_candidates(tokens, num_candidates, sampler, keep_drafting)
            start = len(draft.tokens)
            confidences = None if draft.confidences is None else list(draft.confidences)
            more = (self._extend(tokens, draft.tokens, num_candidates - start, keep_drafting, confidences)
                    if num_candidates > start and not (draft.tokens and draft.tokens[-1] in self.eos) else [])
            probs = draft.probs
            if probs is not None and more:   # a lookup token's proposal is one-hot on it
                one_hot = torch.zeros(len(more), probs.shape[-1], device=probs.device)
                one_hot[torch.arange(len(more)), torch.tensor(more)] = 1.0
                probs = torch.cat([probs, one_hot])
            draft = Draft(draft.tokens + more, probs, confidences)
        self._last = (len(tokens), draft.tokens, start)
        return draft
