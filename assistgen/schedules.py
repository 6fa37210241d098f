"""How many candidates to draft next (``num_assistant_tokens_schedule``)."""
from __future__ import annotations

from typing import Protocol


class WindowSchedule(Protocol):
    window: int  # number of candidates to draft in the next step

    def update(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None: ...


class ConstantSchedule:
    def __init__(self, num_assistant_tokens: int):
        self.window = num_assistant_tokens

    def update(self, drafted, accepted, draft_s, verify_s):
        pass


class HeuristicSchedule:
    """transformers' "heuristic": +2 after a step whose candidates were all accepted, otherwise -1 (at least 1)."""

    def __init__(self, num_assistant_tokens: int):
        self.window = num_assistant_tokens

    def update(self, drafted, accepted, draft_s, verify_s):
        if drafted == 0:
            return
        self.window = self.window + 2 if accepted == drafted else max(1, self.window - 1)


SCHEDULES = {"constant": ConstantSchedule, "heuristic": HeuristicSchedule}


def make_schedule(name: str, num_assistant_tokens: int) -> WindowSchedule:
    if name not in SCHEDULES:
        raise ValueError(f"num_assistant_tokens_schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    if num_assistant_tokens < 1:
        raise ValueError(f"num_assistant_tokens must be >= 1, got {num_assistant_tokens}")
    return SCHEDULES[name](num_assistant_tokens)
