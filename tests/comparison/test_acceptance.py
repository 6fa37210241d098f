"""Acceptance in vLLM's vocabulary and the break-even formula, on hand-built traces whose figures are known."""
import pytest

from assistgen.comparison.acceptance import acceptance
from assistgen.comparison.breakeven import break_even_alpha, predicted_speedup
from assistgen.engine.decoding import Step


def step(drafted: int, accepted: int, withheld: int = 0) -> Step:
    candidates = list(range(10, 10 + drafted))
    return Step(candidates, accepted, candidates[:accepted] + [99], drafted, 0.0, 0.0, withheld)


def test_acceptance_figures_on_a_known_trace():
    # a plain prompt step, then four drafting passes: 3 of 3 kept, 1 of 3, 0 of 2, 2 of 4
    trace = [step(0, 0), step(3, 3), step(3, 1), step(2, 0), step(4, 2)]
    acc = acceptance(trace)
    assert (acc.drafting_passes, acc.drafted_tokens, acc.accepted_tokens) == (4, 12, 6)
    assert acc.mean_acceptance_length == pytest.approx(1 + 6 / 4)
    assert acc.draft_acceptance_rate == pytest.approx(6 / 12)
    assert acc.per_position_passes == [4, 4, 3, 1]
    assert acc.per_position == pytest.approx([3 / 4, 2 / 4, 1 / 3, 0 / 1])
    assert acc.zero_accept_share == pytest.approx(1 / 4)
    assert acc.alpha == pytest.approx(6 / (6 + 3))   # three passes rejected a draft


def test_a_baseline_has_no_acceptance_figures():
    acc = acceptance([step(0, 0), step(0, 0)])
    assert acc.drafting_passes == 0 and acc.per_position == []
    assert acc.mean_acceptance_length is None and acc.draft_acceptance_rate is None and acc.alpha is None


def test_withheld_drafts_are_not_counted_as_drafted():
    acc = acceptance([step(2, 2, withheld=3)])
    assert acc.drafted_tokens == 2 and acc.draft_acceptance_rate == 1.0 and acc.per_position == [1.0, 1.0]


def test_the_formula_matches_leviathan_et_al():
    # α = 0.8, γ = 5, c = 0.05: (1 - 0.8^6) / (0.2 × 1.25) = 2.951...
    assert predicted_speedup(0.8, 5, 0.05) == pytest.approx((1 - 0.8 ** 6) / (0.2 * 1.25))
    assert predicted_speedup(1.0, 4, 0.0) == pytest.approx(5.0)
    assert predicted_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)   # nothing accepted: slower by the drafting


def test_the_break_even_alpha_is_where_the_prediction_is_one():
    alpha = break_even_alpha(5, 0.1)
    assert predicted_speedup(alpha, 5, 0.1) == pytest.approx(1.0, abs=1e-6)
    assert predicted_speedup(alpha - 0.05, 5, 0.1) < 1 < predicted_speedup(alpha + 0.05, 5, 0.1)
    assert break_even_alpha(5, 1.0) is None   # an assistant as slow as the target never pays
