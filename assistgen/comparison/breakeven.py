"""The break-even of assisted generation: the speedup the standard formula predicts from measured parts, beside the
measured one.

Leviathan et al. (2023), with α the chance that the target keeps a draft, γ drafts per pass and c the assistant's
cost per pass over the target's: one target pass emits (1 - α^(γ+1)) / (1 - α) tokens on average and costs
γc + 1 target passes of time, so

    predicted speedup = (1 - α^(γ+1)) / ((1 - α)(γc + 1))

It assumes that verifying γ + 1 rows costs what one row costs, that drafts are accepted independently, and that
nothing but passes takes time (no setup, no prompt pass). Where the measured speedup is more than `DISAGREE` away,
`BreakEven.why` names the assumption the run's own measurements break most.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

DISAGREE = 0.20   # measured and predicted further apart than this (relative to the prediction) is said plainly


def predicted_speedup(alpha: float, gamma: float, c: float) -> float:
    """(1 - α^(γ+1)) / ((1 - α)(γc + 1)); at α = 1, (γ + 1) / (γc + 1)."""
    emitted = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return emitted / (gamma * c + 1)


def break_even_alpha(gamma: float, c: float) -> float | None:
    """The α at which the predicted speedup is 1 for this window and cost (bisection: the speedup grows with α);
    None when even α = 1 does not pay (c ≥ 1)."""
    if predicted_speedup(1.0, gamma, c) <= 1:
        return None
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if predicted_speedup(mid, gamma, c) < 1 else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class BreakEven:
    """A finished comparison's break-even reading."""
    alpha: float
    """acceptance per draft the target reached (`acceptance.Acceptance.alpha`)"""
    gamma: float
    """drafts verified per drafting pass, on average (the window the schedule actually used)"""
    c: float
    """the assistant's seconds per pass over the target's (`compare.cost_ratio`)"""
    predicted: float
    """the formula's speedup at α, γ, c"""
    measured: float
    """baseline latency / assisted latency"""
    break_even_alpha: float | None
    """below this α, at this γ and c, the formula predicts assisted is slower than the target alone"""
    disagrees: bool
    """measured and predicted more than `DISAGREE` apart (relative to the prediction)"""
    why: str | None
    """when they disagree: the measured part that the formula leaves out and that weighs most here"""

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _why(result: dict, predicted: float, measured: float) -> str:
    """Which of the formula's assumptions this run's own measurements break most, in numbers."""
    b, a = result["baseline"]["time"], result["assisted"]["time"]
    reasons = []
    if a["s_per_pass"] and b["s_per_pass"]:
        rows = a["rows_verified"] / a["passes_after_prompt"] if a["passes_after_prompt"] else 1
        factor = a["s_per_pass"] / b["s_per_pass"]
        if factor > 1.1:
            reasons.append((factor, f"a verification pass over {rows:.1f} rows took {factor:.2f}× a one-token pass "
                                    "(the formula counts it as 1×)"))
    fixed = (a["setup_s"] + a["prompt_s"]) + (b["setup_s"] + b["prompt_s"])
    total = result["assisted"]["latency_s"] + result["baseline"]["latency_s"]
    if total and fixed / total > 0.1:
        reasons.append((1 + fixed / total, f"setup and the prompt pass took {fixed / total:.0%} of both runs' time, "
                                            "which no draft can shorten (the formula counts only later passes)"))
    if a["other_s"] + a["drafting_s"] > 0 and not reasons:
        reasons.append((1.0, "acceptance varies along the output (the formula assumes every draft is accepted with "
                             "the same chance) or the machine's speed moved between the runs"))
    direction = "slower" if measured < predicted else "faster"
    return f"measured {direction} than predicted: " + "; ".join(r for _, r in sorted(reasons, reverse=True))


def break_even(result: dict) -> BreakEven | None:
    """The break-even reading of a comparison's JSON (`Comparison.to_dict()`), or None when the assisted run did not
    draft, or c could not be measured."""
    acc, c = result["assisted"].get("acceptance"), result.get("cost_ratio")
    if not acc or acc["alpha"] is None or c is None or not acc["drafting_passes"]:
        return None
    alpha, gamma, measured = acc["alpha"], acc["drafted_tokens"] / acc["drafting_passes"], result["speedup"]
    predicted = predicted_speedup(alpha, gamma, c)
    disagrees = abs(measured - predicted) > DISAGREE * predicted
    return BreakEven(alpha, gamma, c, predicted, measured, break_even_alpha(gamma, c), disagrees,
                     _why(result, predicted, measured) if disagrees else None)
