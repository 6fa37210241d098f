"""The cost-aware "adaptive" window schedule: per-token decisions from the draft model's confidence, priced with the
pass costs it measures, and an on/off decision for drafts without confidences."""
import random

import pytest
import torch

import helpers as tm
from assistgen import generate
from assistgen.engine import schedules
from assistgen.engine.schedules import AdaptiveSchedule, HeuristicSchedule


def cpu_verify(k):
    """This CPU's shape: one token 0.3 s; two or more rows run a slower kernel, 0.4 s plus 0.02 s per draft."""
    return 0.3 if k == 0 else 0.4 + 0.02 * k


def gpu_verify(k):
    """A GPU's shape: verifying a few drafts costs about one plain pass."""
    return 0.02 + 0.0002 * k


def geometric(alpha, seed=0):
    """Accepted drafts out of k when each is accepted with probability alpha until the first rejection."""
    rng = random.Random(seed)

    def accepts(k):
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        return n
    return accepts


def run(schedule, alpha_accepts, assistant_s, verify, steps=40):
    """Drafts without confidences (prompt lookup): each step drafts the window; `alpha_accepts(k)` accepted."""
    windows = []
    for _ in range(steps):
        k = schedule.window
        windows.append(k)
        schedule.update(k, alpha_accepts(k), k * assistant_s, verify(k))
    return windows


def warmed(assistant_s, verify, steps=6, confidence=0.9):
    """An adaptive schedule that has measured its costs on a few steps of confident, accepted drafts."""
    schedule = AdaptiveSchedule(5)
    schedule.update(3, 3, 9.0, 9.0, [confidence] * 3)  # the prompt's prefill: left out of the costs
    for i in range(steps):
        k = 1 + i % 4
        schedule.update(k, k, k * assistant_s, verify(k), [confidence] * k)
    schedule.update(0, 0, assistant_s, verify(0), [0.05])  # one withheld draft: a plain pass, measured
    return schedule


# -- drafts with confidences: per-token decisions ------------------------------------------------------------------

def test_costs_are_measured_and_the_prompt_pass_left_out():
    schedule = warmed(0.05, cpu_verify)
    assert schedule.assistant_s == pytest.approx(0.05)
    assert schedule.costs.pass_s(1) == pytest.approx(0.3)
    assert schedule.costs.pass_s(4) == pytest.approx(cpu_verify(3), rel=0.01)
    assert schedule.costs.pass_s(9) == pytest.approx(cpu_verify(8), rel=0.02)  # a line through the sizes measured


def test_verification_is_never_priced_below_a_plain_pass():
    one_size = AdaptiveSchedule(64)
    assert one_size.window == 32  # the window starts within the cap
    one_size.update(3, 3, 9.0, 9.0, [0.9] * 3)  # the prompt's prefill
    one_size.update(32, 32, 0.3, 0.05, [0.9] * 32)  # one size measured, 33 rows
    costs = [one_size.costs.pass_s(rows) for rows in range(1, 40)]
    assert costs == sorted(costs) and costs[0] == pytest.approx(0.05 / 1.2)  # the guess until a plain pass is timed
    gpu = warmed(0.0005, lambda k: 0.03 if k < 8 else 0.03 + 0.004 * (k - 8), steps=12)  # flat, then rising
    costs = [gpu.costs.pass_s(rows) for rows in range(1, 40)]
    assert costs == sorted(costs) and costs[1] >= gpu.plain_s


def test_calibration_learns_how_often_each_confidence_is_accepted():
    schedule = AdaptiveSchedule(5)
    before_low, before_high = schedule.calibrated(0.55), schedule.calibrated(0.95)
    for _ in range(20):
        # drafts at 0.95 accepted; the draft at 0.55 after them rejected; the one after that never tried
        schedule.update(4, 2, 0.1, 0.5, [0.95, 0.95, 0.55, 0.55])
    assert schedule.calibrated(0.95) > before_high > 0.9
    assert schedule.calibrated(0.55) < 0.1 < before_low
    assert schedule.calibrated(0.75) == pytest.approx(0.75)  # no evidence: the prior


