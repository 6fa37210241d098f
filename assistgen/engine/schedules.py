"""How many candidates to draft next (``num_assistant_tokens_schedule``)."""
from __future__ import annotations

import copy
import math
from typing import Callable, Protocol


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


class Calibration:
    """How often a draft of each confidence is accepted, given that the drafts before it were: per confidence bin,
    learnt online from a prior of `prior_strength` drafts at the bin's own confidence."""

    def __init__(self, bins: int = 10, prior_strength: float = 4.0):
        self._hits = [prior_strength * (b + 0.5) / bins for b in range(bins)]
        self._seen = [prior_strength] * bins

    def _bin(self, confidence: float) -> int:
        return min(len(self._seen) - 1, max(0, int(confidence * len(self._seen))))

    def __call__(self, confidence: float) -> float:
        b = self._bin(confidence)
        return self._hits[b] / self._seen[b]

    def survival(self, confidences: list[float]) -> list[float]:
        """Each draft's chance to be accepted: the product of its own and every earlier draft's."""
        chances, chance = [], 1.0
        for c in confidences:
            chance *= self(c)
            chances.append(chance)
        return chances

    def carried(self, limit: float) -> "Calibration":
        """A copy for another generation, each bin's record scaled down to at most `limit` drafts: what was learnt
        stays, and the new input's own drafts still move it."""
        copied = copy.deepcopy(self)
        for b, seen in enumerate(copied._seen):
            if seen > limit:
                copied._hits[b] *= limit / seen
                copied._seen[b] = limit
        return copied

    def to_dict(self) -> dict:
        return {"hits": list(self._hits), "seen": list(self._seen)}

    @classmethod
    def from_dict(cls, state: dict) -> "Calibration":
        """`to_dict`'s data back; ValueError when it is not a calibration (bins of finite counts, 0 <= hits <= seen,
        seen > 0)."""
        hits, seen = [float(h) for h in state["hits"]], [float(n) for n in state["seen"]]
        if not hits or len(hits) != len(seen) or \
                any(not (math.isfinite(n) and n > 0 and 0 <= h <= n) for h, n in zip(hits, seen)):
            raise ValueError("a calibration needs as many hits as drafts seen per bin, each within 0..seen, seen > 0")
        calibration = cls(len(hits))
        calibration._hits, calibration._seen = hits, seen
        return calibration

    def observe(self, confidences: list[float], verified: int, accepted: int) -> None:
        # each verified draft up to the first rejection was tried with the ones before it accepted
        for i, c in enumerate(confidences[:min(verified, accepted + 1)]):
            b = self._bin(c)
            self._seen[b] += 1
            self._hits[b] += i < accepted


# Until a plain pass has been timed, the smallest verification measured is taken to cost this many plain passes,
# and with one verification size measured, each further row this fraction of it: the figures of the CPU this was
# developed on (docs/history.md), replaced as soon as the real ones are measured.
FIRST_VERIFY_OVER_PLAIN = 1.2
SLOPE_PER_ROW = 0.03


