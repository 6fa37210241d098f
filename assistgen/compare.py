"""Baseline, then assisted, on the same input: the figures the app, the CLI and the API all show."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Callable

from .decoding import GenerationResult, Step, generate
from .loading import LoadedPair
from .schedules import SCHEDULES
from .tasks import decode

DRAFT_SOURCES = ("assistant", "prompt_lookup")
MAX_NEW_TOKENS_LIMIT = 1024


@dataclass(frozen=True)
class Settings:
    max_new_tokens: int = 128
    temperature: float = 0.0          # 0 means greedy
    top_p: float = 1.0
    draft_source: str = "assistant"   # or "prompt_lookup"
    num_assistant_tokens: int = 5
    schedule: str = "heuristic"
    seed: int = 0
    max_time_s: float | None = None

    def validate(self) -> "Settings":
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or \
                not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
            raise ValueError(f"max_new_tokens must be a whole number from 1 to {MAX_NEW_TOKENS_LIMIT}, "
                             f"got {self.max_new_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be a number from 0 (greedy) to 2, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.draft_source not in DRAFT_SOURCES:
            raise ValueError(f"draft source must be one of {', '.join(DRAFT_SOURCES)}, got {self.draft_source!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if not isinstance(self.num_assistant_tokens, int) or not 1 <= self.num_assistant_tokens <= 64:
            raise ValueError(f"num_assistant_tokens must be from 1 to 64, got {self.num_assistant_tokens!r}")
        return self

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0


def predicted_speedup(alpha: float | None, k: float, c: float) -> float | None:
    """Expected speedup (Leviathan et al. 2023): (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)).

    alpha: acceptance rate; k: drafted tokens per step; c: cost of an assistant pass over a target pass.
    """
    if alpha is None or k <= 0:
        return None
    tokens = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + 1)


def run_figures(result: GenerationResult, text: str) -> dict:
    return {"text": text, "latency_s": round(result.latency_s, 4), "new_tokens": len(result.new_tokens),
            "tokens_per_second": round(result.tokens_per_second, 3), "target_passes": result.target_passes,
            "assistant_passes": result.assistant_passes, "tokens_per_pass": round(result.tokens_per_pass, 3),
            "acceptance_rate": None if result.acceptance_rate is None else round(result.acceptance_rate, 4),
            "stop_reason": result.stop_reason}


@dataclass
class Comparison:
    pair: LoadedPair
    task: str
    settings: Settings
    draft_source: str
    baseline: GenerationResult
    assisted: GenerationResult
    baseline_text: str
    assisted_text: str

    @property
    def speedup(self) -> float:
        return self.baseline.latency_s / self.assisted.latency_s if self.assisted.latency_s > 0 else 0.0

    @property
    def identical(self) -> bool:
        return self.baseline.new_tokens == self.assisted.new_tokens

    @property
    def cost_ratio(self) -> float | None:
        """c: mean seconds per assistant pass over mean seconds per baseline target pass."""
        drafting = [s for s in self.assisted.steps if s.drafted or s.withheld]
        if not drafting or not self.assisted.assistant_passes:
            return None
        per_assistant_pass = sum(s.draft_s for s in drafting) / self.assisted.assistant_passes
        per_target_pass = statistics.median(s.verify_s for s in self.baseline.steps[1:] or self.baseline.steps)
        return per_assistant_pass / per_target_pass if per_target_pass > 0 else None

    @property
    def mean_window(self) -> float:
        steps = [s for s in self.assisted.steps if s.drafted]
        return sum(len(s.drafted) for s in steps) / len(steps) if steps else 0.0

    @property
    def predicted_speedup(self) -> float | None:
        c = 0.0 if self.draft_source == "prompt_lookup" else self.cost_ratio
        return None if c is None else predicted_speedup(self.assisted.acceptance_rate, self.mean_window, c)

    def identical_note(self) -> str:
        if self.settings.do_sample:
            return ("sampling (temperature > 0): the two runs draw different random tokens by design; speculative "
                    "sampling keeps the assisted output's distribution equal to the target's")
        dtype = str(self.pair.target.model.dtype).removeprefix("torch.")
        if self.identical:
            return f"identical to baseline, token for token ({dtype})"
        if dtype in ("float16", "bfloat16"):
            return (f"differs from baseline: in {dtype}, verifying several tokens at once rounds differently from "
                    "one-token steps, which can flip a near-tie")
        return "differs from baseline"

    def to_dict(self) -> dict:
        """The one JSON object that `python -m assistgen compare --json` prints and the /compare API returns."""
        steps = [{**asdict(s), "draft_s": round(s.draft_s, 5), "verify_s": round(s.verify_s, 5)}
                 for s in self.assisted.steps]
        predicted, c = self.predicted_speedup, self.cost_ratio
        return {
            "pair": self.pair.spec.name, "task": self.task, "mode": self.pair.mode, "draft_source": self.draft_source,
            "settings": {"max_new_tokens": self.settings.max_new_tokens, "temperature": self.settings.temperature,
                         "top_p": self.settings.top_p, "num_assistant_tokens": self.settings.num_assistant_tokens,
                         "schedule": self.settings.schedule, "seed": self.settings.seed},
            "dtype": str(self.pair.target.model.dtype).removeprefix("torch."),
            "ran_first": "baseline",
            "baseline": run_figures(self.baseline, self.baseline_text),
            "assisted": {**run_figures(self.assisted, self.assisted_text), "steps": steps},
            "speedup": round(self.speedup, 4), "identical": self.identical, "identical_note": self.identical_note(),
            "cost_ratio": None if c is None else round(c, 4),
            "predicted_speedup": None if predicted is None else round(predicted, 4),
            "warnings": self.warnings(), "mode_reason": self.pair.mode_reason,
        }

    def warnings(self) -> list[str]:
        """The pair's warnings, and one for runs the time limit cut short."""
        cut = [name for name, run in (("baseline", self.baseline), ("assisted", self.assisted))
               if run.stop_reason == "max_time"]
        if not cut:
            return list(self.pair.warnings)
        limit = f"the {self.settings.max_time_s:g} s time limit (ASSISTGEN_MAX_GENERATION_SECONDS)"
        return list(self.pair.warnings) + [f"the {' and '.join(cut)} output stopped at {limit}: it is partial"]