def test_drafting_stops_where_the_next_draft_no_longer_pays():
    schedule = warmed(0.05, cpu_verify)
    assert schedule.keep_drafting([0.99] * 6)
    assert not schedule.keep_drafting([0.99, 0.99, 0.2])
    assert not schedule.keep_drafting([0.6] * 4)  # each likely, but the chance that all survive has fallen


def test_the_same_confidences_are_drafted_further_where_drafting_is_cheap():
    confidences = [0.9, 0.7, 0.6]
    assert not warmed(0.15, cpu_verify).keep_drafting(confidences)  # a costly assistant, costly verification
    assert warmed(0.0005, gpu_verify).keep_drafting(confidences)  # a cheap assistant, flat verification


def test_unlikely_drafts_are_withheld_from_verification():
    cpu = warmed(0.05, cpu_verify)
    assert cpu.verify_count([0.99, 0.99, 0.99, 0.02]) == 3  # the unlikely tail is not verified
    assert cpu.verify_count([0.3]) == 0  # here a second row costs a third of a pass: a 0.3 draft does not pay it
    assert warmed(0.0005, gpu_verify).verify_count([0.3]) == 1  # where it is nearly free, it does


def test_without_costs_it_drafts_the_window_like_the_heuristic():
    schedule = AdaptiveSchedule(5)
    assert schedule.keep_drafting([0.01]) and schedule.verify_count([0.01, 0.01]) == 2
    schedule.update(5, 5, 5.0, 30.0, [0.9] * 5)  # the prompt's prefill: slow, unrepresentative
    assert schedule.assistant_s is None and schedule.plain_s is None and schedule.window == 7


def test_an_earlier_generations_costs_let_the_first_step_draft_by_them():
    earlier = warmed(0.05, cpu_verify)
    schedule = AdaptiveSchedule(5, measured=earlier)
    assert schedule.window == schedule.max_window   # no blind window: the drafts' confidences decide from the start
    assert schedule.assistant_s == pytest.approx(0.05) and schedule.costs.pass_s(4) == earlier.costs.pass_s(4)
    assert schedule.keep_drafting([0.99] * 6) and not schedule.keep_drafting([0.99, 0.99, 0.2])
    schedule.update(3, 3, 9.0, 9.0, [0.9] * 3)   # its own prompt step
    schedule.update(2, 2, 2.0, 3.0, [0.9] * 2)   # a very different machine now: its own costs count from here
    assert schedule.assistant_s > 0.05 and earlier.assistant_s == pytest.approx(0.05)   # a copy: the lender is as it was
    fresh = AdaptiveSchedule(5, measured=AdaptiveSchedule(5))   # a schedule that measured nothing lends nothing
    assert fresh.window == 5 and not fresh.costs.known


def test_a_schedule_kept_as_plain_data_lends_what_it_measured_as_itself():
    import json
    earlier = warmed(0.05, cpu_verify)
    for _ in range(30):
        earlier.calibrated.observe([0.35], 1, 1)
    restored = AdaptiveSchedule.from_dict(json.loads(json.dumps(earlier.to_dict())))
    a, b = AdaptiveSchedule(5, measured=earlier), AdaptiveSchedule(5, measured=restored)
    assert b.window == a.window == a.max_window
    for rows in (1, 2, 5, 12):
        assert b.costs.pass_s(rows) == pytest.approx(a.costs.pass_s(rows))
    for confidences in ([0.99] * 6, [0.99, 0.99, 0.2], [0.35] * 4, [0.6, 0.35, 0.95]):
        assert b.keep_drafting(confidences) == a.keep_drafting(confidences)
        assert b.verify_count(confidences) == a.verify_count(confidences)
    assert b.calibrated(0.35) == pytest.approx(a.calibrated(0.35)) and a.calibrated(0.35) > 0.8
    state = earlier.to_dict()
    costs, calibration = state["costs"], state["calibration"]
    for broken in ({**state, "costs": {**costs, "assistant_s": -1.0}},
                   {**state, "costs": {**costs, "plain_s": float("nan")}},
                   {**state, "costs": {**costs, "verify": {"1": 0.3}}},
                   {**state, "costs": {**costs, "verify": [0.3, 0.4]}},
                   {**state, "costs": {**costs, "decay": 1.5}},
                   {**state, "calibration": {"hits": [5.0], "seen": [4.0]}},
                   {**state, "calibration": {"hits": [0.0] * len(calibration["seen"]), "seen": [0.0] * len(calibration["seen"])}},
                   {**state, "confident": "yes"}):
        with pytest.raises(ValueError):
            AdaptiveSchedule.from_dict(broken)
    with pytest.raises(KeyError):
        AdaptiveSchedule.from_dict({"costs": state["costs"]})


