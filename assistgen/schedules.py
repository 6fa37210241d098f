"""How many candidates to draft next (``num_assistant_tokens_schedule``)."""
from __future__ import annotations

from typing import Protocol


class WindowSchedule(Protocol):
    window: int  # number of candidates to draft in the next step

    def update(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None: ...


def heuristic_window(window: int, drafted: int, accepted: int, *, lowest: int = 1, highest: int | None = None) -> int:
    """transformers' "heuristic" rule: +2 after a step whose candidates were all accepted, otherwise -1."""
    window = window + 2 if accepted == drafted else max(lowest, window - 1)
    return window if highest is None else min(highest, window)


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
        if drafted:
            self.window = heuristic_window(self.window, drafted, accepted)


class AdaptiveSchedule:
    """Cost-aware: draft only while drafting pays on this machine, as measured during this generation.

    The window follows the heuristic's rule (+2 after a step whose drafts were all accepted, -1 otherwise), at least
    `min_window`, because acceptance comes in bursts: a code block is accepted run after run, prose is not, and a
    growing window rides a burst. What this schedule adds is the decision whether to draft at all. It measures a
    plain pass (k = 0: the target alone, the assistant idle) and the realised tokens per second of drafting steps
    (tokens emitted over assistant plus verification seconds, exponentially decayed), and drafts only while that
    beats plain decoding. When it does not, the assistant idles, and a probe at the current window re-tests drafting
    at intervals that double while drafting keeps losing. The first step (it also reads the prompt) is left out of
    the costs, and the step after the first timed drafting step is a plain pass, to measure one.

    Why not pick k from a model, k = argmax E[tokens | alpha, k] / (k T_assistant + T_verify(k)) with E from an
    i.i.d. acceptance rate? That model was this schedule's first version. Acceptance is far from i.i.d. (see the
    bursts above), so the model underrates long windows inside a burst and overrates short ones outside it: on
    recorded acceptance traces of the offline Qwen pair it lost to the plain heuristic on code (1.31x vs 1.51x,
    README "Results").
    """

    def __init__(self, num_assistant_tokens: int, *, decay: float = 0.7, min_window: int = 2, probe_every: int = 8,
                 max_window: int = 64, probe_keep: float = 0.3):
        self.window = self._k = num_assistant_tokens
        self.decay, self.min_window, self.max_window = decay, min_window, max_window
        self.probe_every, self.probe_keep = probe_every, probe_keep
        self.plain_s: float | None = None       # seconds of a plain pass, decayed mean
        self._tokens = self._seconds = 0.0      # realised output and cost of drafting steps, decayed sums
        self._steps = self._idle = 0
        self._interval = probe_every

    @property
    def drafting_rate(self) -> float | None:
        """Realised tokens per second of recent drafting steps."""
        return self._tokens / self._seconds if self._seconds else None

    def update(self, drafted, accepted, draft_s, verify_s):
        self._steps += 1
        d = self.decay
        if drafted:
            self._k = heuristic_window(self._k, drafted, accepted, lowest=self.min_window, highest=self.max_window)
            if self._steps > 1:  # the first pass also reads the whole prompt
                self._tokens = d * self._tokens + accepted + 1
                self._seconds = d * self._seconds + draft_s + verify_s
        elif self._steps > 1:
            self.plain_s = verify_s if self.plain_s is None else d * self.plain_s + (1 - d) * verify_s
        if self._steps == 1:
            self.window = self._k
        elif self.plain_s is None:
            self.window = 0  # measure a plain pass: drafting has to beat it
        elif self.drafting_rate is not None and self.drafting_rate < 1.0 / self.plain_s:
            self._idle += 1  # drafting loses: plain decoding, with a probe now and then, ever further apart
            if self._idle >= self._interval:
                self._idle, self._interval = 0, 2 * self._interval
                self._tokens *= self.probe_keep  # let the probe's own result weigh
                self._seconds *= self.probe_keep
                self.window = self._k
            else:
                self.window = 0
        else:
            self._idle, self._interval = 0, self.probe_every
            self.window = self._k


SCHEDULES = {"constant": ConstantSchedule, "heuristic": HeuristicSchedule, "adaptive": AdaptiveSchedule}


def make_schedule(name: str, num_assistant_tokens: int) -> WindowSchedule:
    if name not in SCHEDULES:
        raise ValueError(f"num_assistant_tokens_schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    if num_assistant_tokens < 1:
        raise ValueError(f"num_assistant_tokens must be >= 1, got {num_assistant_tokens}")
    return SCHEDULES[name](num_assistant_tokens)
