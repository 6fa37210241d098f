"""Draft sources behind one narrow protocol: propose candidate tokens for the target to verify."""
from __future__ import annotations

import math
from dataclasses import dataclass
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

    def update(self, emitted: int, draft_s: float, verify_s: float) -> None:
        """After each step: the tokens it emitted, and its measured seconds of drafting and of the target's pass."""
        ...


NEW_ID_WINDOW = 16   # answer tokens after one never seen before, above the common ids, that draft over every id


def draft_vocabulary(tokens: list[int], prompt_length: int, common_vocab: int,
                     end_ids: set[int]) -> tuple[int, ...] | None:
    """The ids above the first `common_vocab` that a greedy draft after `tokens` chooses among besides them: those
    the sequence has used and the end ids. None (every id) while the answer is empty, and for `NEW_ID_WINDOW` tokens
    after an answer token above the common ids that the sequence had not used before (text in another script or
    language, whose next tokens are likely new too). Special tokens (from the first end id up, where a BPE vocabulary
    keeps them) are never new text."""
    if len(tokens) <= prompt_length:
        return None
    first_end = min(end_ids, default=None)
    special_from = first_end if first_end is not None and first_end >= common_vocab else None
    for i in range(max(prompt_length, len(tokens) - NEW_ID_WINDOW), len(tokens)):
        token = tokens[i]
        if common_vocab <= token and (special_from is None or token < special_from) and token not in tokens[:i]:
            return None
    return tuple(sorted({t for t in tokens if t >= common_vocab} | {e for e in end_ids if e >= common_vocab}))


class AssistantCandidates:
    """A smaller model with the target's tokenizer drafts autoregressively, with its own KV cache.

    Where the model's int8 output layer keeps its first ids apart (`CachedDecoder.common_vocab`: a head over 151,936
    ids packs its first 65,536, those a BPE vocabulary merged first, as a block of its own), a greedy draft reads that
    block and the rows of the few other ids the sequence has used (`draft_vocabulary`): 77 MB fewer of the 0.5B's
    494 MB a pass; it reads the whole head while the answer is empty or has just used an id new to it. The target
    verifies every draft over its whole vocabulary, so this changes which drafts are proposed, never the output."""

    def __init__(self, assistant: CachedDecoder, eos_token_ids: set[int]):
        self.assistant = assistant
        self.eos_token_ids = eos_token_ids
        self.common_vocab = assistant.common_vocab

    @property
    def passes(self) -> int:
        return self.assistant.passes

    def prefill(self, tokens: list[int]) -> None:
        """Read `tokens` into the assistant's KV cache (one pass), ahead of drafting after them."""
        self.assistant.logits(tokens)

    def get_candidates(self, tokens, num_candidates, sampler, keep_drafting=None):
        candidates: list[int] = []
        probs: list[torch.Tensor] = []
        confidences: list[float] = []
        extra = None
        if sampler is None and self.common_vocab is not None:
            extra = draft_vocabulary(tokens, self.assistant.prefix_length, self.common_vocab, self.eos_token_ids)
        for _ in range(num_candidates):
            logits = self.assistant.logits(tokens + candidates, extra_ids=extra)[0]
            if sampler is None:
                index = int(logits.argmax())
                confidences.append(float(torch.softmax(logits, -1)[index]))
                token = index if extra is None or index < self.common_vocab else extra[index - self.common_vocab]
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

    def update(self, emitted, draft_s, verify_s):
        pass


