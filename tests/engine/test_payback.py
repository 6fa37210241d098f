"""The assistant's prompt pass is paid only when it can pay back: a long prompt with a short answer never pays it, a
long answer still gets the assistant, and the output is the target's greedy output either way. Costs are simulated
(each pass advances a clock by what its tokens would cost), so nothing here depends on this machine's speed."""
import copy

import pytest
import torch

import helpers as tm
from assistgen import generate
from assistgen.comparison.compare import assistant_start_reason
from assistgen.engine import decoding, drafting, kv

TARGET_PASS_S, TARGET_TOKEN_S = 0.05, 0.01          # a target pass over n new tokens: 0.05 + 0.01 n seconds
ASSISTANT_PASS_S, ASSISTANT_TOKEN_S = 0.01, 0.003   # the assistant's: 0.01 + 0.003 n


class SimulatedClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    """Every pass of a model named `target` costs the target's simulated seconds, any other model's the
    assistant's; the decoding loop and the gate read this clock."""
    clock = SimulatedClock()
    logits = kv.CachedDecoder.logits

    def timed(self, tokens, keep=1, **kwargs):
        new = len(tokens) - min(kv.common_prefix(self._seen, tokens), len(tokens) - keep)
        target = getattr(self.model, "is_target", False)
        clock.now += (TARGET_PASS_S + TARGET_TOKEN_S * new) if target else (ASSISTANT_PASS_S + ASSISTANT_TOKEN_S * new)
        return logits(self, tokens, keep, **kwargs)
    monkeypatch.setattr(kv.CachedDecoder, "logits", timed)
    monkeypatch.setattr(decoding, "synchronized_clock", lambda device: clock)
    return clock


def models():
    target = tm.qwen2(3)
    target.is_target = True
    assistant = copy.deepcopy(target)   # a perfect assistant: every draft it makes is accepted
    assistant.is_target = False
    return target, assistant


