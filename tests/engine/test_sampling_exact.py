"""Speculative sampling stays exact where the drafting varies from step to step: window schedules that follow what
was accepted (the adaptive one also stops drafting by the assistant's confidence), an assistant with another
tokenizer (re-tokenized drafts are deterministic proposals), an encoder-decoder target, and an assistant that starts
late (`drafting.PaybackGate`; the target samples alone until then).

Each case samples many short continuations of one prompt and compares every pair of consecutive tokens with the
target's exact distribution, computed from its own logits. Each has a companion that breaks the drafting or the
acceptance rule in a way that case could, and shows the same test, on as many samples, rejects it.
"""
import itertools
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from scipy.stats import chisquare

import helpers as tm
from assistgen import generate
from assistgen.engine import decoding, drafting, retokenizing
from assistgen.engine.drafting import Draft, PaybackCosts
from assistgen.engine.sampling import Sampler
from assistgen.engine.schedules import AdaptiveSchedule

ALPHA = 1e-3   # a case fails when the target's distribution is rejected at this level (after Bonferroni)


def assisted_sample(model, inputs: dict, seed: int, **options):
    """One assisted sampling run through the engine's public entry point (every run here goes through this)."""
    return generate(model, inputs, do_sample=True, seed=seed, **options)


# --- the target's exact distribution and the test against it ------------------------------------------------------

@torch.inference_mode()
def target_joint(model, inputs: dict, allowed: list[int], length: int, temperature: float,
                 top_p: float) -> torch.Tensor:
    """The probability of every sequence of `length` new tokens under the target's own sampling (softmax at the
    temperature, top-p, the generation config's suppressed tokens), shape ``(len(allowed),) * length``, from one
    batched pass over every sequence of `length - 1` allowed tokens. `allowed` must hold every token that can occur."""
    prefix = decoding.decoder_prefix(model, inputs)
    codes = torch.tensor(list(itertools.product(range(len(allowed)), repeat=length - 1)), dtype=torch.long)
    codes = codes.reshape(len(allowed) ** (length - 1), length - 1)   # indices into `allowed`
    seqs = torch.tensor(allowed)[codes]
    ids = torch.cat([torch.tensor([prefix]).expand(len(seqs), -1), seqs], dim=1).to(tm.DEVICE)
    if model.config.is_encoder_decoder:
        encoder = {k: v.expand(len(seqs), *v.shape[1:]) for k, v in inputs.items() if k != "decoder_input_ids"}
        logits = model(**encoder, decoder_input_ids=ids).logits
    else:
        logits = model(input_ids=ids).logits
    logits = logits[:, len(prefix) - 1:].float()   # (sequences, length, vocab): row i predicts new token i
    suppress = model.generation_config.suppress_tokens
    if suppress:
        logits[..., suppress] = -float("inf")
    probs = Sampler(temperature, top_p, seed=0).probs(logits)[..., allowed].cpu()
    assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-5), "a token outside `allowed` has probability"
    prefix_prob = probs[:, :-1].gather(-1, codes.unsqueeze(-1)).squeeze(-1).prod(-1)
    return (prefix_prob.unsqueeze(-1) * probs[:, -1]).double().reshape((len(allowed),) * length)


def tally(sequences: list[list[int]], allowed: list[int], length: int) -> torch.Tensor:
    """Counts of the sampled sequences, in `target_joint`'s layout; a token outside `allowed` fails the test."""
    counts = torch.zeros((len(allowed),) * length, dtype=torch.float64)
    index = {token: i for i, token in enumerate(allowed)}
    for seq in sequences:
        assert len(seq) == length and all(t in index for t in seq), f"an impossible sequence was emitted: {seq}"
        counts[tuple(index[t] for t in seq)] += 1
    return counts


