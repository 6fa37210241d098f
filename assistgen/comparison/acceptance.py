"""Acceptance in the serving engines' vocabulary (vLLM's speculative-decoding metrics), from a run's per-step trace.

A *drafting pass* is a target pass that verified at least one draft (`Step.candidates` not empty). Drafts the
schedule withheld were never verified and count nowhere here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..engine.decoding import Step


@dataclass(frozen=True)
class Acceptance:
    """How a run's drafts fared, as vLLM names and defines its speculative-decoding metrics."""
    drafting_passes: int
    """target passes that verified at least one draft (vLLM's num_drafts)"""
    drafted_tokens: int
    """drafts verified, over all passes (vLLM's num_draft_tokens)"""
    accepted_tokens: int
    """drafts the target kept (vLLM's num_accepted_tokens)"""
    mean_acceptance_length: float | None
    """1 + accepted_tokens / drafting_passes: tokens one drafting pass emits, counting the target's own (bonus)
    token; 1.0 means no draft ever helped. None when nothing was drafted."""
    draft_acceptance_rate: float | None
    """accepted_tokens / drafted_tokens. None when nothing was drafted."""
    per_position: list[float]
    """per_position[i]: of the passes that verified at least i + 1 drafts, the share whose (i + 1)-th draft was
    kept. With a fixed window this is vLLM's per-position acceptance rate (accepted at position i / num_drafts)."""
    per_position_passes: list[int]
    """per_position_passes[i]: how many passes verified at least i + 1 drafts (the denominator above)"""
    zero_accept_share: float | None
    """the share of drafting passes that kept none of their drafts. None when nothing was drafted."""
    alpha: float | None
    """acceptance per draft the target reached: accepted_tokens / (accepted_tokens + passes that rejected a draft).
    Drafts after a pass's first rejection are never judged, so this, not the draft acceptance rate, estimates the
    per-token acceptance probability α of Leviathan et al. None when no draft was judged."""

    def to_dict(self) -> dict:
        out = asdict(self)
        for key in ("mean_acceptance_length", "draft_acceptance_rate", "zero_accept_share", "alpha"):
            out[key] = None if out[key] is None else round(out[key], 4)
        out["per_position"] = [round(v, 4) for v in self.per_position]
        return out


def acceptance(steps: list[Step]) -> Acceptance:
    """The acceptance figures of one run's steps (a baseline's: no drafting passes, every ratio None)."""
    drafting = [s for s in steps if s.candidates]
    drafted = sum(len(s.candidates) for s in drafting)
    accepted = sum(s.accepted for s in drafting)
    longest = max((len(s.candidates) for s in drafting), default=0)
    reached = [sum(len(s.candidates) > i for s in drafting) for i in range(longest)]
    kept = [sum(len(s.candidates) > i and s.accepted > i for s in drafting) for i in range(longest)]
    rejections = sum(s.accepted < len(s.candidates) for s in drafting)
    n = len(drafting)
    return Acceptance(
        drafting_passes=n, drafted_tokens=drafted, accepted_tokens=accepted,
        mean_acceptance_length=1 + accepted / n if n else None,
        draft_acceptance_rate=accepted / drafted if drafted else None,
        per_position=[k / r for k, r in zip(kept, reached)], per_position_passes=reached,
        zero_accept_share=sum(s.accepted == 0 for s in drafting) / n if n else None,
        alpha=accepted / (accepted + rejections) if accepted + rejections else None)