def test_carried_verification_costs_give_way_to_the_sizes_this_generation_measures():
    slow = AdaptiveSchedule(5)
    slow.update(3, 3, 9.0, 9.0, [0.9] * 3)
    for k in range(1, 7):
        slow.update(k, k, 0.1 * k, 2 * cpu_verify(k), [0.9] * k)   # a host twice as slow, 2 to 7 rows
    schedule = AdaptiveSchedule(5, measured=slow)
    schedule.update(3, 3, 9.0, 9.0, [0.9] * 3)
    for k in (7, 8):   # two sizes of its own, on this host: 8 and 9 rows
        for _ in range(3):
            schedule.update(k, k, 0.1 * k, cpu_verify(k), [0.9] * k)
    assert schedule.costs.pass_s(4) == pytest.approx(cpu_verify(3), rel=0.02)   # the line is this host's alone
    assert slow.costs.pass_s(4) == pytest.approx(2 * cpu_verify(3), rel=0.02)


def test_drafts_without_confidences_keep_the_heuristics_window_after_an_earlier_generation():
    earlier = AdaptiveSchedule(5)
    for _ in range(4):
        earlier.update(4, 4, 0.0, 0.4)   # prompt lookup: model-free drafts, no confidences
    earlier.update(0, 0, 0.0, 0.3)       # the plain pass the switch compares with
    assert earlier.costs.known
    schedule = AdaptiveSchedule(5, measured=earlier)
    assert schedule.window == 5 and schedule.plain_s == pytest.approx(0.3)


def test_a_carried_calibration_keeps_what_was_learnt_at_a_weight_new_drafts_can_move():
    learnt = schedules.Calibration()
    for _ in range(100):
        learnt.observe([0.35], 1, 1)   # drafts at 0.35 confidence, always accepted (an assistant that is the target's
                                       # own decoder in int8 agrees even where both are unsure)
    carried = learnt.carried(schedules.CARRIED_DRAFTS)
    assert carried(0.35) == pytest.approx(learnt(0.35)) and learnt(0.35) > 0.95
    assert carried(0.75) == pytest.approx(0.75)   # no evidence there: the prior, as before
    for _ in range(schedules.CARRIED_DRAFTS):
        carried.observe([0.35], 1, 0)            # this input: all rejected
    assert carried(0.35) < 0.55 and learnt(0.35) > 0.95   # half-way back within as many drafts as it carried


def replay(schedule, trace, assistant_s, verify):
    """Simulated seconds to emit a trace of (accepted, confidence) per position, as the decoding loop would."""
    return schedules.replay(schedule, [a for a, _ in trace], [c for _, c in trace], assistant_s=assistant_s,
                            pass_s=lambda rows: verify(rows - 1))


def bursty_trace(seed, n=400, burst=0.9):
    """Runs of drafts the draft model is sure of and the target accepts, between runs it is unsure of and half of
    which the target rejects."""
    rng = random.Random(seed)
    trace, easy = [], True
    while len(trace) < n:
        easy = rng.random() < (burst if easy else 1 - burst)
        confidence = rng.uniform(0.85, 1.0) if easy else rng.uniform(0.2, 0.6)
        trace.append((rng.random() < confidence, confidence))
    return trace


@pytest.mark.parametrize("seed", range(3))
def test_on_bursty_drafts_it_beats_the_heuristic_and_plain_decoding(seed):
    trace = bursty_trace(seed)
    plain = len(trace) * cpu_verify(0)
    adaptive = replay(AdaptiveSchedule(5), trace, 0.05, cpu_verify)
    heuristic = replay(HeuristicSchedule(5), trace, 0.05, cpu_verify)
    assert adaptive < 0.93 * heuristic and adaptive < 0.92 * plain


