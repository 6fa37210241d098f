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

from .drafting import (AssistantCandidates, AssistantWithLookupCandidates, CandidateGenerator, Draft, PaybackCosts,
                       PaybackGate, PromptLookupCandidates)
from .encoders import assistant_encoder_outputs
from .kv import CachedDecoder, eos_token_ids
from .retokenizing import different_tokenizer_source
from .whisper_decoder import AUDIO_MARGIN_S, KeyValues
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
    assistant_start: dict | None = None   # when the assistant started and why (`drafting.PaybackGate.decision`)

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


def draft_source(model, inputs: dict, prefix: list[int], eos: set[int], *, encoder_outputs=None,
                 assistant_model=None, prompt_lookup_num_tokens: int = 0, tokenizer=None,
                 assistant_tokenizer=None, payback: PaybackCosts | None = None, budget: int = 0,
                 audio_margin_s: float | None = AUDIO_MARGIN_S,
                 target_key_values: KeyValues | None = None) -> CandidateGenerator | None:
    """The draft source transformers' keywords ask for: `assistant_model` (with the target's tokenizer, or with its
    own when `tokenizer` and `assistant_tokenizer` are both given), prompt lookup (`prompt_lookup_num_tokens` > 0),
    both (the assistant, with prompt lookup where the context repeats itself: `AssistantWithLookupCandidates`), or
    none (the baseline). `encoder_outputs` are an encoder-decoder target's: an assistant reads them only where it
    has no encoder of its own (distil-Whisper's decoder reads Whisper's encoder output) or its encoder is the
    target's; any other runs its own (`encoders.assistant_encoder_outputs`; a Whisper assistant reads the clip plus
    `audio_margin_s` only, `whisper_decoder.AUDIO_MARGIN_S`). An assistant reading the target's encoder output is
    offered the target's cross-attention keys and values (`target_key_values`). With `payback` (pass costs measured on
    this machine), an assistant with the target's tokenizer and prompt lookup starts only once its prompt pass can pay
    back within the answer's `budget` (`drafting.PaybackGate`)."""
    if assistant_model is not None and (tokenizer is None) != (assistant_tokenizer is None):
        raise ValueError("pass both tokenizer and assistant_tokenizer for an assistant with another tokenizer")
    if assistant_model is None:
        return PromptLookupCandidates() if prompt_lookup_num_tokens > 0 else None
    gate = None
    if tokenizer is None:
        own = assistant_encoder_outputs(model, assistant_model, inputs, encoder_outputs, audio_margin_s)
        shared = target_key_values if own is encoder_outputs else None
        source = AssistantCandidates(CachedDecoder(assistant_model, inputs, prefix_length=len(prefix),
                                                   encoder_outputs=own, assistant=True, target_key_values=shared), eos)
        if payback is not None:
            gate = PaybackGate(source.prefill, payback, budget, synchronized_clock(model.device))
    else:
        source = different_tokenizer_source(model, assistant_model, inputs, prefix, eos, tokenizer,
                                             assistant_tokenizer, audio_margin_s=audio_margin_s)
    return AssistantWithLookupCandidates(source, eos, gate=gate) if prompt_lookup_num_tokens > 0 else source


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
    """Generate up to `max_new_tokens` tokens for one sequence (batch size 1), with transformers' keyword names.

    Drafts come from `assistant_model` (with the target's tokenizer, or with its own when `tokenizer` and
    `assistant_tokenizer` are both given), from prompt lookup (`prompt_lookup_num_tokens` > 0, which is then also
    the window), from both (an assistant and `prompt_lookup_num_tokens` > 0: lookup where the context repeats
    itself, the assistant elsewhere), from an explicit `candidate_generator`, or from nowhere (the baseline). The
    schedule is a name from `schedules.SCHEDULES` or a schedule object. With both an assistant (same tokenizer) and
    prompt lookup, `assistant_payback` (costs measured on this machine, updated in place for the next generation)
    starts the assistant only once its prompt pass can pay back; the result's `assistant_start` says when and why.
    A Whisper assistant with its own encoder runs it over the clip's own frames plus `assistant_audio_margin_s`
    (None: the whole window); one that reads the target's encoder output attends to all of it.
    This builds the parts; `speculative_decode` runs them.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if candidate_generator is not None and (assistant_model is not None or prompt_lookup_num_tokens > 0):
        raise ValueError("pass candidate_generator alone, without assistant_model or prompt_lookup_num_tokens")
    started = synchronized_clock(model.device)()
    prefix = decoder_prefix(model, inputs)
    eos = eos_token_ids(model, eos_token_id)
    limit = max_positions(model)
    budget = max_new_tokens if limit is None else min(max_new_tokens, limit - len(prefix))
    if budget < 1:
        raise ValueError(f"the input ({len(prefix)} tokens) leaves no room in the model's {limit} positions")
    target = CachedDecoder(model, inputs, prefix_length=len(prefix))
    source = candidate_generator if candidate_generator is not None else draft_source(
        model, inputs, prefix, eos, encoder_outputs=target.encoder_outputs, assistant_model=assistant_model,
        prompt_lookup_num_tokens=prompt_lookup_num_tokens, tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer,
        payback=assistant_payback, budget=budget, audio_margin_s=assistant_audio_margin_s,
        target_key_values=target.cross_key_values)
    window = prompt_lookup_num_tokens if assistant_model is None and prompt_lookup_num_tokens else num_assistant_tokens
    schedule = (make_schedule(num_assistant_tokens_schedule, window)
                if isinstance(num_assistant_tokens_schedule, str) else num_assistant_tokens_schedule)
    sampler = Sampler(temperature, top_p, seed, device=model.device) if do_sample else None
    result = speculative_decode(target, prefix, eos, source, schedule, sampler, budget, on_step=on_step,
                                max_time_s=max_time_s, started=started,
                                stop_reason="max_new_tokens" if budget == max_new_tokens else "max_length")
    gate = source.gate if isinstance(source, AssistantWithLookupCandidates) else None
    if gate is not None:
        result.assistant_start = gate.decision(len(result.new_tokens))
    return result


def speculative_decode(target: CachedDecoder, prefix: list[int], eos: set[int], source: CandidateGenerator | None,
                       schedule: WindowSchedule, sampler: Sampler | None, budget: int, *,
                       on_step: Callable[[Step], None] | None = None, max_time_s: float | None = None,
                       started: float | None = None, stop_reason: str = "max_new_tokens") -> GenerationResult:
    """The loop: draft, verify in one target pass, keep the agreeing prefix and the target's own token, repeat until
    EOS, `budget` new tokens, or `max_time_s`. With no draft source every step is one plain decoding step."""
    clock = synchronized_clock(target.device)
    started = clock() if started is None else started
    setup_s = clock() - started
    tokens, new_tokens, steps = list(prefix), [], []
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
        logits = target.logits(tokens + candidates, keep=len(candidates) + 1)
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
        if on_step is not None:
            on_step(step)
        if stop_reason == "eos":
            break
        if max_time_s is not None and clock() - started > max_time_s and len(new_tokens) < budget:
            stop_reason = "max_time"
            break
    return GenerationResult(new_tokens, steps, target.passes, source.passes if source is not None else 0,
                            clock() - started, stop_reason, setup_s)
