"""The cost-aware "adaptive" window schedule."""
import pytest

import tiny_models as tm
from assistgen import generate
from assistgen.schedules import AdaptiveSchedule


def feed(schedule, steps):
    for drafted, accepted, draft_s, verify_s in steps:
        k = min(schedule.window, drafted) if drafted is None else drafted
        schedule.update(k, accepted(k) if callable(accepted) else accepted, draft_s(k) if callable(draft_s) else
                        draft_s, verify_s(k) if callable(verify_s) else verify_s)


def run(schedule, alpha_accepts, assistant_s, verify, steps=40):
    """Simulate: each step drafts the schedule's window; `alpha_accepts(k)` accepted; costs from the given model."""
    windows = []
    for _ in range(steps):
        k = schedule.window
        windows.append(k)
        schedule.update(k, alpha_accepts(k), k * assistant_s, verify(k))
    return windows


def test_good_cheap_drafts_get_a_wide_window():
    windows = run(AdaptiveSchedule(5), lambda k: k, assistant_s=0.01, verify=lambda k: 0.3 + 0.01 * k)
    assert windows[2] == 0  # one plain pass, measured after the first timed drafting step
    assert min(windows[3:]) >= 5 and windows[-1] >= 30


def geometric(alpha, seed=0):
    """Accepted drafts out of k when each is accepted with probability alpha until the first rejection."""
    import random
    rng = random.Random(seed)

    def accepts(k):
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        return n
    return accepts


def cpu_verify(k):
    """This CPU's shape: one token 0.3 s; two or more rows run a slower kernel, 0.4 s plus 0.02 s per draft."""
    return 0.3 if k == 0 else 0.4 + 0.02 * k


def simulated_rate(windows, alpha_accepts, assistant_s, verify):
    tokens = seconds = 0.0
    for k in windows:
        tokens += alpha_accepts(k) + 1
        seconds += k * assistant_s + verify(k)
    return tokens / seconds


@pytest.mark.parametrize("alpha,should_draft", [(0.4, False), (0.5, False), (0.95, True)])
def test_drafting_stays_on_only_while_it_pays(alpha, should_draft):
    windows = run(AdaptiveSchedule(5), geometric(alpha), assistant_s=0.05, verify=cpu_verify, steps=120)
    drafting = sum(1 for k in windows[20:] if k) / len(windows[20:])
    assert (drafting > 0.9) if should_draft else (drafting < 0.15), (alpha, windows)
    achieved = simulated_rate(windows[20:], geometric(alpha, seed=1), 0.05, cpu_verify)
    plain = 1 / cpu_verify(0)
    assert achieved > (1.5 * plain if should_draft else 0.9 * plain)


def test_the_same_acceptance_pays_or_not_depending_on_the_measured_costs():
    alpha = geometric(0.8)
    cheap = run(AdaptiveSchedule(5), alpha, assistant_s=0.02, verify=lambda k: 0.3 + 0.01 * k, steps=80)
    costly = run(AdaptiveSchedule(5), alpha, assistant_s=0.15, verify=lambda k: 0.3 if k == 0 else 0.9 + 0.1 * k,
                 steps=80)
    assert sum(1 for k in cheap[10:] if k) > 60 and sum(1 for k in costly[10:] if k) < 15


def test_probes_back_off_while_drafting_does_not_pay():
    schedule = AdaptiveSchedule(5, probe_every=8)
    windows = run(schedule, lambda k: 0, assistant_s=0.05, verify=cpu_verify, steps=130)
    probes = [i for i, k in enumerate(windows) if k and i > 3]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert len(probes) >= 3 and gaps == sorted(gaps) and gaps[-1] >= 4 * gaps[0]
    assert schedule.drafting_rate < 1 / schedule.plain_s


def test_first_step_prefill_is_not_taken_as_a_pass_cost():
    schedule = AdaptiveSchedule(5)
    schedule.update(5, 5, 5.0, 30.0)  # the prompt's prefill: slow, unrepresentative
    assert schedule.drafting_rate is None and schedule.plain_s is None and schedule.window == 7


@pytest.mark.parametrize("family", ["qwen2", "whisper"])
def test_adaptive_schedule_keeps_greedy_output(family):
    build, make_inputs = (tm.qwen2, tm.decoder_inputs) if family == "qwen2" else (tm.whisper, tm.whisper_inputs)
    target = build(0)
    inputs = make_inputs(0)
    baseline = generate(target, inputs, max_new_tokens=60)
    for assistant in (build(100, layers=1), tm.perturbed(target, 0.5, 7), target):
        assisted = generate(target, inputs, assistant_model=assistant, max_new_tokens=60,
                            num_assistant_tokens_schedule="adaptive")
        assert assisted.new_tokens == baseline.new_tokens
        assert [t for s in assisted.steps for t in s.emitted] == assisted.new_tokens
