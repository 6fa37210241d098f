"""Baseline and assisted generation (speculative decoding) in one loop that records every draft and acceptance.

Each step: a draft source proposes up to k candidates; one target pass scores them all; the longest prefix the target
agrees with is kept, plus the target's own token at the first disagreement (or a bonus token when all agree). With no
draft source, k = 0 and every step is plain incremental decoding, which is the baseline.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from .drafting import (AssistantCandidates, AssistantStart, AssistantWithLookupCandidates, CandidateGenerator, Draft, PaybackCosts,
                       PaybackGate, PromptLookupCandidates)
from .encoders import assistant_encoder_outputs
from .kv import CachedDecoder, eos_token_ids, keep_shared_prefix
from .prefix_cache import shared_prefix_length
from .retokenizing import different_tokenizer_source
from .whisper_decoder import AUDIO_MARGIN_S
from .sampling import Sampler, accept_greedy, accept_sampled
from .schedules import WindowSchedule, make_schedule


@dataclass(frozen=True)
class Step:
    """One target forward pass."""
    candidates: list[int]  # drafts the target verified (empty for a plain decoding step; see withheld)
    accepted: int        # how many of them were kept: emitted[:accepted] == candidates[:accepted]
    emitted: list[int]   # tokens appended: the accepted candidates, then the target's own token (unless an accepted
                         # candidate was EOS, where the step ends)
    window: int          # the schedule's window for this step (candidates may be fewer: EOS, token budget, no match)
    draft_s: float       # seconds spent drafting
    verify_s: float      # seconds in the target pass and acceptance
    withheld: int = 0    # further candidates drafted but not verified: the schedule judged them unlikely to pay


@dataclass
class GenerationResult:
    new_tokens: list[int]
    steps: list[Step]
    target_passes: int
    assistant_passes: int
    latency_s: float
    stop_reason: str = "max_new_tokens"   # "eos", "max_new_tokens", "max_length" or "max_time"
    setup_s: float = 0.0                  # before the first step: encoders (Whisper's), KV caches, draft source
    prompt_steps: tuple[int, ...] = (0,)  # the steps that read a prompt: the first, or each window's first (joined)
    windows: list[dict] | None = None     # per window of a joined run: its own figures
    assistant_start: AssistantStart | None = None   # when the assistant started, beside lookup (`drafting.PaybackGate`)
    prompt_tokens_kept: int = 0           # the prompt's first tokens the target took from `prefix_cache`, not read

    @property
    def tokens_per_pass(self) -> float:
        return len(self.new_tokens) / self.target_passes if self.target_passes else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted candidates over drafted candidates; None when nothing was drafted."""
        drafted = sum(len(s.candidates) for s in self.steps)
        return sum(s.accepted for s in self.steps) / drafted if drafted else None

    @property
    def tokens_per_second(self) -> float:
        return len(self.new_tokens) / self.latency_s if self.latency_s > 0 else 0.0

    @property
    def later_steps(self) -> list[Step]:
        """The steps after a prompt's: the steady decoding the per-pass figures describe."""
        prompts = set(self.prompt_steps)
        return [step for i, step in enumerate(self.steps) if i not in prompts]


def joined(results: list[GenerationResult]) -> GenerationResult:
    """Runs over consecutive windows of one input (a long recording), as one run: tokens, steps, passes and seconds
    added up, each window's first step marked as a prompt step, each window's own figures in `windows`."""
    steps, starts = [], []
    for result in results:
        starts.append(len(steps))
        steps += result.steps
    stops = [r.stop_reason for r in results]
    return GenerationResult(
        [t for r in results for t in r.new_tokens], steps, sum(r.target_passes for r in results),
        sum(r.assistant_passes for r in results), sum(r.latency_s for r in results),
        "max_time" if "max_time" in stops else stops[-1], sum(r.setup_s for r in results), tuple(starts),
        [{"latency_s": round(r.latency_s, 4), "new_tokens": len(r.new_tokens), "target_passes": r.target_passes,
          "assistant_passes": r.assistant_passes, "tokens_per_pass": round(r.tokens_per_pass, 3),
          "stop_reason": r.stop_reason} for r in results])