class PassCosts:
    """Seconds per assistant token, per plain target pass, and per verification pass as a line in the rows it
    reads, from decayed means (`decay`) of one generation's steps."""

    def __init__(self, decay: float = 0.7):
        self.decay = decay
        self.plain_s: float | None = None         # a plain pass (one row)
        self.assistant_s: float | None = None     # one drafted token
        self._verify: dict[int, float] = {}       # rows read (two or more) -> seconds
        self._line: tuple[float, float, float] | None = None  # (rows, seconds, seconds per row) through them
        self._lent: set[int] = set()              # sizes measured by an earlier generation (`lent`)

    def _mean(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new

    def observe(self, proposed: int, draft_s: float, rows: int, pass_s: float) -> None:
        if proposed:
            self.assistant_s = self._mean(self.assistant_s, draft_s / proposed)
        if rows == 1:
            self.plain_s = self._mean(self.plain_s, pass_s)
        else:
            self._verify[rows] = self._mean(self._verify.get(rows), pass_s)
            self._lent.discard(rows)
            if self._lent and len(self._verify) - len(self._lent) >= 2:   # a line of this generation's own
                for lent in self._lent:
                    del self._verify[lent]
                self._lent.clear()
            self._line = self._fit_line()

    def lent(self) -> "PassCosts":
        """A copy for another generation: its verification sizes give way once that one has measured two of its own
        (a slower or faster hour, a longer prompt), its other means are updated as usual."""
        copied = copy.deepcopy(self)
        copied._lent = set(copied._verify)
        return copied

    def to_dict(self) -> dict:
        return {"decay": self.decay, "plain_s": self.plain_s, "assistant_s": self.assistant_s,
                "verify": {str(rows): s for rows, s in self._verify.items()}}

    @classmethod
    def from_dict(cls, state: dict) -> "PassCosts":
        """`to_dict`'s data back; ValueError when it is not pass costs (finite positive seconds, verification passes
        of two rows or more, a decay in [0, 1))."""
        def seconds(value) -> float | None:
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"pass costs must be finite positive seconds, got {value!r}")
            return float(value)
        decay, verify = state["decay"], state["verify"]
        if not isinstance(decay, (int, float)) or not 0 <= decay < 1 or not isinstance(verify, dict):
            raise ValueError("pass costs need a decay in [0, 1) and verification seconds by rows")
        costs = cls(float(decay))
        costs.plain_s, costs.assistant_s = seconds(state["plain_s"]), seconds(state["assistant_s"])
        costs._verify = {int(rows): seconds(s) for rows, s in verify.items()}
        if any(rows < 2 or s is None for rows, s in costs._verify.items()):
            raise ValueError("verification passes read two rows or more, each with its seconds")
        costs._line = costs._fit_line() if costs._verify else None
        return costs

    def pass_s(self, rows: int) -> float | None:
        """Seconds of a target pass that reads `rows` tokens; None before anything was measured. A line fitted to
        the verification sizes measured, never below a plain pass."""
        if self._line is None:
            return self.plain_s if rows <= 1 else None
        plain_s = (self.plain_s if self.plain_s is not None
                   else self._verify[min(self._verify)] / FIRST_VERIFY_OVER_PLAIN)
        at_rows, at_s, slope = self._line
        return plain_s if rows <= 1 else max(plain_s, at_s + slope * (rows - at_rows))

    @property
    def known(self) -> bool:
        return self.assistant_s is not None and self.pass_s(2) is not None

    def _fit_line(self) -> tuple[float, float, float]:
        known = sorted(self._verify)
        if len(known) == 1:
            return known[0], self._verify[known[0]], SLOPE_PER_ROW * self._verify[known[0]]
        mean_r = sum(known) / len(known)
        mean_s = sum(self._verify[r] for r in known) / len(known)
        slope = sum((r - mean_r) * (self._verify[r] - mean_s) for r in known) / sum((r - mean_r) ** 2 for r in known)
        return mean_r, mean_s, max(0.0, slope)


class DraftSwitch:
    """For drafts without confidences: draft only while drafting steps realise more tokens per second than plain
    passes. While drafting loses, the assistant idles, with a probe at intervals that double while it keeps losing
    (`probe_every` steps at first; a probe keeps `probe_keep` of the old record, so its own result weighs)."""

    def __init__(self, decay: float = 0.7, probe_every: int = 8, probe_keep: float = 0.3):
        self.decay, self.probe_every, self.probe_keep = decay, probe_every, probe_keep
        self._tokens = self._seconds = 0.0   # realised output and cost of drafting steps, decayed sums
        self._idle, self._interval = 0, probe_every

    @property
    def drafting_rate(self) -> float | None:
        """Realised tokens per second of recent drafting steps."""
        return self._tokens / self._seconds if self._seconds else None

    def observe(self, emitted: int, seconds: float) -> None:
        self._tokens = self.decay * self._tokens + emitted
        self._seconds = self.decay * self._seconds + seconds

    def draft(self, plain_s: float) -> bool:
        """Draft in the next step? Called once per step, once a plain pass (`plain_s`) has been timed."""
        if self.drafting_rate >= 1.0 / plain_s:
            self._idle, self._interval = 0, self.probe_every
            return True
        self._idle += 1
        if self._idle < self._interval:
            return False
        self._idle, self._interval = 0, 2 * self._interval
        self._tokens *= self.probe_keep
        self._seconds *= self.probe_keep
        return True


