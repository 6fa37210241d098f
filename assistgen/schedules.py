"""How many candidates to draft next (``num_assistant_tokens_schedule``)."""
from __future__ import annotations

from typing import Protocol


class WindowSchedule(Protocol):
    window: int  # at most this many candidates to draft in the next step

    def keep_drafting(self, confidences: list[float]) -> bool:
        """After each drafted token, given the draft model's confidence in each so far: draft another?"""
        ...

    def verify_count(self, confidences: list[float]) -> int:
        """How many of the drafted tokens (with these confidences) the target should verify."""
        ...

    def update(self, drafted: int, accepted: int, draft_s: float, verify_s: float,
               confidences: list[float] | None = None) -> None:
        """After a step: `drafted` candidates verified, `accepted` of them kept; `confidences` of every token the
        draft model proposed (None for model-free drafts)."""
        ...


def heuristic_window(window: int, drafted: int, accepted: int, *, lowest: int = 1, highest: int | None = None) -> int:
    """transformers' "heuristic" rule: +2 after a step whose candidates were all accepted, otherwise -1."""
    window = window + 2 if accepted == drafted else max(lowest, window - 1)
    return window if highest is None else min(highest, window)


class ConstantSchedule:
    def __init__(self, num_assistant_tokens: int):
        self.window = num_assistant_tokens

    def keep_drafting(self, confidences):
        return True

    def verify_count(self, confidences):
        return len(confidences)

    def update(self, drafted, accepted, draft_s, verify_s, confidences=None):
        pass


class HeuristicSchedule(ConstantSchedule):
    """transformers' "heuristic": +2 after a step whose candidates were all accepted, otherwise -1 (at least 1)."""

    def update(self, drafted, accepted, draft_s, verify_s, confidences=None):
        if drafted:
            self.window = heuristic_window(self.window, drafted, accepted)