def _generate(pair: LoadedPair, inputs: dict, settings: Settings, assisted: bool, on_step, draft_source: str):
    kwargs = {}
    if assisted:
        if draft_source == "assistant":
            kwargs["assistant_model"] = pair.assistant.model
            if pair.mode == "different-tokenizer":
                kwargs.update(tokenizer=pair.target.tokenizer, assistant_tokenizer=pair.assistant.tokenizer)
        else:
            kwargs["prompt_lookup_num_tokens"] = settings.num_assistant_tokens
    return generate(pair.target.model, inputs, max_new_tokens=settings.max_new_tokens,
                    do_sample=settings.do_sample, temperature=settings.temperature or 1.0, top_p=settings.top_p,
                    seed=settings.seed, num_assistant_tokens=settings.num_assistant_tokens,
                    num_assistant_tokens_schedule=settings.schedule, eos_token_id=list(pair.target.eos_token_ids),
                    on_step=on_step, max_time_s=settings.max_time_s, **kwargs)


def warm_up(pair: LoadedPair, inputs: dict) -> None:
    """One short run per model, so one-time costs (lazy initialisation, page faults) hit neither timed run."""
    if not pair.target.warm:
        generate(pair.target.model, inputs, max_new_tokens=2)
        pair.target.warm = True
    if pair.assistant is not None and pair.assistant_usable and not pair.assistant.warm:
        _generate(pair, inputs, Settings(max_new_tokens=3), True, None, "assistant")
        pair.assistant.warm = True


def compare(pair: LoadedPair, task: str, inputs: dict, settings: Settings, *,
            on_baseline_step: Callable[[Step], None] | None = None,
            on_assisted_step: Callable[[Step], None] | None = None) -> Comparison:
    """Run the baseline, then assisted generation, one after the other (never concurrently: timings would mix)."""
    settings.validate()
    draft_source = settings.draft_source
    if draft_source == "assistant" and not pair.assistant_usable:
        draft_source = "prompt_lookup"  # the pair's reason is in pair.mode_reason and shown to the user
    warm_up(pair, inputs)
    baseline = _generate(pair, inputs, settings, False, on_baseline_step, draft_source)
    assisted = _generate(pair, inputs, settings, True, on_assisted_step, draft_source)
    return Comparison(pair, task, settings, draft_source, baseline, assisted,
                      decode(pair, baseline.new_tokens), decode(pair, assisted.new_tokens))