# An earlier generation's calibration lends each confidence bin's record at the weight of at most this many drafts
CARRIED_DRAFTS = 20


class AdaptiveSchedule:
    """Cost-aware drafting: each draft token is weighed by the chance that the target accepts it against what it costs
    on this machine, both measured during this generation or lent by an earlier one (docs/design.md has the
    design, docs/history.md its history).

    - **Chance** (`Calibration`): the draft model's confidence in its token, mapped through a calibration learnt
      online; a draft survives if it and every draft before it are accepted.
    - **Cost** (`PassCosts`): seconds per assistant token, per plain target pass and per verification pass, from
      this generation's steps (the first, which also reads the prompt, is left out). A draft is worth one plain pass
      if accepted.
    - **Per token.** Keep drafting while the chance that the next draft survives pays for one more assistant pass
      and one more verified row. Then verify the prefix with the largest expected saving; drafts past it are
      withheld (none at all when the first does not pay: a plain pass). Every step drafts at least one token, to read
      its confidence, and after `probe_every` steps in a row without a verified draft the next step verifies its
      first one, and so does every step after it while such probes are accepted: the calibration learns only from
      verified drafts, so one that says drafts never pay (lent by other inputs, where they did not) could otherwise
      never be corrected.
    - **Until the costs are measured** (the first two steps) it drafts the heuristic's window, up to `max_window`
      after that. `measured`, an earlier generation's schedule with the same models on this machine, lends its costs
      and its calibration (at the weight of `CARRIED_DRAFTS` drafts a bin, so this input's own drafts soon count):
      then even the first step drafts by them, which matters most to generations only a few steps long.

    Without confidences (prompt lookup, an assistant with another tokenizer) the window follows the heuristic's
    +2/-1 rule, at least `min_window`, and a `DraftSwitch` decides whether to draft at all; the one plain pass it
    needs to compare with is taken after the first timed drafting step.
    """

    def __init__(self, num_assistant_tokens: int, *, decay: float = 0.7, min_window: int = 2, max_window: int = 32,
                 probe_every: int = 8, probe_keep: float = 0.3, bins: int = 10, prior_strength: float = 4.0,
                 measured: "AdaptiveSchedule | None" = None):
        self.window = self._k = min(num_assistant_tokens, max_window)
        self.min_window, self.max_window = min_window, max_window
        self.calibrated = Calibration(bins, prior_strength)
        self.costs = PassCosts(decay)
        self.switch = DraftSwitch(decay, probe_every, probe_keep)
        self.probe_every = probe_every
        self._steps = 0
        self._unverified = 0                       # steps in a row whose drafts were all withheld
        self._probed = self._probing = False       # this step verifies a probe; the last probe was accepted
        self._confident = False                    # the drafts come with confidences
        if measured is not None and measured.costs.known:
            self.costs = measured.costs.lent()
            self._confident = measured._confident
            self.calibrated = measured.calibrated.carried(CARRIED_DRAFTS)
            if self._confident:
                self.window = self.max_window

    def to_dict(self) -> dict:
        """What a later generation borrows (`measured`) as plain data: costs, calibration, and whether the drafts came
        with confidences."""
        return {"costs": self.costs.to_dict(), "calibration": self.calibrated.to_dict(), "confident": self._confident}

    @classmethod
    def from_dict(cls, state: dict) -> "AdaptiveSchedule":
        """A schedule holding `to_dict`'s measurements, to pass as another's `measured`. ValueError, KeyError or
        TypeError on a malformed state."""
        schedule = cls(1)
        schedule.costs = PassCosts.from_dict(state["costs"])
        schedule.calibrated = Calibration.from_dict(state["calibration"])
        if not isinstance(state["confident"], bool):
            raise ValueError("confident must be true or false")
        schedule._confident = state["confident"]
        return schedule

    @property
    def plain_s(self) -> float | None:
        return self.costs.plain_s

    @property
    def assistant_s(self) -> float | None:
        return self.costs.assistant_s

    def keep_drafting(self, confidences):
        if not self.costs.known:
            return True
        n, pass_s = len(confidences), self.costs.pass_s
        chance_next = self.calibrated.survival(confidences)[-1] * self.calibrated(confidences[-1])
        return chance_next * pass_s(1) >= self.costs.assistant_s + pass_s(n + 2) - pass_s(n + 1)

    def verify_count(self, confidences):
        if not self.costs.known:
            return len(confidences)
        best = gain = best_gain = 0.0
        pass_s = self.costs.pass_s
        for n, chance in enumerate(self.calibrated.survival(confidences), start=1):
            gain += chance * pass_s(1) - (pass_s(n + 1) - pass_s(n))
            if gain > best_gain:
                best, best_gain = n, gain
        self._probed = best == 0 and bool(confidences) and (self._probing or self._unverified + 1 >= self.probe_every)
        return 1 if self._probed else int(best)   # a probe: the calibration learns only from verified drafts

    def update(self, drafted, accepted, draft_s, verify_s, confidences=None):
        self._steps += 1
        if confidences is not None:
            self._confident = True
            self.calibrated.observe(confidences, drafted, accepted)
            if drafted:
                self._unverified, self._probing = 0, self._probed and accepted > 0
            elif confidences:
                self._unverified += 1
            self._probed = False
        if drafted:
            self._k = heuristic_window(self._k, drafted, accepted, lowest=self.min_window, highest=self.max_window)
        proposed = len(confidences) if confidences is not None else drafted
        if self._steps > 1:  # the first pass also reads the whole prompt
            self.costs.observe(proposed, draft_s, drafted + 1, verify_s)
            if proposed:
                self.switch.observe(accepted + 1, draft_s + verify_s)
        draft_window = self.max_window if self._confident and self.costs.known else self._k
        if self._confident or self._steps == 1 or self.switch.drafting_rate is None:
            self.window = draft_window
        elif self.plain_s is None:
            self.window = 0  # measure a plain pass: drafting has to beat it
        else:
            self.window = draft_window if self.switch.draft(self.plain_s) else 0


