"""A short, fixed probe of the machine's speed around a comparison, so its figures know when they can't be trusted.

On a shared machine a busy neighbour, a page cache still settling after an install, or a CPU that changes clock can
slow one run and not the other, and nothing in the run itself shows it: the speedup is then simply wrong. So the
comparison times one fixed target pass (the prompt's next token, with the prompt in the KV cache: exactly a baseline
decoding step) before the baseline, between the two runs and after the assisted run, and compares each run's own
passes with the probes around it. When the machine's speed moved by more than `TOLERANCE`, the result says so.

Back-to-back probes move by tens of per cent even on an idle machine (docs/history.md): one probe is a snapshot. A
run's lower quartile over tens of passes is steadier, so the runs are judged against the band the probes around them
span, and the probes among themselves only past `PROBE_SPREAD`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..engine.decoding import GenerationResult, decoder_prefix, synchronized_clock
from ..engine.kv import CachedDecoder

TOLERANCE = 0.15   # a run whose passes moved by more than this against the probes around it is reported
PROBE_SPREAD = 2 * TOLERANCE   # the probes themselves: one probe is a second of the machine, noisier than a run
REPEATS = 3        # passes per probe; the fastest stands for the machine (interference only ever adds time)
MIN_PASSES = 3     # a run's own passes of the probe's shape needed to judge it
PROMPT_TOKENS = 8


def lower_quartile(values: list[float]) -> float:
    """The run's counterpart of a probe's fastest of three: about the 25th percentile of its passes."""
    ordered = sorted(values)
    return ordered[len(ordered) // 4]


class SpeedProbe:
    """Times a target pass of a fixed shape: `rows` copies of one fixed token fed after a fixed prompt.

    Built once per loaded pair, by its warm-up and from the warm-up's input (a decoder-only prompt cut to
    `prompt_tokens`, so a long prompt does not make the probe long; an encoder runs once, here), and kept: every
    later probe has the same shape. The benchmark's verify(k) curve keeps the whole prompt (`prompt_tokens=None`),
    for a realistic context.
    """

    def __init__(self, model, inputs: dict, *, prompt_tokens: int | None = PROMPT_TOKENS):
        prefix = decoder_prefix(model, inputs)
        if not model.config.is_encoder_decoder and prompt_tokens is not None:
            prefix = prefix[:prompt_tokens]
            inputs = {"input_ids": torch.tensor([prefix])}
        self._decoder = CachedDecoder(model, inputs, prefix_length=len(prefix))
        self._prefix = prefix
        self._token = int(self._decoder.logits(prefix)[0].argmax())   # the prompt pass, once and untimed

    def pass_s(self, rows: int = 1) -> float:
        """Seconds of the fastest of `REPEATS` passes over `rows` tokens after the prompt (the cache is cropped back
        each time, so every pass has the same shape)."""
        tokens = self._prefix + [self._token] * rows
        clock = synchronized_clock(self._decoder.device)
        times = []
        for _ in range(REPEATS):
            started = clock()
            self._decoder.logits(tokens, keep=rows)
            times.append(clock() - started)
        return min(times)


@dataclass
class Stability:
    """The probes and each run's own passes of the same shape; `warnings` when the machine's speed moved."""
    probe_s: dict[str, float]                  # "before", "between", "after": one plain target pass
    baseline_pass_s: float | None              # the baseline's decoding passes (the prompt's excluded), lower quartile
    assisted_rows: int | None = None           # the assisted run's most common verification shape, in rows
    assisted_pass_s: float | None = None       # its passes of that shape, lower quartile
    probe_rows_s: float | None = None          # the probe of that shape, after the assisted run
    warnings: list[str] = field(default_factory=list)

    @property
    def stable(self) -> bool:
        return not self.warnings

    def to_dict(self) -> dict:
        r = lambda v: None if v is None else round(v, 5)  # noqa: E731
        return {"stable": self.stable, "tolerance": TOLERANCE, "probe_s": {k: r(v) for k, v in self.probe_s.items()},
                "baseline_pass_s": r(self.baseline_pass_s), "assisted_rows": self.assisted_rows,
                "assisted_pass_s": r(self.assisted_pass_s), "probe_rows_s": r(self.probe_rows_s),
                "warnings": list(self.warnings)}


def _outside(value: float, low: float, high: float) -> bool:
    """Whether `value` lies beyond the band from `low` to `high`, widened by the tolerance on either side."""
    return value > (1 + TOLERANCE) * high or value < low / (1 + TOLERANCE)


def _pct(a: float, low: float, high: float) -> str:
    return f"{a / high - 1:.0%} slower" if a > high else f"{1 - a / low:.0%} faster"


def modal_rows(result: GenerationResult) -> tuple[int | None, list[float]]:
    """The most common number of rows the target verified per pass (the prompt pass excluded), and those passes'
    seconds."""
    by_rows: dict[int, list[float]] = {}
    for step in result.later_steps:
        by_rows.setdefault(len(step.candidates) + 1, []).append(step.verify_s)
    if not by_rows:
        return None, []
    rows = max(by_rows, key=lambda n: (len(by_rows[n]), -n))
    return rows, by_rows[rows]


def rows_to_probe(assisted: GenerationResult) -> int | None:
    """The verification shape worth a probe of its own after the assisted run: its most common one, when it has
    enough passes to be judged and is not the plain pass (which every probe times anyway)."""
    rows, passes = modal_rows(assisted)
    return rows if rows is not None and rows > 1 and len(passes) >= MIN_PASSES else None


def judge(probe_s: dict[str, float], baseline: GenerationResult, assisted: GenerationResult,
          probe_rows_s: float | None = None) -> Stability:
    """Compare each run's own passes with the probes of the same shape around it, and the probes with each other.

    A run is judged by the lower quartile of its passes against the band between the probes before and after it
    (each the fastest of three), so the noise of one probe widens the band instead of raising an alarm; a steady
    move of more than `TOLERANCE` still falls outside it.
    """
    warnings = []
    before, between, after = probe_s["before"], probe_s["between"], probe_s["after"]
    fastest, slowest = min(probe_s.values()), max(probe_s.values())
    if slowest > (1 + PROBE_SPREAD) * fastest:
        warnings.append(
            f"the machine's speed moved during this comparison: the same target pass took {before * 1000:.1f} ms "
            f"before the baseline, {between * 1000:.1f} ms between the runs and {after * 1000:.1f} ms after the "
            f"assisted run ({slowest / fastest - 1:.0%} apart), so the speedup is not reliable; run it again")
    plain = [s.verify_s for s in baseline.later_steps]
    baseline_pass = lower_quartile(plain) if len(plain) >= MIN_PASSES else None
    low, high = min(before, between), max(before, between)
    if baseline_pass is not None and _outside(baseline_pass, low, high):
        warnings.append(
            f"the baseline's passes ran {_pct(baseline_pass, low, high)} than the same pass measured just before and "
            f"after it ({baseline_pass * 1000:.1f} against {low * 1000:.1f}–{high * 1000:.1f} ms): the machine's "
            "speed moved during the baseline, so its latency and the speedup are not reliable; run it again")
    rows, passes = modal_rows(assisted)
    assisted_pass = None
    if rows is not None and len(passes) >= MIN_PASSES:
        assisted_pass = lower_quartile(passes)
        band = None
        if rows == 1:
            band, shape = (min(between, after), max(between, after)), "plain pass"
        elif probe_rows_s is not None:  # timed for `rows_to_probe(assisted)`, this very shape
            # the probe of this shape ran once, after the run: scaled by how the plain probe moved across the run
            band = (probe_rows_s * min(between, after) / after, probe_rows_s * max(between, after) / after)
            shape = f"pass over {rows} rows"
        if band is not None and _outside(assisted_pass, *band):
            warnings.append(
                f"the assisted run's passes ran {_pct(assisted_pass, *band)} than the same {shape} measured around "
                f"it ({assisted_pass * 1000:.1f} against {band[0] * 1000:.1f}–{band[1] * 1000:.1f} ms): the machine's "
                "speed moved during the assisted run, so its latency and the speedup are not reliable; run it again")
    return Stability(dict(probe_s), baseline_pass, rows, assisted_pass, probe_rows_s, warnings)