class PromptLookupCandidates:
    """Model-free drafts (prompt lookup decoding): find the latest earlier occurrence of the sequence's last n-gram
    (n from `max_ngram_size` down to 1) in the prompt and the text generated so far, and propose what followed it."""

    passes = 0

    def __init__(self, max_ngram_size: int = 3):
        self.max_ngram_size = max_ngram_size

    def get_candidates(self, tokens, num_candidates, sampler, keep_drafting=None):
        return Draft(lookup_continuation(tokens, num_candidates, min_ngram=1, max_ngram=self.max_ngram_size))

    def update(self, emitted, draft_s, verify_s):
        pass


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
    prices both kinds alike. With a `PaybackGate`, the assistant waits until its prompt pass can pay back (lookup
    alone until then). With sampling a lookup token is a deterministic proposal (q is one-hot on it), the
    assistant's are drawn from q: the acceptance rule keeps the output exact for either.
    """

    def __init__(self, assistant: CandidateGenerator, eos_token_ids: set[int], *,
                 min_ngram: int = 2, max_ngram: int = 4, gate: PaybackGate | None = None):
        self.assistant = assistant
        self.gate = gate   # None: the assistant from the first step; else only once its prompt pass pays back
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
        if self.gate is not None:
            self.gate.begin(tokens)
        confidences: list[float] = []
        lookup = self._extend(tokens, [], num_candidates, keep_drafting, confidences)
        if lookup:   # deterministic proposals: no distributions to carry
            draft, start = Draft(lookup, None, confidences), 0
        elif self.gate is not None and not self.gate.ready(tokens):   # a plain step
            draft, start = Draft([]), 0
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

    def update(self, emitted, draft_s, verify_s):
        self.assistant.update(emitted, draft_s, verify_s)
        if self.gate is not None:
            self.gate.update(emitted, draft_s, verify_s)


# Before this machine has measured them: how many tokens an answer is taken to run before it has shown its length,
# and the share of lookup-only decoding's seconds per token that drafting with the assistant saves. A measured share
# counts at least MIN_SAVING, so that one prompt where the assistant lost cannot lock it out of the next. The prior
# length is a bet, taken only on a prompt pass that costs at most PRIOR_RISK_TOKENS tokens of lookup-only decoding
# (a short prompt), so that a wrong guess loses at most that; a dearer pass waits until the answer so far has run
# long enough to pay for it on its own (a long prompt with a short answer then never pays it).
PRIOR_ANSWER_TOKENS = 8
PRIOR_RISK_TOKENS = 2
PRIOR_SAVING = 0.3
MIN_SAVING = 0.1
# Past that bet, an answer is expected to run on for LATE_START_SHARE of what it has run so far: if its point is equally
# likely anywhere in its run, it runs at least that much longer two times in three (as long again: one time in two)
LATE_START_SHARE = 0.5
# Once started, the assistant keeps drafting only while it pays on this answer (`Earnings`): judged after
# JUDGE_AFTER_STEPS steps of its own, it is set aside for SET_ASIDE_STEPS steps where they ran at less than
# SET_ASIDE_BELOW of the target alone's rate, then tried again, each later time set aside twice as long. Steps near
# break-even are left alone: an assistant's gains come in bursts (a code block, a quoted phrase) that a stricter rule
# forfeits (docs/history.md, 2026-12-07 night).
JUDGE_AFTER_STEPS = 6
SET_ASIDE_BELOW = 0.7
SET_ASIDE_STEPS = 8


class Rate:
    """Seconds per token, as decayed sums of seconds and tokens."""

    def __init__(self, decay: float = 0.7):
        self.decay, self.seconds, self.tokens = decay, 0.0, 0.0

    def add(self, seconds: float, tokens: int) -> None:
        self.seconds = self.decay * self.seconds + seconds
        self.tokens = self.decay * self.tokens + tokens

    @property
    def value(self) -> float | None:
        return self.seconds / self.tokens if self.tokens else None


class Earnings:
    """How the assistant's steps on this answer, since it last (re)started, compare with the target alone: the
    seconds a plain pass per token would have taken for the tokens they emitted (`plain_s`, as measured; lookup-only
    decoding, what replaces the assistant, costs at most that, since lookup drafts only where it pays) against the
    seconds they took, the assistant's prompt pass left out (paid already, whatever comes next). Judged after
    `JUDGE_AFTER_STEPS` steps of its own: where they ran at less than `SET_ASIDE_BELOW` of the target alone's rate, it
    is set aside (`drafting` False) for `SET_ASIDE_STEPS` steps, then drafts again on a fresh record, each later time
    set aside twice as long."""

    def __init__(self):
        self.plain_s = self.seconds = 0.0   # the target alone's seconds for the same tokens; the steps' own
        self.steps = 0
        self.set_aside_after: list[int] = []   # tokens generated when it was set aside, in order
        self._idle, self._interval = 0, SET_ASIDE_STEPS

    @property
    def drafting(self) -> bool:
        return self._idle == 0

    def add(self, emitted: int, seconds: float, plain_s: float, generated: int) -> None:
        """One step the assistant drafted: `emitted` tokens in `seconds` (a plain pass: `plain_s`), the answer
        `generated` tokens long after it."""
        self.plain_s += emitted * plain_s
        self.seconds += seconds
        self.steps += 1
        if self.steps >= JUDGE_AFTER_STEPS and self.plain_s < SET_ASIDE_BELOW * self.seconds:
            self.set_aside_after.append(generated)
            self._idle, self._interval = self._interval, 2 * self._interval

    def idle(self) -> None:
        """One step without the assistant, while it is set aside."""
        self._idle = max(0, self._idle - 1)
        if self._idle == 0:
            self.plain_s = self.seconds = 0.0
            self.steps = 0


class PaybackCosts:
    """What an assistant's prompt pass costs and what drafting with it saves, as measured on this machine; lent from
    one generation to the next (a pair's runs of one task share one).

    - `target_prompt_s`: seconds per token the target's prompt pass read (the first step's);
    - `assistant_over_target`: the assistant's prompt pass over the target's, per token (first the parameter ratio);
    - `lookup`: seconds per emitted token of steps drafted by lookup alone, or not at all (the prompt step left out);
    - `saving_share`: the share of those seconds that drafting with the assistant saved, as the last generation that
      drafted with it measured (against its own lookup-only steps, or where it had none, the lent `lookup`; the
      assistant's prompt pass left out);
    - `plain`: seconds of a plain target pass (one row: a step with nothing to verify), what an assistant that
      does not pay is judged against (`Earnings`).
    """

    def __init__(self, assistant_over_target: float):
        self.assistant_over_target = assistant_over_target
        self.target_prompt_s: float | None = None
        self.lookup = Rate()
        self.saving_share: float | None = None
        self.plain = Rate(decay=0.9)

    @property
    def known(self) -> bool:
        """Whether a generation has measured the target's prompt pass and lookup-only decoding."""
        return self.target_prompt_s is not None and self.lookup.value is not None

    def to_dict(self) -> dict:
        return {"assistant_over_target": self.assistant_over_target, "target_prompt_s": self.target_prompt_s,
                "saving_share": self.saving_share, "lookup": [self.lookup.seconds, self.lookup.tokens],
                "plain": [self.plain.seconds, self.plain.tokens]}

    @classmethod
    def from_dict(cls, state: dict) -> PaybackCosts:
        """Costs from `to_dict`'s state (a ValueError, TypeError or KeyError for anything else)."""
        costs = cls(float(state["assistant_over_target"]))
        costs.target_prompt_s = None if state["target_prompt_s"] is None else float(state["target_prompt_s"])
        costs.saving_share = None if state["saving_share"] is None else float(state["saving_share"])
        costs.lookup.seconds, costs.lookup.tokens = (float(v) for v in state["lookup"])
        costs.plain.seconds, costs.plain.tokens = (float(v) for v in state["plain"])
        return costs

    def saving_per_token(self, lookup_s: float | None) -> float | None:
        """Seconds the assistant saves per token against lookup-only decoding at `lookup_s` seconds a token."""
        if lookup_s is None:
            return None
        share = PRIOR_SAVING if self.saving_share is None else max(MIN_SAVING, self.saving_share)
        return share * lookup_s


@dataclass(frozen=True)
class AssistantStart:
    """When the assistant started beside prompt lookup, and the figures the gate decided on (`PaybackGate`)."""
    prompt_tokens: int | None
    started_after: int | None            # tokens generated when the assistant started; None: it never did
    generated: int                       # the answer's length
    assistant_prompt_s: float | None = None   # its prompt pass, as measured, once it started
    assistant_prompt_tokens: int | None = None   # the tokens that pass read (a kept beginning left out: `prefix_cache`)
    # the last refusal: the estimated prompt pass (and the tokens it would read), the seconds the assistant saves a
    # token, and the tokens the answer could still be expected to run; None when the gate never refused on a priced
    # pass
    estimated_prompt_s: float | None = None
    estimated_prompt_tokens: int | None = None
    saving_per_token_s: float | None = None
    expected_tokens: int | None = None
    # tokens generated each time the assistant was set aside, its steps having run at less than `SET_ASIDE_BELOW` of
    # the target alone's rate (`Earnings`); it drafted again after a pause, unless the answer ended first
    set_aside_after: tuple[int, ...] = ()

    @property
    def started(self) -> bool:
        return self.started_after is not None

    @property
    def refused(self) -> bool:
        return self.estimated_prompt_s is not None

    @property
    def break_even_tokens(self) -> int | None:
        """Tokens of saving that pay back the estimated prompt pass."""
        return None if not self.refused else math.ceil(self.estimated_prompt_s / self.saving_per_token_s)

    def to_dict(self) -> dict:
        out = {"prompt_tokens": self.prompt_tokens, "started_after": self.started_after}
        if self.assistant_prompt_s is not None:
            out.update(assistant_prompt_s=round(self.assistant_prompt_s, 4),
                       assistant_prompt_tokens=self.assistant_prompt_tokens)
        if self.refused:
            out.update(estimated_prompt_s=round(self.estimated_prompt_s, 4),
                       estimated_prompt_tokens=self.estimated_prompt_tokens,
                       saving_per_token_s=round(self.saving_per_token_s, 5),
                       break_even_tokens=self.break_even_tokens, expected_tokens=self.expected_tokens)
        if self.set_aside_after:
            out.update(set_aside_after=list(self.set_aside_after))
        return out


class PaybackGate:
    """Whether to pay the assistant's prompt pass yet: only once the tokens the answer can still be expected to run
    (`LATE_START_SHARE` of what it has run so far, at most what the budget leaves; at least `PRIOR_ANSWER_TOKENS`
    where that pass costs no more than `PRIOR_RISK_TOKENS` tokens) save more than that pass costs. Until then drafts come from
    lookup alone; then the assistant reads the prompt and the answer so far in one pass (`prefill`, timed with
    `clock`). The decoding loop feeds every step's measured seconds through `update`: the first step's target pass
    read the prompt, the later ones price lookup-only and assisted decoding, and judge what the assistant earns on
    this answer once started (`Earnings`: set aside while it does not pay). Prompt passes are priced by the tokens
    they read: `skipped` says how many of the prompt's first tokens the target's and the assistant's take from
    `prefix_cache` instead."""

    def __init__(self, prefill: Callable[[list[int]], None], costs: PaybackCosts, budget: int,
                 clock: Callable[[], float], skipped: tuple[int, int] = (0, 0)):
        self.prefill, self.costs, self.budget, self.clock = prefill, costs, budget, clock
        self.skipped = skipped
        self.prompt_tokens: int | None = None
        self.started_after: int | None = None              # tokens generated when the assistant started
        self.assistant_prompt: tuple[float, int] | None = None   # its prompt pass: (seconds, tokens)
        # the last refusal: (estimated s, tokens, saving per token, tokens the answer could still be expected to run)
        self.refused: tuple[float, int, float, int] | None = None
        self._prompt_s: float | None = None                # this generation's target prompt pass, per token
        self._lookup, self._assisted = Rate(), Rate()      # this generation's own steps
        self._step_started: bool | None = None             # whether the assistant had started when this step's draft
                                                           # call began; None: no draft call this step
        self._spent = 0.0                                  # seconds of this step spent on the assistant's prompt
        self._generated = 0                                # tokens generated when this step's draft call began
        self._plain = False                                # `ready` said no: this step's target pass reads one row
        self.earnings = Earnings()

    @property
    def started(self) -> bool:
        return self.started_after is not None

    def begin(self, tokens: list[int]) -> None:
        """At the start of each step's draft call."""
        if self.prompt_tokens is None:
            self.prompt_tokens = len(tokens)
        self._generated = len(tokens) - self.prompt_tokens
        self._step_started, self._spent, self._plain = self.started and self.earnings.drafting, 0.0, False

    def update(self, emitted: int, draft_s: float, verify_s: float) -> None:
        """After each step: its `emitted` tokens and measured seconds of drafting and of the target's pass. A step
        without a draft call (the budget's last token) prices neither kind."""
        started, self._step_started = self._step_started, None
        if started is None:
            return
        if self._prompt_s is None:   # the first target pass read the prompt
            if self.started_after == 0 and self.costs.plain.value is not None:   # and the assistant's first drafts,
                verify_s = max(verify_s - self.costs.plain.value, verify_s / 2)   # in a pass priced as a plain one
            self._prompt_s = self.costs.target_prompt_s = verify_s / self._read(self.prompt_tokens, target=True)
            if self.assistant_prompt is not None:
                seconds, count = self.assistant_prompt
                self.costs.assistant_over_target = seconds / count / self._prompt_s
            return
        seconds = draft_s - self._spent + verify_s
        for rate in (self._assisted,) if started else (self._lookup, self.costs.lookup):
            rate.add(seconds, emitted)
        if self._plain:
            self.costs.plain.add(verify_s, 1)
        if started and self.costs.plain.value is not None:
            self.earnings.add(emitted, seconds, self.costs.plain.value, self._generated + emitted)
        elif not started and self.started:
            self.earnings.idle()
        # this answer's own lookup-only steps, or where it has none yet (the assistant drafted from its first step),
        # the rate lent by earlier answers
        lookup = self._lookup.value if self._lookup.value is not None else self.costs.lookup.value
        if lookup and self._assisted.value:
            self.costs.saving_share = 1 - self._assisted.value / lookup

    def ready(self, tokens: list[int]) -> bool:
        """Whether the assistant drafts this step (asked where lookup has nothing to propose, so a no makes it a plain
        step, one row for the target: the pass `Earnings` prices tokens at): started already, or starting now because
        it pays. Its prompt pass then runs here, and its drafting waits for the next step (so that no step's drafting
        seconds hold a prompt pass), except on the first step, whose target pass reads the prompt too. Once started,
        it drafts unless it is set aside for not earning on this answer (`Earnings`)."""
        drafts = self._drafts_now(tokens)
        self._plain = not drafts
        return drafts

    def _drafts_now(self, tokens: list[int]) -> bool:
        if self.started:
            return self.earnings.drafting
        if not self.pays(tokens):
            return False
        begun = self.clock()
        self.prefill(tokens)
        self._spent = self.clock() - begun
        self.assistant_prompt = (self._spent, self._read(len(tokens)))
        self.started_after = len(tokens) - self.prompt_tokens
        return self.started_after == 0

    def pays(self, tokens: list[int]) -> bool:
        """Whether the assistant's prompt pass over `tokens` pays back on what the answer can still be expected to run:
        False while the target's prompt pass or lookup's seconds per token are still unmeasured."""
        generated = len(tokens) - self.prompt_tokens
        prompt_s = self._prompt_s if self._prompt_s is not None else self.costs.target_prompt_s
        lookup_s = self._lookup.value if self._lookup.value is not None else self.costs.lookup.value
        saving = self.costs.saving_per_token(lookup_s)
        if prompt_s is None or saving is None:
            return False
        read = self._read(len(tokens))
        cost = self.costs.assistant_over_target * prompt_s * read
        answer = (max(generated, PRIOR_ANSWER_TOKENS) if cost <= PRIOR_RISK_TOKENS * lookup_s
                  else math.floor(LATE_START_SHARE * generated))
        expected = min(self.budget - generated, answer)
        if expected * saving >= cost:
            return True
        self.refused = (cost, read, saving, expected)
        return False

    def _read(self, tokens: int, target: bool = False) -> int:
        """The tokens a prompt pass over `tokens` reads, its kept prefix left out."""
        skipped = self.skipped[0] if target else self.skipped[1]
        return tokens - skipped if skipped < tokens else tokens

    def decision(self, generated: int) -> AssistantStart:
        """When the assistant started, and on what figures (`generated`: the answer's length)."""
        seconds, count = self.assistant_prompt or (None, None)
        cost, tokens, saving, expected = self.refused or (None, None, None, None)
        return AssistantStart(self.prompt_tokens, self.started_after, generated, seconds, count, cost, tokens, saving,
                              expected, tuple(self.earnings.set_aside_after))