SCHEDULES = {"heuristic": HeuristicSchedule, "constant": ConstantSchedule, "adaptive": AdaptiveSchedule}


def make_schedule(name: str, num_assistant_tokens: int) -> WindowSchedule:
    if name not in SCHEDULES:
        raise ValueError(f"num_assistant_tokens_schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    if num_assistant_tokens < 1:
        raise ValueError(f"num_assistant_tokens must be >= 1, got {num_assistant_tokens}")
    return SCHEDULES[name](num_assistant_tokens)


def replay(schedule: WindowSchedule, accepted: list[bool], confidences: list[float] | None, *, assistant_s: float,
           pass_s: Callable[[int], float], prefill_s: float = 0.0) -> float:
    """Simulated seconds to emit one recorded generation under `schedule`, stepped as the decoding loop steps it.

    `accepted[i]`: would the target accept a draft at position i; `confidences[i]`: the draft model's probability of
    that draft (None: drafts without confidences; every step then drafts its whole window). `pass_s(rows)`: the
    seconds of a target pass over `rows` tokens; the first pass also pays `prefill_s`. With greedy drafts this is
    exact: the drafts at a position do not depend on the window they were drafted in."""
    n, i, seconds, first = len(accepted), 0, 0.0, True
    while i < n:
        k = min(schedule.window, n - i - 1)
        drafts: list[float] = []
        while len(drafts) < k:
            drafts.append(confidences[i + len(drafts)] if confidences is not None else 1.0)
            if confidences is not None and not schedule.keep_drafting(drafts):
                break
        verified = schedule.verify_count(drafts) if confidences is not None else len(drafts)
        kept = 0
        while kept < verified and accepted[i + kept]:
            kept += 1
        verify_s = pass_s(verified + 1) + (prefill_s if first else 0.0)
        draft_s = len(drafts) * assistant_s
        schedule.update(verified, kept, draft_s, verify_s, drafts if confidences is not None else None)
        seconds += draft_s + verify_s
        i, first = i + kept + 1, False
    return seconds
