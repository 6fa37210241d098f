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
    assert min(windows[10:]) >= 12


def test_useless_drafts_switch_the_assistant_off_and_probe_now_and_then():
    schedule = AdaptiveSchedule(5, probe_every=8, probe_window=3)
    windows = run(schedule, lambda k: 0, assistant_s=0.1, verify=lambda k: 0.3 + 0.05 * k, steps=60)
    tail = windows[20:]
    assert tail.count(0) >= 30
    assert 3 in tail  # probes keep measuring alpha
    assert schedule.alpha < 0.2


def test_costly_verification_keeps_windows_short():
    cheap = run(AdaptiveSchedule(5), lambda k: int(0.8 * k), assistant_s=0.02, verify=lambda k: 0.3 + 0.01 * k)
    costly = run(AdaptiveSchedule(5), lambda k: int(0.8 * k), assistant_s=0.02, verify=lambda k: 0.3 + 0.2 * k)
    assert sum(costly[10:]) < sum(cheap[10:])


def test_first_step_prefill_is_not_taken_as_a_pass_cost():
    schedule = AdaptiveSchedule(5)
    schedule.update(5, 5, 5.0, 30.0)  # the prompt's prefill: slow, unrepresentative
    assert schedule._verify == {} and schedule.window == 7  # still the heuristic's rule


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