def test_on_poor_drafts_it_stays_near_plain_decoding_where_the_heuristic_loses():
    rng = random.Random(0)
    trace = [(rng.random() < 0.2, rng.uniform(0.05, 0.3)) for _ in range(300)]
    plain = len(trace) * cpu_verify(0)
    # it still drafts one token per step to read its confidence: that costs one assistant pass (here 7 %)
    assert replay(AdaptiveSchedule(5), trace, 0.02, cpu_verify) < 1.1 * plain
    assert replay(HeuristicSchedule(5), trace, 0.02, cpu_verify) > 1.2 * plain


# -- drafts without confidences: the on/off decision ---------------------------------------------------------------

def test_good_cheap_drafts_get_a_wide_window():
    windows = run(AdaptiveSchedule(5), lambda k: k, assistant_s=0.01, verify=lambda k: 0.3 + 0.01 * k)
    assert windows[2] == 0  # one plain pass, measured after the first timed drafting step
    assert min(windows[3:]) >= 5 and windows[-1] >= 30


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
    assert schedule.switch.drafting_rate < 1 / schedule.plain_s


# -- in the decoding loop ------------------------------------------------------------------------------------------

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
        # every assistant pass drafted a token that was either verified or withheld
        assert assisted.assistant_passes == sum(len(s.candidates) + s.withheld for s in assisted.steps)


class Withholding:
    """A schedule that withholds every draft the draft model is less than 0.5 sure of."""

    def __init__(self, num_assistant_tokens):
        self.window = num_assistant_tokens

    def keep_drafting(self, confidences):
        return True

    def verify_count(self, confidences):
        return next((i for i, c in enumerate(confidences) if c < 0.5), len(confidences))

    def update(self, drafted, accepted, draft_s, verify_s, confidences=None):
        pass


def test_the_loop_withholds_greedy_drafts_as_the_schedule_asks():
    target, assistant, inputs = tm.qwen2(0), tm.perturbed(tm.qwen2(0), 0.5, 7), tm.decoder_inputs(0)
    result = generate(target, inputs, assistant_model=assistant, max_new_tokens=40,
                      num_assistant_tokens_schedule=Withholding(5))
    assert result.new_tokens == generate(target, inputs, max_new_tokens=40).new_tokens
    assert sum(s.withheld for s in result.steps) > 0


def test_sampled_drafts_are_never_withheld():
    """Withholding a sampled draft because of its own probability would bias speculative sampling (a draft's
    fate may depend only on the drafts before it), so under sampling the loop verifies everything drafted."""
    target, assistant = tm.qwen2(21, vocab=8, hidden=16, layers=1, init=0.5), tm.qwen2(22, vocab=8, hidden=16,
                                                                                          layers=1, init=0.5)
    inputs = {"input_ids": torch.tensor([[1, 2, 3]])}
    for seed in range(10):
        result = generate(target, inputs, assistant_model=assistant, do_sample=True, seed=seed, max_new_tokens=12,
                          num_assistant_tokens_schedule=Withholding(5))
        assert all(s.withheld == 0 for s in result.steps)


def test_a_lent_calibration_that_says_drafts_never_pay_is_corrected_by_probes():
    """Drafts at 0.6 confidence were never accepted on earlier inputs, so the lent calibration withholds them all; on
    this input the target accepts every one. Only verified drafts teach the calibration, so the schedule verifies a
    probe after `probe_every` steps without one, and keeps probing while probes are accepted: it recovers within
    tens of steps instead of decoding plainly to the end."""
    learnt = schedules.Calibration()
    for _ in range(200):
        learnt.observe([0.6], 1, 0)
    schedule = warmed(0.02, cpu_verify)
    schedule.calibrated = learnt.carried(schedules.CARRIED_DRAFTS)
    assert schedule.verify_count([0.6] * 5) == 0
    trace = [(True, 0.6)] * 300
    plain = len(trace) * cpu_verify(0)
    assert replay(schedule, trace, 0.02, cpu_verify) < 0.6 * plain
    stuck = warmed(0.02, cpu_verify)
    stuck.calibrated, stuck.probe_every = learnt.carried(schedules.CARRIED_DRAFTS), 10 ** 9   # no probes
    assert replay(stuck, trace, 0.02, cpu_verify) > plain