class AdaptiveSchedule:
    """Cost-aware drafting: each draft token is weighed by the chance that the target accepts it against what it costs
    on this machine, both measured during this generation.

    - **Chance.** The draft model's confidence in its token (its probability), mapped through a calibration learnt
      online: per confidence bin, how often such a draft was accepted, given that the drafts before it were (a prior
      of `prior_strength` drafts at the bin's own confidence). A draft's chance to survive is the product of the
      chances of it and every draft before it.
    - **Cost.** Seconds per assistant token, a plain target pass (one row), and a verification pass as a line in
      the rows it reads (two or more: k drafts need k + 1), from decayed means of this generation's steps (the
      first, which also reads the prompt, is left out). A draft is worth one plain pass if accepted.
    - **Per token.** Keep drafting while the chance that the next draft survives (this one's chance times its own
      calibrated confidence again) pays for one more assistant pass and one more verified row. Then verify the
      prefix with the largest expected saving: the sum of survival chances times a plain pass, less the extra
      verification seconds. Drafts past it are withheld (none at all when the first does not pay: a plain pass).
      So every step drafts at least one token, to read its confidence: where drafts never pay, that one assistant
      pass per step is what the schedule costs. Skipping it by a rule on recent steps was tried on the recorded
      traces and won nothing: the confidence of the next draft is the best predictor found.
    - **Until the costs are measured** (the first two steps) it drafts the heuristic's window, up to `max_window`
      after that.

    Without confidences (prompt lookup, an assistant with another tokenizer) the window follows the heuristic's
    +2/-1 rule, at least `min_window`, and the decision is only whether to draft at all: after the first timed
    drafting step one plain pass is measured, the realised tokens per second of drafting steps (decayed) is compared
    with it, and while drafting loses the assistant idles, with a probe at intervals that double while it keeps
    losing.

    Why per token? Acceptance is far from i.i.d.: it comes in bursts (a code block is accepted run after run, prose
    is not), and the draft model's confidence tracks them. This schedule's first version picked one k per step,
    k = argmax E[tokens | alpha, k] / (k T_assistant + T_verify(k)), from an i.i.d. acceptance rate alpha; on
    recorded acceptance traces of the offline Qwen pair it lost to the plain heuristic (README "Results"). Its second
    kept the heuristic's window and only switched drafting on and off by realised tokens per second: better where
    drafts are poor, worse on code, where it switched off during short runs of rejections.
    """

    def __init__(self, num_assistant_tokens: int, *, decay: float = 0.7, min_window: int = 2, max_window: int = 32,
                 probe_every: int = 8, probe_keep: float = 0.3, bins: int = 10, prior_strength: float = 4.0):
        self.window = self._k = min(num_assistant_tokens, max_window)
        self.decay, self.min_window, self.max_window = decay, min_window, max_window
        self.probe_every, self.probe_keep = probe_every, probe_keep
        self._hits = [prior_strength * (b + 0.5) / bins for b in range(bins)]
        self._seen = [prior_strength] * bins
        self.plain_s: float | None = None         # seconds of a plain pass, decayed mean
        self.assistant_s: float | None = None     # seconds per drafted token, decayed mean
        self._verify: dict[int, float] = {}        # rows read -> seconds, decayed means (two rows or more)
        self._line: tuple[float, float, float] | None = None  # a line through them, refitted when they change
        self._tokens = self._seconds = 0.0         # realised output and cost of drafting steps, decayed sums
        self._steps = self._idle = 0
        self._interval = probe_every
        self._confident = False                    # the drafts come with confidences

    # -- what it has learnt -------------------------------------------------------------------------------------
    def _bin(self, confidence: float) -> int:
        return min(len(self._seen) - 1, max(0, int(confidence * len(self._seen))))

    def calibrated(self, confidence: float) -> float:
        """How often a draft of this confidence is accepted (given the drafts before it were)."""
        b = self._bin(confidence)
        return self._hits[b] / self._seen[b]

    def verify_s(self, rows: int) -> float | None:
        """Seconds of a target pass that reads `rows` tokens; None before anything was measured. A line fitted to
        the verification sizes measured, never below a plain pass."""
        if self._line is None:
            return self.plain_s if rows <= 1 else None
        # no plain pass measured yet: assume the smallest verification measured costs 1.2 of one
        plain_s = self.plain_s if self.plain_s is not None else self._verify[min(self._verify)] / 1.2
        at_rows, at_s, slope = self._line
        return plain_s if rows <= 1 else max(plain_s, at_s + slope * (rows - at_rows))

    def _fit_line(self) -> tuple[float, float, float]:
        """(rows, seconds, seconds per row) through the verification sizes measured."""
        known = sorted(self._verify)
        if len(known) == 1:  # one size measured: assume 3 % more per row
            return known[0], self._verify[known[0]], 0.03 * self._verify[known[0]]
        mean_r = sum(known) / len(known)
        mean_s = sum(self._verify[r] for r in known) / len(known)
        slope = sum((r - mean_r) * (self._verify[r] - mean_s) for r in known) / sum((r - mean_r) ** 2 for r in known)
        return mean_r, mean_s, max(0.0, slope)

    @property
    def drafting_rate(self) -> float | None:
        """Realised tokens per second of recent drafting steps."""
        return self._tokens / self._seconds if self._seconds else None

    def _costs_known(self) -> bool:
        return self.assistant_s is not None and self.verify_s(2) is not None

    def _survival(self, confidences: list[float]) -> list[float]:
        chances, chance = [], 1.0
        for c in confidences:
            chance *= self.calibrated(c)
            chances.append(chance)
        return chances

    # -- the per-token decisions --------------------------------------------------------------------------------
    def keep_drafting(self, confidences):
        if not self._costs_known():
            return True
        n = len(confidences)
        chance_next = self._survival(confidences)[-1] * self.calibrated(confidences[-1])
        extra_s = self.assistant_s + self.verify_s(n + 2) - self.verify_s(n + 1)
        return chance_next * self.verify_s(1) >= extra_s

    def verify_count(self, confidences):
        if not self._costs_known():
            return len(confidences)
        best = gain = best_gain = 0.0
        for n, chance in enumerate(self._survival(confidences), start=1):
            gain += chance * self.verify_s(1) - (self.verify_s(n + 1) - self.verify_s(n))
            if gain > best_gain:
                best, best_gain = n, gain
        return int(best)

    # -- learning from each step --------------------------------------------------------------------------------
    def update(self, drafted, accepted, draft_s, verify_s, confidences=None):
        self._steps += 1
        d = self.decay
        if confidences is not None:
            self._confident = True
            # each verified draft up to the first rejection was tried with the ones before it accepted
            for i, c in enumerate(confidences[:min(drafted, accepted + 1)]):
                b = self._bin(c)
                self._seen[b] += 1
                self._hits[b] += i < accepted
        if drafted:
            self._k = heuristic_window(self._k, drafted, accepted, lowest=self.min_window, highest=self.max_window)
        proposed = len(confidences) if confidences is not None else drafted
        if self._steps > 1:  # the first pass also reads the whole prompt
            if proposed:
                per = draft_s / proposed
                self.assistant_s = per if self.assistant_s is None else d * self.assistant_s + (1 - d) * per
                self._tokens = d * self._tokens + accepted + 1
                self._seconds = d * self._seconds + draft_s + verify_s
            rows = drafted + 1
            if rows == 1:
                self.plain_s = verify_s if self.plain_s is None else d * self.plain_s + (1 - d) * verify_s
            else:
                old = self._verify.get(rows)
                self._verify[rows] = verify_s if old is None else d * old + (1 - d) * verify_s
                self._line = self._fit_line()
        draft_window = self.max_window if self._confident and self._costs_known() else self._k
        if self._confident or self._steps == 1 or self.drafting_rate is None:
            self.window = draft_window
        elif self.plain_s is None:
            self.window = 0  # measure a plain pass: drafting has to beat it
        elif self.drafting_rate < 1.0 / self.plain_s:
            self._idle += 1  # drafting loses: plain decoding, with a probe now and then, ever further apart
            if self._idle >= self._interval:
                self._idle, self._interval = 0, 2 * self._interval
                self._tokens *= self.probe_keep  # let the probe's own result weigh
                self._seconds *= self.probe_keep
                self.window = draft_window
            else:
                self.window = 0
        else:
            self._idle, self._interval = 0, self.probe_every
            self.window = draft_window


SCHEDULES = {"constant": ConstantSchedule, "heuristic": HeuristicSchedule, "adaptive": AdaptiveSchedule}


def make_schedule(name: str, num_assistant_tokens: int) -> WindowSchedule:
    if name not in SCHEDULES:
        raise ValueError(f"num_assistant_tokens_schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    if num_assistant_tokens < 1:
        raise ValueError(f"num_assistant_tokens must be >= 1, got {num_assistant_tokens}")
    return SCHEDULES[name](num_assistant_tokens)