def prompt(length: int, seed: int = 0) -> dict:
    ids = torch.randint(3, tm.VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def assisted(target, assistant, inputs, max_new_tokens, costs):
    return generate(target, inputs, assistant_model=assistant, prompt_lookup_num_tokens=5,
                    max_new_tokens=max_new_tokens, assistant_payback=costs)


def measured_costs(target, assistant) -> drafting.PaybackCosts:
    """Costs a first, short generation measured (as a pair's runs lend them to the next)."""
    costs = drafting.PaybackCosts(assistant_over_target=0.3)
    assisted(target, assistant, prompt(20, seed=9), 12, costs)
    return costs


def test_a_long_prompt_with_a_short_answer_never_pays_the_assistants_prompt_pass(clock):
    target, assistant = models()
    costs = measured_costs(target, assistant)
    inputs = prompt(150)
    baseline = generate(target, inputs, max_new_tokens=10)
    run = assisted(target, assistant, inputs, 10, costs)
    assert run.new_tokens == baseline.new_tokens
    assert run.assistant_passes == 0
    decision = run.assistant_start
    assert decision.started_after is None and decision.prompt_tokens == 150
    assert decision.break_even_tokens > 10
    reason = assistant_start_reason(decision)
    assert reason.startswith("the assistant was not used: its prompt pass (about ")
    # what the gate weighed the pass against when it last said no: never more than the budget left
    assert 0 < decision.expected_tokens < decision.break_even_tokens
    assert f"could be expected to run {decision.expected_tokens} token" in reason


def test_a_long_prompt_with_a_long_answer_starts_the_assistant_once_it_pays_back(clock):
    target, assistant = models()
    costs = measured_costs(target, assistant)
    inputs = prompt(120)
    baseline = generate(target, inputs, max_new_tokens=130)
    run = assisted(target, assistant, inputs, 130, costs)
    assert run.new_tokens == baseline.new_tokens
    started = run.assistant_start.started_after
    assert 10 < started < 60
    # its last refusal: half the answer so far (what it runs on for, two times in three) did not yet pay for the pass
    last = run.assistant_start
    assert 0 < last.expected_tokens <= started // 2
    assert last.expected_tokens * last.saving_per_token_s < last.estimated_prompt_s
    assert assistant_start_reason(run.assistant_start).startswith(
        f"the assistant started after {started} tokens, once the answer")
    steps_after = [s for s in run.steps if sum(len(t.emitted) for t in run.steps[:run.steps.index(s)]) > started]
    assert sum(s.accepted for s in steps_after) > 40   # its drafts were verified and kept
    assert run.latency_s < baseline.latency_s           # simulated seconds: it paid back


def test_a_short_prompt_gets_the_assistant_from_the_first_step_once_costs_are_measured(clock):
    target, assistant = models()
    costs = measured_costs(target, assistant)
    inputs = prompt(20, seed=4)
    baseline = generate(target, inputs, max_new_tokens=30)
    run = assisted(target, assistant, inputs, 30, costs)
    assert run.new_tokens == baseline.new_tokens
    assert run.assistant_start.started_after == 0 and assistant_start_reason(run.assistant_start) is None
    assert run.steps[0].accepted > 0


def test_the_first_generation_waits_for_its_measurements_and_says_so(clock):
    target, assistant = models()
    inputs = prompt(20, seed=4)
    run = assisted(target, assistant, inputs, 30, drafting.PaybackCosts(assistant_over_target=0.3))
    assert run.new_tokens == generate(target, inputs, max_new_tokens=30).new_tokens
    assert 0 < run.assistant_start.started_after <= 3
    assert "could not be priced until" in assistant_start_reason(run.assistant_start)


def test_sampling_with_a_late_assistant_runs_and_matches_itself(clock):
    target, assistant = models()
    costs = measured_costs(target, assistant)
    runs = [generate(target, prompt(120), assistant_model=assistant, prompt_lookup_num_tokens=5, max_new_tokens=130,
                     do_sample=True, temperature=0.8, seed=3, assistant_payback=copy.deepcopy(costs))
            for _ in range(2)]
    assert runs[0].new_tokens == runs[1].new_tokens and len(runs[0].new_tokens) == 130
    assert runs[0].assistant_start.started_after > 0


def test_the_prior_answer_length_is_a_bet_only_on_a_cheap_prompt_pass(clock):
    """At the first step an answer is taken to run `PRIOR_ANSWER_TOKENS`; that bet is taken only where the assistant's
    prompt pass costs at most `PRIOR_RISK_TOKENS` tokens of lookup-only decoding. A dearer one (here about 4 tokens'
    worth, which the prior's 8 tokens would pay for at the first step) waits until the answer so far has run long
    enough to pay for it: a short answer then never pays it, and a longer one gets the assistant after that."""
    target, assistant = models()
    costs = measured_costs(target, assistant)
    inputs = prompt(60, seed=5)
    estimate = costs.assistant_over_target * costs.target_prompt_s * 60
    saving = costs.saving_per_token(costs.lookup.value)
    assert drafting.PRIOR_RISK_TOKENS * costs.lookup.value < estimate <= drafting.PRIOR_ANSWER_TOKENS * saving
    baseline = generate(target, inputs, max_new_tokens=30)
    run = assisted(target, assistant, inputs, 30, copy.deepcopy(costs))
    assert run.new_tokens == baseline.new_tokens
    started = run.assistant_start.started_after
    assert started is not None and started * saving >= 0.8 * estimate   # it waited for the answer to pay, roughly
    short = assisted(target, assistant, inputs, started - 1, copy.deepcopy(costs))
    assert short.assistant_passes == 0 and short.assistant_start.started_after is None


def test_an_assistant_that_does_not_pay_on_this_answer_is_set_aside(clock, monkeypatch):
    """Started on costs lent by a pair whose drafts paid, an assistant whose drafts the target rejects is judged on
    what it earns on this answer: after `JUDGE_AFTER_STEPS` steps that cost more than lookup alone, it is set aside
    for `SET_ASIDE_STEPS` steps (no assistant passes; `Earnings`' own test follows it further). The output stays the target's, and the answer costs less than with the assistant kept on to the end."""
    target, good = models()
    costs = measured_costs(target, good)
    bad = tm.qwen2(7)   # another random model: its drafts are rejected
    bad.is_target = False
    inputs = prompt(20, seed=4)
    baseline = generate(target, inputs, max_new_tokens=80)
    run = assisted(target, bad, inputs, 80, copy.deepcopy(costs))
    assert run.new_tokens == baseline.new_tokens
    start = run.assistant_start
    assert start.started_after == 0
    first = start.set_aside_after[0]
    assert drafting.JUDGE_AFTER_STEPS <= first
    ends = [sum(len(s.emitted) for s in run.steps[:i + 1]) for i in range(len(run.steps))]
    aside = run.steps[ends.index(first) + 1:][:drafting.SET_ASIDE_STEPS]   # ValueError if no step ended there
    assert len(aside) == drafting.SET_ASIDE_STEPS
    assert all(step.draft_s < ASSISTANT_PASS_S for step in aside)   # lookup alone, or nothing: no assistant pass
    reason = assistant_start_reason(start)
    assert reason.startswith(f"the assistant was set aside after {first} tokens: its steps on this answer had run "
                             f"at under 70% of the target alone's rate")
    monkeypatch.setattr(drafting, "JUDGE_AFTER_STEPS", 10 ** 6)   # the assistant kept on to the end
    kept = assisted(target, bad, inputs, 80, copy.deepcopy(costs))
    assert kept.new_tokens == baseline.new_tokens and kept.assistant_start.set_aside_after == ()
    assert run.assistant_passes < kept.assistant_passes
    assert run.latency_s < kept.latency_s   # simulated seconds


def test_earnings_judge_after_enough_steps_and_pause_twice_as_long_each_time():
    earnings = drafting.Earnings()
    for step in range(drafting.JUDGE_AFTER_STEPS - 1):   # at half the target's rate, but not yet judged
        earnings.add(1, 0.2, 0.1, generated=step + 1)
        assert earnings.drafting
    earnings.add(10, 0.2, 0.1, generated=13)             # a burst: the record as a whole runs ahead of the target's
    assert earnings.drafting and earnings.plain_s > earnings.seconds
    earnings.add(1, 0.5, 0.1, generated=14)              # still above SET_ASIDE_BELOW of the target's rate
    assert earnings.drafting and earnings.plain_s >= drafting.SET_ASIDE_BELOW * earnings.seconds
    earnings.add(1, 1.0, 0.1, generated=15)
    assert not earnings.drafting and earnings.set_aside_after == [15]
    for _ in range(drafting.SET_ASIDE_STEPS - 1):
        earnings.idle()
        assert not earnings.drafting
    earnings.idle()
    assert earnings.drafting and earnings.steps == 0 and earnings.seconds == earnings.plain_s == 0
    for step in range(drafting.JUDGE_AFTER_STEPS):
        earnings.add(1, 0.2, 0.1, generated=20 + step)
    assert earnings.set_aside_after == [15, 20 + drafting.JUDGE_AFTER_STEPS - 1]
    for _ in range(2 * drafting.SET_ASIDE_STEPS - 1):
        earnings.idle()
    assert not earnings.drafting
    earnings.idle()
    assert earnings.drafting


def test_prompt_passes_are_priced_by_the_tokens_they_read():
    """A prompt whose beginning both models keep (`engine.prefix_cache`): the target's measured prompt pass is per
    token it read, and the assistant's is estimated over the tokens it would read."""
    def estimate(skipped, drafted_first=False):
        costs = drafting.PaybackCosts(assistant_over_target=0.3)
        costs.lookup.add(0.05, 1)
        costs.plain.add(0.4, 1)
        gate = drafting.PaybackGate(lambda tokens: None, costs, budget=100, clock=lambda: 0.0, skipped=skipped)
        tokens = list(range(50))
        gate.begin(tokens)
        if drafted_first:   # the assistant started at the first step: its drafts' pass followed the prompt's
            gate.started_after = 0
        gate.update(1, 0.0, 2.0)   # the first step's target pass: 2 s
        gate.begin(tokens + [7])
        assert not gate.pays(tokens + [7])   # one token of answer pays for no prompt pass
        return costs.target_prompt_s, gate.refused[0]
    assert estimate((0, 0)) == pytest.approx((2.0 / 50, 0.3 * 2.0 / 50 * 51))
    assert estimate((30, 40)) == pytest.approx((2.0 / 20, 0.3 * 2.0 / 20 * 11))
    assert estimate((30, 40), drafted_first=True)[0] == pytest.approx(1.6 / 20)   # a plain pass's 0.4 s left out


def test_an_assistant_that_lost_from_its_first_step_is_not_bet_on_at_the_next(clock):
    """An answer the assistant drafted from its first step has no lookup-only steps of its own: what it saved is
    measured against the lookup rate lent by earlier answers. Drafts all rejected, it saved nothing, and the next
    short prompt does not start it at its first step."""
    target, good = models()
    costs = measured_costs(target, good)
    bad = tm.qwen2(7)   # another random model: its drafts are rejected
    bad.is_target = False
    first = assisted(target, bad, prompt(20, seed=4), 5, costs)   # too short to be set aside (Earnings)
    assert first.assistant_start.started_after == 0 and first.assistant_start.set_aside_after == ()
    assert costs.saving_share < drafting.MIN_SAVING
    run = assisted(target, bad, prompt(20, seed=6), 30, costs)
    assert run.assistant_start.started_after != 0
    assert run.new_tokens == generate(target, prompt(20, seed=6), max_new_tokens=30).new_tokens