def pooled_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Chi-square goodness of fit of counts to probabilities; cells expecting fewer than 5 are pooled into one."""
    observed, wanted = observed.flatten(), expected.flatten() * float(observed.sum())
    if observed[wanted == 0].any():
        return 0.0   # a sequence the target never samples
    big = wanted >= 5
    obs, exp = observed[big].tolist(), wanted[big].tolist()
    if wanted[~big].sum() > 0:
        obs.append(float(observed[~big].sum()))
        exp.append(float(wanted[~big].sum()))
    scale = sum(obs) / sum(exp)   # the expected mass sums to 1 only up to float rounding
    return float(chisquare(obs, [e * scale for e in exp]).pvalue)


def pair_pvalue(counts: torch.Tensor, joint: torch.Tensor) -> float:
    """Every pair of consecutive tokens against its exact joint distribution, Bonferroni-corrected."""
    length = joint.dim()
    pvalues = []
    for i in range(max(1, length - 1)):
        others = tuple(d for d in range(length) if d not in (i, i + 1))
        if others:
            pvalues.append(pooled_pvalue(counts.sum(dim=others), joint.sum(dim=others)))
        else:
            pvalues.append(pooled_pvalue(counts, joint))
    return min(1.0, min(pvalues) * len(pvalues))


# --- the cases ---------------------------------------------------------------------------------------------------

@dataclass
class Case:
    """One way of drafting, sampled `samples` times for `length` new tokens."""
    target: torch.nn.Module
    inputs: dict
    allowed: list[int]           # every token the target can emit (its generation config suppresses the others)
    length: int
    samples: int
    options: Callable[[], dict]  # generate's keywords for one run (fresh schedules and costs each time)
    exercised: Callable[[object], bool]   # whether one run used the mechanism under test
    temperature: float = 1.0
    top_p: float = 1.0

    def run(self) -> tuple[float, float]:
        """(the test's p-value, the share of runs that exercised the mechanism)."""
        joint = target_joint(self.target, self.inputs, self.allowed, self.length, self.temperature, self.top_p)
        runs = [assisted_sample(self.target, self.inputs, seed, max_new_tokens=self.length,
                                temperature=self.temperature, top_p=self.top_p, **self.options())
                for seed in range(self.samples)]
        counts = tally([r.new_tokens for r in runs], self.allowed, self.length)
        return pair_pvalue(counts, joint), sum(map(self.exercised, runs)) / len(runs)


def steps_with_offsets(result):
    """Each step with how many tokens had been generated before it."""
    done = 0
    for step in result.steps:
        yield done, step
        done += len(step.emitted)


VOCAB = 8
PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def pair():
    target = tm.qwen2(21, vocab=VOCAB, hidden=16, layers=1, init=0.5)
    return target, tm.perturbed(target, 0.5, seed=23)


@pytest.fixture
def ticking_clock(monkeypatch):
    """Every clock read advances 1 ms: the schedules' and the gate's timing decisions repeat run after run."""
    ticks = itertools.count()
    monkeypatch.setattr(decoding, "synchronized_clock", lambda device: lambda: next(ticks) * 1e-3)


# --- window schedules ----------------------------------------------------------------------------------------------

# Costs and a calibration as an earlier generation would lend them: a draft pays only while the chance that the next
# one survives is above about 0.3, so the adaptive schedule stops drafting after an unsure draft
MEASURED = {"costs": {"decay": 0.7, "plain_s": 1e-3, "assistant_s": 2e-4, "verify": {"2": 1.1e-3, "3": 1.2e-3}},
            "calibration": {"hits": [0.2 * (b + 0.5) for b in range(10)], "seen": [2.0] * 10}, "confident": True}


def drafted_unlike_a_constant_window(result, length: int) -> bool:
    """Some step drafted more or fewer tokens than the first step's window (as the budget allows) would have."""
    first = result.steps[0].window
    return any(len(step.candidates) != min(first, length - done - 1) for done, step in steps_with_offsets(result))


def stopped_by_confidence(result, length: int) -> bool:
    """Some step drafted fewer tokens than its window and the budget allowed."""
    return any(step.candidates and len(step.candidates) < min(step.window, length - done - 1)
               for done, step in steps_with_offsets(result))


def schedule_case(pair, schedule: str) -> Case:
    """Four tokens: the heuristic drafts 2, then 1 after a rejection; the adaptive schedule, with measured costs,
    drafts up to 3 and stops after an unsure draft."""
    target, assistant = pair
    length, inputs, allowed = 4, {"input_ids": torch.tensor([PROMPT])}, list(range(VOCAB))
    if schedule == "heuristic":
        return Case(target, inputs, allowed, length, 400,
                    lambda: dict(assistant_model=assistant, num_assistant_tokens=2,
                                 num_assistant_tokens_schedule="heuristic"),
                    lambda r: drafted_unlike_a_constant_window(r, length))
    return Case(target, inputs, allowed, length, 400,
                lambda: dict(assistant_model=assistant, num_assistant_tokens_schedule=AdaptiveSchedule(
                    2, measured=AdaptiveSchedule.from_dict(MEASURED))),
                lambda r: stopped_by_confidence(r, length), temperature=0.8, top_p=0.95)


@pytest.mark.parametrize("schedule", ["heuristic", "adaptive"])
def test_window_schedules_keep_speculative_sampling_exact(pair, schedule, ticking_clock):
    pvalue, exercised = schedule_case(pair, schedule).run()
    assert exercised > 0.1
    assert pvalue > ALPHA


def withholding_unsure_drafts(monkeypatch):
    """What the loop must not do with sampled drafts: withhold one because of its own probability (here every draft
    from the first that is not the assistant's most likely token)."""
    original = drafting.AssistantCandidates.get_candidates

    def get_candidates(self, tokens, num_candidates, sampler, keep_drafting=None):
        draft = original(self, tokens, num_candidates, sampler, keep_drafting)
        sure = [float(q[t]) >= float(q.max()) for t, q in zip(draft.tokens, draft.probs)]
        n = sure.index(False) if False in sure else len(sure)
        return Draft(draft.tokens[:n], draft.probs[:n], draft.confidences[:n])
    monkeypatch.setattr(drafting.AssistantCandidates, "get_candidates", get_candidates)


@pytest.mark.parametrize("schedule", ["heuristic", "adaptive"])
def test_the_schedule_test_detects_sampled_drafts_withheld_by_their_probability(pair, schedule, ticking_clock,
                                                                                 monkeypatch):
    withholding_unsure_drafts(monkeypatch)
    pvalue, _ = schedule_case(pair, schedule).run()
    assert pvalue < ALPHA


# --- an assistant with another tokenizer ---------------------------------------------------------------------------

LETTERS = "thein"


def only(model, tokens: list[int]):
    """`model`, its generation config suppressing every token but `tokens`."""
    model.generation_config.suppress_tokens = [i for i in range(model.config.vocab_size) if i not in tokens]
    return model


@pytest.fixture(scope="module")
def tokenizer_pair():
    """A byte-level target and a BPE assistant (whose tokens "he", "in", "en" are two target tokens each), both
    writing only the letters of LETTERS."""
    tokenizer, assistant_tokenizer = tm.byte_tokenizer(), tm.text_tokenizer()
    letters = tokenizer.convert_tokens_to_ids(list(LETTERS))
    pieces = [i for piece, i in assistant_tokenizer.get_vocab().items() if piece and set(piece) <= set(LETTERS)]
    target = only(tm.qwen2(31, vocab=len(tokenizer), hidden=16, layers=1, init=0.5), letters)
    assistant = only(tm.qwen2(32, vocab=len(assistant_tokenizer), hidden=16, layers=1, init=0.5), pieces)
    return target, assistant, tokenizer, assistant_tokenizer, letters


def tokenizer_case(tokenizer_pair) -> Case:
    """Four tokens, the assistant drafting 3 of its own (2 candidates or more, the last dropped as a possible
    cut-off word)."""
    target, assistant, tokenizer, assistant_tokenizer, letters = tokenizer_pair
    return Case(target, {"input_ids": torch.tensor([tokenizer.encode("then")])}, letters, 4, 300,
                lambda: dict(assistant_model=assistant, tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer,
                             num_assistant_tokens=3, num_assistant_tokens_schedule="constant"),
                lambda r: any(len(step.candidates) >= 2 for step in r.steps))


def test_a_different_tokenizer_assistant_keeps_speculative_sampling_exact(tokenizer_pair):
    pvalue, exercised = tokenizer_case(tokenizer_pair).run()
    assert exercised > 0.1
    assert pvalue > ALPHA


def claiming_retokenized_drafts_were_sampled(monkeypatch, vocab: int, letters: list[int]):
    """Re-tokenized drafts are the assistant's greedy text, deterministic proposals: claiming they were drawn from a
    flat distribution over the target's letters (so accepting them with min(1, p / q)) skews the output to them."""
    original = retokenizing.DifferentTokenizerCandidates.get_candidates

    def get_candidates(self, tokens, num_candidates, sampler, keep_drafting=None):
        draft = original(self, tokens, num_candidates, sampler, keep_drafting)
        flat = torch.zeros(len(draft.tokens), vocab)
        flat[:, letters] = 1 / len(letters)
        return Draft(draft.tokens, flat, draft.confidences)
    monkeypatch.setattr(retokenizing.DifferentTokenizerCandidates, "get_candidates", get_candidates)


def test_the_tokenizer_test_detects_retokenized_drafts_treated_as_samples(tokenizer_pair, monkeypatch):
    target, letters = tokenizer_pair[0], tokenizer_pair[4]
    claiming_retokenized_drafts_were_sampled(monkeypatch, target.config.vocab_size, letters)
    pvalue, _ = tokenizer_case(tokenizer_pair).run()
    assert pvalue < ALPHA


# --- an encoder-decoder target ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def whisper_pair():
    """A tiny Whisper writing 8 tokens, and a copy with noise on every weight (its own encoder included)."""
    target = only(tm.whisper(0), list(range(2, 2 + VOCAB)))
    return target, only(tm.perturbed(target, 0.5, seed=1), list(range(2, 2 + VOCAB)))


def whisper_case(whisper_pair) -> Case:
    target, assistant = whisper_pair
    inputs = {"input_features": tm.whisper_inputs(0)["input_features"], "decoder_input_ids": torch.tensor([[1]])}
    return Case(target, inputs, list(range(2, 2 + VOCAB)), 3, 300,
                lambda: dict(assistant_model=assistant, num_assistant_tokens=2,
                             num_assistant_tokens_schedule="constant"),
                lambda r: any(step.candidates for step in r.steps), temperature=1.5)


def test_an_encoder_decoder_target_keeps_speculative_sampling_exact(whisper_pair):
    pvalue, exercised = whisper_case(whisper_pair).run()
    assert exercised > 0.5
    assert pvalue > ALPHA


def resampling_from_p(monkeypatch):
    """The acceptance rule with its rejection wrong: it resamples from p instead of the residual max(0, p - q)."""
    def accept(candidates, candidate_probs, target_probs, sampler):
        for i, x in enumerate(candidates):
            q_x = 1.0 if candidate_probs is None else float(candidate_probs[i, x])
            if sampler.uniform() * q_x >= float(target_probs[i, x]):
                return i, sampler.sample(target_probs[i])
        return len(candidates), sampler.sample(target_probs[len(candidates)])
    monkeypatch.setattr(decoding, "accept_sampled", accept)


def test_the_encoder_decoder_test_detects_a_rejection_that_resamples_from_p(whisper_pair, monkeypatch):
    resampling_from_p(monkeypatch)
    pvalue, _ = whisper_case(whisper_pair).run()
    assert pvalue < ALPHA


# --- an assistant that starts late ---------------------------------------------------------------------------------

def late_costs() -> PaybackCosts:
    """Costs under which the assistant's prompt pass pays as soon as it can be priced: after the target's prompt pass
    has been timed, so from the second step (the gate then prefills, the assistant drafts from the third)."""
    costs = PaybackCosts(assistant_over_target=1e-3)
    costs.lookup.add(1e-3, 1)
    return costs


def late_start_case(pair) -> Case:
    """Five tokens, the assistant (with prompt lookup) drafting 2 from the third; lookup drafts where the context
    repeats itself."""
    target, assistant = pair

    def drafted_late(result) -> bool:
        """Nothing drafted in the first step (the prompt does not repeat itself, so no lookup either), and the
        assistant drafted later: more passes than its one over the context when it started."""
        return not result.steps[0].candidates and result.assistant_passes > 1
    return Case(target, {"input_ids": torch.tensor([PROMPT])}, list(range(VOCAB)), 5, 400,
                lambda: dict(assistant_model=assistant, prompt_lookup_num_tokens=3, num_assistant_tokens=2,
                             num_assistant_tokens_schedule="constant", assistant_payback=late_costs()),
                drafted_late)


def test_an_assistant_started_late_keeps_speculative_sampling_exact(pair, ticking_clock):
    pvalue, exercised = late_start_case(pair).run()
    assert exercised > 0.5
    assert pvalue > ALPHA


def test_the_late_start_test_detects_greedy_drafts_treated_as_samples(pair, ticking_clock, monkeypatch):
    tm.draft_greedily_but_claim_samples(monkeypatch)
    pvalue, _ = late_start_case(pair).run()
    assert pvalue < ALPHA
