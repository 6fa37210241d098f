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


class AdaptiveSchedule:
    """Cost-aware window: pick the k that maximises expected tokens per second, measured online.

    With per-draft acceptance probability alpha, a step drafting k tokens yields E = (1 - alpha^(k+1)) / (1 - alpha)
    tokens and costs k * T_assistant + T_verify(k), so k = argmax E / cost. k = 0 (plain decoding, the assistant idle)
    is allowed; then a probe of `probe_window` drafts runs every `probe_every` steps to re-measure alpha.

    alpha: decayed counts of accepted drafts over trials (a rejection ends a step's trials). T_assistant: decayed
    seconds per drafted token. T_verify(k): a line fitted to decayed per-k means of the target pass time, since
    verifying k drafts is far from free on a CPU. The first step (the prompt's prefill) is left out of the costs.
    """

    def __init__(self, num_assistant_tokens: int, *, max_window: int = 32, decay: float = 0.85,
                 probe_every: int = 8, probe_window: int = 3, explore_every: int = 4):
        self.window = num_assistant_tokens
        self.explore_every = explore_every
        self.max_window, self.decay = max_window, decay
        self.probe_every, self.probe_window = probe_every, probe_window
        self._accepted = self._trials = 0.0
        self._assistant_s = self._assistant_n = 0.0
        self._verify: dict[int, float] = {}  # k -> decayed mean seconds of a target pass verifying k drafts
        self._steps = self._idle = 0

    @property
    def alpha(self) -> float:
        return (self._accepted + 1.0) / (self._trials + 2.0)  # Laplace prior: 0.5 before any evidence

    def verify_seconds(self, k: int) -> float:
        ks = sorted(self._verify)
        if not ks:
            return 1.0
        if len(ks) == 1:  # one point: assume a mild slope until a second window size is seen
            return self._verify[ks[0]] * (1 + 0.1 * (k - ks[0])) if k >= ks[0] else self._verify[ks[0]]
        n = len(ks)
        mean_k = sum(ks) / n
        mean_t = sum(self._verify[x] for x in ks) / n
        slope = sum((x - mean_k) * (self._verify[x] - mean_t) for x in ks) / sum((x - mean_k) ** 2 for x in ks)
        return max(1e-6, mean_t + max(0.0, slope) * (k - mean_k))

    def expected_rate(self, k: int) -> float:
        """Expected tokens per second of a step with window k."""
        alpha = min(self.alpha, 0.999)
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha)
        per_draft = self._assistant_s / self._assistant_n if self._assistant_n else 0.0
        return tokens / (k * per_draft + self.verify_seconds(k))

    def update(self, drafted, accepted, draft_s, verify_s):
        self._steps += 1
        d = self.decay
        if drafted:
            self._accepted = d * self._accepted + accepted
            self._trials = d * self._trials + accepted + (1 if accepted < drafted else 0)
        if self._steps > 1:  # the first pass also reads the whole prompt
            if drafted:
                self._assistant_s = d * self._assistant_s + draft_s
                self._assistant_n = d * self._assistant_n + drafted
            old = self._verify.get(drafted)
            self._verify[drafted] = verify_s if old is None else d * old + (1 - d) * verify_s
        if not (self._assistant_n and self._verify):  # no costs measured yet: behave like "heuristic"
            if drafted:
                self.window = self.window + 2 if accepted == drafted else max(1, self.window - 1)
            return
        best = max(range(self.max_window + 1), key=self.expected_rate)
        if best and self._steps % self.explore_every == 0:  # a neighbouring window now and then: the cost fit
            best = best + (1 if (self._steps // self.explore_every) % 2 else -1)  # needs two k values, k=0 too
        if best == 0:
            self._idle += 1
            best = self.probe_window if self._idle % self.probe_every == 0 else 0
        else:
            self._idle = 0
        self.window = best


SCHEDULES = {"constant": ConstantSchedule, "heuristic": HeuristicSchedule, "adaptive": AdaptiveSchedule}


def make_schedule(name: str, num_assistant_tokens: int) -> WindowSchedule:
    if name not in SCHEDULES:
        raise ValueError(f"num_assistant_tokens_schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    if num_assistant_tokens < 1:
        raise ValueError(f"num_assistant_tokens must be >= 1, got {num_assistant_tokens}")
    return SCHEDULES[name](num_assistant_tokens)