def synchronized_clock(device: torch.device) -> Callable[[], float]:
    """``time.perf_counter``, read once the device has finished the work queued so far: CUDA runs asynchronously, so
    a timer read without synchronizing would time the queueing, not the work."""
    if torch.device(device).type != "cuda":
        return time.perf_counter

    def clock() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return clock


@dataclass
class Target:
    """The target model set up for one generation (`prepare`): its cached decoder, the tokens generation continues,
    the tokens that end it, and how many it may add."""
    decoder: CachedDecoder
    inputs: dict
    prefix: list[int]
    eos: set[int]
    budget: int           # new tokens at most: max_new_tokens, or fewer where the model's positions end first
    budget_stop: str      # the stop reason at the budget: "max_new_tokens" or "max_length"
    started: float        # the clock when setting up began: setup seconds count from here

    @property
    def model(self):
        return self.decoder.model


@torch.inference_mode()
def prepare(model, inputs: dict, max_new_tokens: int, eos_token_id: int | list[int] | None = None) -> Target:
    """Set up `model` to generate up to `max_new_tokens` tokens after `inputs` (batch size 1): its encoder runs here
    (an encoder-decoder's), and the prompt waits for the first step. `inputs` may say how many of the prompt's
    first tokens other prompts share (`prefix_cache.SHARED_PREFIX`): their keys and values are then kept, for this
    model and its assistant, and taken by the next prompt that begins with them."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    started = synchronized_clock(model.device)()
    prefix = decoder_prefix(model, inputs)
    limit = max_positions(model)
    budget = max_new_tokens if limit is None else min(max_new_tokens, limit - len(prefix))
    if budget < 1:
        raise ValueError(f"the input ({len(prefix)} tokens) leaves no room in the model's {limit} positions")
    keep_shared_prefix(model, inputs)   # read here once a model (a setup cost), so that the first pass only takes it
    decoder = CachedDecoder(model, inputs, prefix_length=len(prefix), shared_prefix=shared_prefix_length(inputs))
    return Target(decoder, inputs, prefix,
                  eos_token_ids(model, eos_token_id), budget,
                  "max_new_tokens" if budget == max_new_tokens else "max_length", started)


@torch.inference_mode()
def draft_source(target: Target, *, assistant_model=None, lookup: bool = False, tokenizers: tuple | None = None,
                 payback: PaybackCosts | None = None,
                 audio_margin_s: float | None = AUDIO_MARGIN_S) -> CandidateGenerator | None:
    """The draft source for one generation of `target`: `assistant_model` (with the target's tokenizer, or with its
    own when `tokenizers` is (the target's, the assistant's)), prompt lookup (`lookup`), both (the assistant, with
    prompt lookup where the context repeats itself: `AssistantWithLookupCandidates`), or none (the baseline).

    An encoder-decoder assistant reads the target's encoder output only where it has no encoder of its own
    (distil-Whisper's decoder reads Whisper's) or its encoder is the target's, and is then offered the target's
    cross-attention keys and values; any other runs its own (`encoders.assistant_encoder_outputs`; a Whisper
    assistant reads the clip plus `audio_margin_s` only, None: the whole window). With `payback` (pass costs measured
    on this machine, updated in place for the next generation), an assistant with the target's tokenizer and prompt
    lookup starts only once its prompt pass can pay back within the target's budget (`drafting.PaybackGate`)."""
    if assistant_model is None:
        return PromptLookupCandidates() if lookup else None
    model, inputs, prefix, eos = target.model, target.inputs, target.prefix, target.eos
    gate = None
    if tokenizers is None:
        encoder_outputs = target.decoder.encoder_outputs
        own = assistant_encoder_outputs(model, assistant_model, inputs, encoder_outputs, audio_margin_s)
        shared = target.decoder.cross_key_values if own is encoder_outputs else None
        keep_shared_prefix(assistant_model, inputs, assistant=True)
        assistant = CachedDecoder(assistant_model, inputs, prefix_length=len(prefix), encoder_outputs=own,
                                  assistant=True, target_key_values=shared, shared_prefix=shared_prefix_length(inputs))
        source = AssistantCandidates(assistant, eos)
        if payback is not None:
            gate = PaybackGate(source.prefill, payback, target.budget, synchronized_clock(model.device),
                               skipped=(target.decoder.shared_prefix, assistant.shared_prefix))
    else:
        source = different_tokenizer_source(model, assistant_model, inputs, prefix, eos, *tokenizers,
                                             audio_margin_s=audio_margin_s)
    return AssistantWithLookupCandidates(source, eos, gate=gate) if lookup else source


