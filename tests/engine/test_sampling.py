"""Speculative sampling is exact: the tokens it emits follow the target's own sampling distribution."""
from collections import Counter
from itertools import product

import pytest
import torch
from scipy.stats import chisquare

import helpers as tm
from assistgen import generate
from assistgen.engine.sampling import Sampler, accept_sampled

VOCAB = 8
SAMPLES = 800


def chi2_pvalue(counts: Counter, expected: dict) -> float:
    """Chi-square goodness of fit; cells with small expectation are pooled."""
    n = sum(counts.values())
    observed, wanted, pool_o, pool_e = [], [], 0, 0.0
    for cell, p in expected.items():
        if p * n >= 5:
            observed.append(counts.get(cell, 0))
            wanted.append(p * n)
        else:
            pool_o += counts.get(cell, 0)
            pool_e += p * n
    observed.append(pool_o + sum(c for cell, c in counts.items() if cell not in expected))
    wanted.append(pool_e)
    if wanted[-1] == 0:
        observed, wanted = observed[:-1], wanted[:-1]
    scale = sum(observed) / sum(wanted)  # the expected mass sums to 1 only up to float rounding
    return chisquare(observed, [w * scale for w in wanted]).pvalue


def test_sampler_top_p_keeps_the_smallest_nucleus():
    sampler = Sampler(temperature=1.0, top_p=0.7, seed=0)
    probs = sampler.probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])))
    assert torch.allclose(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


@pytest.mark.parametrize("deterministic_draft", [False, True])
def test_acceptance_rule_reproduces_the_target_distribution(deterministic_draft):
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(2, 6, generator=g) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(1, 6, generator=g) * 1.5, dim=-1)
    sampler = Sampler(seed=2)
    counts = Counter()
    for _ in range(20000):
        x = 3 if deterministic_draft else sampler.sample(q[0])
        accepted, token = accept_sampled([x], None if deterministic_draft else q, p, sampler)
        counts[x if accepted else token] += 1
    assert chi2_pvalue(counts, dict(enumerate(p[0].tolist()))) > 1e-3


def _target_joint(model, prompt, temperature, top_p, length=2):
    """Exact probability of each sequence of `length` first tokens under the target's own sampling."""
    sampler = Sampler(temperature, top_p, seed=0)
    joint = {}
    for seq in product(range(VOCAB), repeat=length):
        prob = 1.0
        for i in range(length):
            logits = model(torch.tensor([prompt + list(seq[:i])], device=tm.DEVICE)).logits[0, -1]
            prob *= float(sampler.probs(logits)[seq[i]])
        joint[seq] = prob
    return joint


def _sample_first_tokens(target, assistant, prompt, n, temperature, top_p, length=2, schedule=lambda: "constant",
                         lookup: int = 0, window: int = 2):
    inputs = {"input_ids": torch.tensor([prompt])}
    counts = Counter()
    for seed in range(n):
        result = generate(target, inputs, assistant_model=assistant, do_sample=True, temperature=temperature,
                          top_p=top_p, seed=seed, max_new_tokens=3, num_assistant_tokens=window,
                          num_assistant_tokens_schedule=schedule(), prompt_lookup_num_tokens=lookup)
        counts[tuple(result.new_tokens[:length])] += 1
    return counts


@pytest.fixture(scope="module")
def sampling_pair():
    target = tm.qwen2(21, vocab=VOCAB, hidden=16, layers=1, init=0.5)
    assistant = tm.qwen2(22, vocab=VOCAB, hidden=16, layers=1, init=0.5)
    return target, assistant, [1, 2, 3]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_speculative_sampling_matches_the_target_distribution(sampling_pair, temperature, top_p):
    target, assistant, prompt = sampling_pair
    with torch.inference_mode():
        expected = _target_joint(target, prompt, temperature, top_p)
    counts = _sample_first_tokens(target, assistant, prompt, SAMPLES, temperature, top_p)
    assert chi2_pvalue(counts, expected) > 1e-3


class ConfidenceSchedule:
    """Stops drafting after an unsure draft and asks to withhold every draft from the first unsure one on."""

    def __init__(self, num_assistant_tokens):
        self.window = 2

    def keep_drafting(self, confidences):
        return confidences[-1] >= 0.3

    def verify_count(self, confidences):
        return next((i for i, c in enumerate(confidences) if c < 0.4), len(confidences))

    def update(self, drafted, accepted, draft_s, verify_s, confidences=None):
        pass


def test_confidence_decisions_keep_speculative_sampling_exact(sampling_pair):
    """Stopping by the confidences so far is safe; withholding a sampled draft because of its own probability is
    not, and the loop does not do it (tests/engine/test_schedules.py checks that it does not)."""
    target, assistant, prompt = sampling_pair
    with torch.inference_mode():
        expected = _target_joint(target, prompt, 1.0, 1.0)
    counts = _sample_first_tokens(target, assistant, prompt, SAMPLES, 1.0, 1.0, schedule=lambda: ConfidenceSchedule(2))
    assert chi2_pvalue(counts, expected) > 1e-3


def test_the_test_detects_greedy_drafts_treated_as_samples(sampling_pair, monkeypatch):
    """The exactness test has power: drafting with argmax but claiming q as the proposal skews the output."""
    target, assistant, prompt = sampling_pair
    tm.draft_greedily_but_claim_samples(monkeypatch)
    with torch.inference_mode():
        expected = _target_joint(target, prompt, 1.0, 1.0)
    counts = _sample_first_tokens(target, assistant, prompt, SAMPLES, 1.0, 1.0)
    assert chi2_pvalue(counts, expected) < 1e-3


def test_sampling_is_reproducible_with_a_seed(sampling_pair):
    target, assistant, prompt = sampling_pair
    inputs = {"input_ids": torch.tensor([prompt])}
    runs = [generate(target, inputs, assistant_model=assistant, do_sample=True, seed=5, max_new_tokens=12).new_tokens
            for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("prompt", [[1, 2, 3, 1, 2],      # the context repeats: the first draft is a lookup
                                    [5, 1, 2, 3, 4, 1]])  # an assistant draft "2" repeats [1, 2]: lookup extends it
def test_assistant_with_lookup_keeps_speculative_sampling_exact(sampling_pair, prompt):
    target, assistant, _ = sampling_pair
    with torch.inference_mode():
        expected = _target_joint(target, prompt, 1.0, 1.0)
    counts = _sample_first_tokens(target, assistant, prompt, SAMPLES, 1.0, 1.0, lookup=3, window=3)
    assert chi2_pvalue(counts, expected) > 1e-3