def decoder_prefix(model, inputs: dict) -> list[int]:
    """The token sequence generation continues: the prompt, or an encoder-decoder model's forced decoder prefix."""
    if model.config.is_encoder_decoder:
        if inputs.get("decoder_input_ids") is not None:
            ids = inputs["decoder_input_ids"]
        else:
            start = model.generation_config.decoder_start_token_id
            start = model.config.decoder_start_token_id if start is None else start
            if start is None:
                raise ValueError("encoder-decoder inputs need decoder_input_ids, or a decoder_start_token_id in the config")
            return [int(start if isinstance(start, int) else start[0])]
    else:
        ids = inputs.get("input_ids")
        if ids is None:
            raise ValueError("decoder-only inputs need input_ids")
        mask = inputs.get("attention_mask")
        if mask is not None:
            ids = ids[mask.bool()].unsqueeze(0) if ids.dim() == 2 else ids[mask.bool()]
    ids = torch.as_tensor(ids)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"batch size must be 1, got input of shape {tuple(ids.shape)}")
        ids = ids[0]
    if ids.numel() == 0:
        raise ValueError("the prompt is empty")
    return ids.tolist()


def max_positions(model) -> int | None:
    """The most positions the model reads (prompt and answer together), None where its config states no limit."""
    config = model.config
    for name in ("max_target_positions", "max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@torch.inference_mode()   # the encoders too: no autograd graph held beside the outputs
def generate(model, inputs: dict, *, assistant_model=None, prompt_lookup_num_tokens: int = 0,
             max_new_tokens: int = 128, do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0,
             seed: int | None = None, num_assistant_tokens: int = 5,
             num_assistant_tokens_schedule: str | WindowSchedule = "heuristic",
             eos_token_id: int | list[int] | None = None, on_step: Callable[[Step], None] | None = None,
             max_time_s: float | None = None, candidate_generator: CandidateGenerator | None = None,
             tokenizer=None, assistant_tokenizer=None, assistant_payback: PaybackCosts | None = None,
             assistant_audio_margin_s: float | None = AUDIO_MARGIN_S) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens for one sequence (batch size 1), with transformers' keyword names: a
    thin wrapper that sets up the target (`prepare`), builds the draft source (`draft_source`) and runs the loop
    (`speculative_decode`).

    Drafts come from `assistant_model` (with its own tokenizer when `tokenizer` and `assistant_tokenizer` are both
    given), from prompt lookup (`prompt_lookup_num_tokens` > 0, which is then also the window), from both, from an
    explicit `candidate_generator`, or from nowhere (the baseline). The schedule is a name from `schedules.SCHEDULES`
    or a schedule object. `assistant_payback` and `assistant_audio_margin_s` are `draft_source`'s `payback` and
    `audio_margin_s`; the result's `assistant_start` says when the assistant started beside lookup.
    """
    if candidate_generator is not None and (assistant_model is not None or prompt_lookup_num_tokens > 0):
        raise ValueError("pass candidate_generator alone, without assistant_model or prompt_lookup_num_tokens")
    if assistant_model is not None and (tokenizer is None) != (assistant_tokenizer is None):
        raise ValueError("pass both tokenizer and assistant_tokenizer for an assistant with another tokenizer")
    target = prepare(model, inputs, max_new_tokens, eos_token_id)
    source = candidate_generator if candidate_generator is not None else draft_source(
        target, assistant_model=assistant_model, lookup=prompt_lookup_num_tokens > 0,
        tokenizers=None if tokenizer is None else (tokenizer, assistant_tokenizer), payback=assistant_payback,
        audio_margin_s=assistant_audio_margin_s)
    window = prompt_lookup_num_tokens if assistant_model is None and prompt_lookup_num_tokens else num_assistant_tokens
    schedule = (make_schedule(num_assistant_tokens_schedule, window)
                if isinstance(num_assistant_tokens_schedule, str) else num_assistant_tokens_schedule)
    sampler = Sampler(temperature, top_p, seed, device=model.device) if do_sample else None
    return speculative_decode(target, source, schedule, sampler, on_step=on_step, max_time_s=max_time_s)


@torch.inference_mode()
def speculative_decode(target: Target, source: CandidateGenerator | None, schedule: WindowSchedule,
                       sampler: Sampler | None, *, on_step: Callable[[Step], None] | None = None,
                       max_time_s: float | None = None) -> GenerationResult:
    """The loop: draft, verify in one target pass, keep the agreeing prefix and the target's own token, repeat until
    EOS, the target's budget of new tokens, or `max_time_s`. With no draft source every step is one plain decoding
    step. `sampler` None: greedy."""
    clock = synchronized_clock(target.model.device)
    started, eos, budget, stop_reason = target.started, target.eos, target.budget, target.budget_stop
    setup_s = clock() - started
    tokens, new_tokens, steps = list(target.prefix), [], []
    while len(new_tokens) < budget:
        # 1. Draft: never more candidates than the budget has room for beyond the target's own token. The schedule
        #    may stop drafting early, judged by the draft model's confidence so far, and with greedy drafts withhold
        #    the last few from verification. Sampled drafts are all verified: withholding one because of its own
        #    probability would bias the output (a draft's fate may depend only on the drafts before it).
        t0 = clock()
        window = schedule.window if source is not None else 0
        k = min(window, budget - len(new_tokens) - 1)
        draft = source.get_candidates(tokens, k, sampler, schedule.keep_drafting) if k > 0 else Draft([])
        verify = len(draft.tokens)
        if sampler is None and draft.confidences is not None:
            verify = schedule.verify_count(draft.confidences)
        candidates = draft.tokens[:min(k, verify)]
        t1 = clock()
        # 2. Verify: one target pass scores every candidate position and the one after them.
        logits = target.decoder.logits(tokens + candidates, keep=len(candidates) + 1)
        if sampler is None:
            accepted, next_token = accept_greedy(candidates, logits)
        else:
            proposal = None if draft.probs is None else draft.probs[:len(candidates)]  # None: deterministic drafts
            accepted, next_token = accept_sampled(candidates, proposal, sampler.probs(logits), sampler)
        emitted = candidates[:accepted] + [next_token]
        # 3. Stop at the first EOS, even one inside the accepted candidates.
        for i, token in enumerate(emitted):
            if token in eos:
                emitted, accepted, stop_reason = emitted[:i + 1], min(accepted, i + 1), "eos"
                break
        tokens += emitted
        new_tokens += emitted
        step = Step(candidates, accepted, emitted, window, t1 - t0, clock() - t1,
                    len(draft.tokens) - len(candidates))
        steps.append(step)
        schedule.update(len(candidates), accepted, step.draft_s, step.verify_s, draft.confidences)
        if source is not None:
            source.update(len(emitted), step.draft_s, step.verify_s)
        if on_step is not None:
            on_step(step)
        if stop_reason == "eos":
            break
        if max_time_s is not None and clock() - started > max_time_s and len(new_tokens) < budget:
            stop_reason = "max_time"
            break
    gate = source.gate if isinstance(source, AssistantWithLookupCandidates) else None
    return GenerationResult(new_tokens, steps, target.decoder.passes, source.passes if source is not None else 0,
                            clock() - started, stop_reason, setup_s,
                            assistant_start=None if gate is None else gate.decision(len(new_tokens)),
                            prompt_tokens_kept=target.decoder.kept_prefix)
