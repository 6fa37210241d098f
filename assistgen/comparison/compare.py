"""Baseline, then assisted, on the same input: the figures the app, the CLI and the API all show."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Callable

from ..choices import DRAFT_SOURCES
from ..engine.decoding import GenerationResult, Step, joined, prepare, speculative_decode
from ..engine.decoding import draft_source as engine_draft_source
from ..engine.drafting import SET_ASIDE_BELOW, AssistantStart, PaybackCosts
from ..engine.kv import keep_shared_prefix
from ..engine.sampling import Sampler
from ..engine.schedules import AdaptiveSchedule, make_schedule
from ..engine.static_steps import prepare_graphs
from ..models.loading import LoadedModel, LoadedPair
from ..models.devices import dtype_name
from ..models.machine import machine
from ..models.precision import encoder_dtype
from . import schedule_store
from .acceptance import acceptance
from .breakeven import break_even
from .probe import SpeedProbe, Stability, judge, rows_to_probe
from .request import Inputs, Settings
from .runtime import is_warm, remember, runtime, set_warm
from .speech import SpeechWindow, languages, window_language
from .tasks import decode


def time_breakdown(result: GenerationResult) -> dict:
    """Where a run's seconds went, from measured parts that add up to its latency.

    setup: before the first step (an encoder, the KV caches); prompt: the first step (the prompt pass, and in an
    assisted run the assistant's prompt pass and first draft too; `prompt_tokens_kept` of the prompt's first tokens
    taken from the target's `engine.prefix_cache`, not read); then the later steps' drafting and verifying
    (target passes); other: what is left (bookkeeping, streaming callbacks; the assistant's prompt pass and first
    draft are in the first step's).
    """
    first = [result.steps[i] for i in result.prompt_steps if i < len(result.steps)]
    later = result.later_steps
    prompt = sum(s.draft_s + s.verify_s for s in first)
    drafted = result.assistant_passes or any(s.candidates or s.withheld for s in result.steps)
    drafting = sum(s.draft_s for s in later) if drafted else 0.0   # without drafts, it is the loop's bookkeeping
    verifying = sum(s.verify_s for s in later)
    rows = sum(len(s.candidates) + 1 for s in later)
    return {"setup_s": round(result.setup_s, 4), "prompt_s": round(prompt, 4), "drafting_s": round(drafting, 4),
            "verifying_s": round(verifying, 4), "passes_after_prompt": len(later), "rows_verified": rows,
            "prompt_tokens_kept": result.prompt_tokens_kept,
            "s_per_pass": round(verifying / len(later), 5) if later else None,
            "s_per_row": round(verifying / rows, 5) if rows else None,
            "other_s": round(max(0.0, result.latency_s - result.setup_s - prompt - drafting - verifying), 4)}


def run_figures(result: GenerationResult, text: str) -> dict:
    return {"text": text, "latency_s": round(result.latency_s, 4), "new_tokens": len(result.new_tokens),
            "tokens_per_second": round(result.tokens_per_second, 3), "target_passes": result.target_passes,
            "assistant_passes": result.assistant_passes, "tokens_per_pass": round(result.tokens_per_pass, 3),
            "acceptance_rate": None if result.acceptance_rate is None else round(result.acceptance_rate, 4),
            "stop_reason": result.stop_reason, "time": time_breakdown(result),
            "assistant_start": None if result.assistant_start is None else {
                **result.assistant_start.to_dict(), "reason": assistant_start_reason(result.assistant_start)},
            "acceptance": acceptance(result.steps).to_dict()}


def assistant_start_reason(start: AssistantStart) -> str | None:
    """Why the assistant started late or not at all, and when it was set aside for not paying, in words (None where
    it started with the first step and drafted to the end)."""
    started = _start_words(start)
    aside = _set_aside_words(start, first=started is None)
    return "; ".join(part for part in (started, aside) if part) or None


def _set_aside_words(start: AssistantStart, first: bool) -> str | None:
    points = start.set_aside_after
    if not points:
        return None
    when = ", ".join(str(n) for n in points[:-1]) + (" and " if len(points) > 1 else "") + _tokens(points[-1])
    each = " each time" if len(points) > 1 else ""
    return (f"{'the assistant' if first else 'it'} was set aside after {when}: its steps on this answer had run "
            f"at under {SET_ASIDE_BELOW:.0%} of the target alone's rate, so lookup or the target alone went on{each} "
            "for a pause before it drafted again")


def _start_words(start: AssistantStart) -> str | None:
    if start.started_after == 0:
        return None
    if not start.refused:   # waited only for this machine's first measurements
        return ((f"the assistant started after {_tokens(start.started_after)}" if start.started else
                 "the assistant was not used") +
                ": its prompt pass could not be priced until the target's passes on this machine were measured; "
                "drafts came from the prompt (lookup) until then")
    cost, count = ((start.assistant_prompt_s, start.assistant_prompt_tokens) if start.started else
                   (round(start.estimated_prompt_s, 4), start.estimated_prompt_tokens))
    saving = round(start.saving_per_token_s, 5)
    prompt = (f"its prompt pass ({'' if start.started else 'about '}{cost:.1f} s for {count:,} tokens) against "
              f"about {1000 * saving:.0f} ms saved a token pays back only after about "
              f"{_tokens(math.ceil(cost / saving))}")
    if start.started:
        return (f"the assistant started after {_tokens(start.started_after)}, once the answer had run long enough: "
                f"{prompt}; drafts came from the prompt (lookup) until then")
    return (f"the assistant was not used: {prompt}, and when last asked the answer could be expected to run "
            f"{_tokens(start.expected_tokens)} more (it ended after {_tokens(start.generated)}); drafts came from the "
            "prompt (lookup) alone")


def _tokens(n: int) -> str:
    return "1 token" if n == 1 else f"{n:,} tokens"


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
    stability: Stability | None = None   # the speed probes around the runs; None when they were not taken
    language: dict | None = None         # speech: {"code": ..., "detected": bool, "probability": ...}
    windows: list[tuple[float, float]] | None = None   # a long recording's windows, (start, end) in seconds
    drafting_off: str | None = None      # why the assistant did not draft (the assisted run decoded plainly)
    prep: dict | None = None             # speech: seconds from the file to the model inputs, shared by both runs

    @property
    def speedup(self) -> float:
        return self.baseline.latency_s / self.assisted.latency_s if self.assisted.latency_s > 0 else 0.0

    @property
    def identical(self) -> bool:
        return self.baseline.new_tokens == self.assisted.new_tokens

    @property
    def cost_ratio(self) -> float | None:
        return cost_ratio(self.baseline, self.assisted)

    def identical_note(self) -> str:
        """What "identical" means for this run, and whether it held."""
        if self.settings.do_sample:
            return ("sampling (temperature > 0): the two runs draw different random tokens by design; speculative "
                    "sampling keeps the assisted output's distribution equal to the target's")
        numerics = target_numerics(self.pair)
        caveat = rounding_caveat(self.pair)
        if self.identical:
            return f"identical to baseline, token for token ({numerics})" + (f"; {caveat}" if caveat else "")
        return f"differs from baseline ({numerics})" + (f": {caveat}" if caveat else "")

    def to_dict(self) -> dict:
        """The one JSON object that `python -m assistgen compare --json` prints and the /compare API returns."""
        steps = [{**asdict(s), "draft_s": round(s.draft_s, 5), "verify_s": round(s.verify_s, 5)}
                 for s in self.assisted.steps]
        c = self.cost_ratio
        out = {
            "pair": self.pair.spec.name, "task": self.task, "mode": self.pair.mode, "draft_source": self.draft_source,
            "settings": {"max_new_tokens": self.settings.max_new_tokens, "temperature": self.settings.temperature,
                         "top_p": self.settings.top_p, "num_assistant_tokens": self.settings.num_assistant_tokens,
                         "schedule": self.settings.schedule, "seed": self.settings.seed},
            "dtype": dtype_name(self.pair.target.model.dtype),
            "encoder_dtype": dtype_name(encoder_dtype(self.pair.target.model)),
            "numerics": {"target": model_numerics(self.pair.target),
                         "assistant": None if self.pair.assistant is None else model_numerics(self.pair.assistant)},
            "machine": machine(self.stability.probe_s if self.stability else None),
            "ran_first": "baseline",
            "baseline": run_figures(self.baseline, self.baseline_text),
            "assisted": {**run_figures(self.assisted, self.assisted_text), "steps": steps},
            "speedup": round(self.speedup, 4), "identical": self.identical, "identical_note": self.identical_note(),
            "cost_ratio": None if c is None else round(c, 4),
            "stability": None if self.stability is None else self.stability.to_dict(),
            "warnings": self.warnings(), "mode_reason": self.pair.mode_reason,
            "language": self.language, "windows": self.window_figures(), "prep": self.prep,
            **({"end_to_end_s": {name: round(run.latency_s + sum(self.prep.values()), 4)
                                 for name, run in (("baseline", self.baseline), ("assisted", self.assisted))}}
               if self.prep else {}),
        }
        reading = break_even(out)
        out["break_even"] = None if reading is None else reading.to_dict()
        return out

    def window_figures(self) -> list[dict] | None:
        """Each window of a long recording: where it lies and what each run did in it."""
        if self.windows is None:
            return None
        return [{"start_s": round(start, 2), "end_s": round(end, 2), "baseline": b, "assisted": a}
                for (start, end), b, a in zip(self.windows, self.baseline.windows, self.assisted.windows)]

    def warnings(self) -> list[str]:
        """The pair's warnings, why drafting was off, one for runs the time limit cut short, and the speed probes'
        when the machine's speed moved during the comparison."""
        warnings = list(self.pair.warnings) + ([self.drafting_off] if self.drafting_off else [])
        cut = [name for name, run in (("baseline", self.baseline), ("assisted", self.assisted))
               if run.stop_reason == "max_time"]
        if cut:
            limit = f"the {self.settings.max_time_s:g} s time limit (ASSISTGEN_MAX_GENERATION_SECONDS)"
            warnings.append(f"the {' and '.join(cut)} output stopped at {limit}: it is partial")
        if self.stability is not None:
            warnings += self.stability.warnings
        return warnings


def target_numerics(pair: LoadedPair) -> str:
    """The target's numerics (`model_numerics`): what decides every token."""
    return model_numerics(pair.target)


def model_numerics(loaded: LoadedModel) -> str:
    """A loaded model's dtype, its encoder's where that differs (`models.precision`), and its quantization when
    bitsandbytes or torch's int8 runs it."""
    dtype = dtype_name(loaded.model.dtype)
    encoder = encoder_dtype(loaded.model)
    if encoder is not None:
        dtype += f", encoder {dtype_name(encoder)}"
    quantization = loaded.spec.quantization
    if quantization == "w8a8":
        return "w8a8: int8 weights, int8 inputs per token"
    if quantization == "dynamic_int8":
        return "dynamic_int8: int8 weights, int8 inputs per pass"
    return f"{dtype}, bitsandbytes {quantization}" if quantization in ("int8", "4bit") else dtype


def rounding_caveat(pair: LoadedPair) -> str | None:
    """Why greedy assisted output may differ from the baseline with this target, or None where it is exact in
    practice (float32: a verification pass and one-token steps compute each position's logits alike, to the last
    few bits, which only an exact tie could turn)."""
    dtype = dtype_name(pair.target.model.dtype)
    if pair.target.spec.quantization in ("int8", "4bit"):
        return ("bitsandbytes quantizes activations as each pass runs, so a pass over several tokens can round a "
                "near-tie differently from one-token steps, and the two outputs may then differ")
    if pair.target.spec.quantization == "dynamic_int8":
        return ("its inputs are quantized on one scale for the whole pass, so a pass over several tokens can round "
                "differently from one-token steps, and the two outputs may then differ")
    if dtype in ("float16", "bfloat16"):
        return (f"in {dtype}, verifying several tokens at once rounds differently from one-token steps, so a near-tie "
                "can go the other way and the two outputs may then differ")
    return None


def cost_ratio(baseline: GenerationResult, assisted: GenerationResult) -> float | None:
    """c: mean seconds per assistant pass over the median seconds per baseline target pass (after the prompt's)."""
    drafting = [s for s in assisted.steps if s.candidates or s.withheld]
    if not drafting or not assisted.assistant_passes:
        return None
    per_assistant_pass = sum(s.draft_s for s in drafting) / assisted.assistant_passes
    per_target_pass = statistics.median(s.verify_s for s in baseline.later_steps or baseline.steps)
    return per_assistant_pass / per_target_pass if per_target_pass > 0 else None



def run_generation(pair: LoadedPair, inputs: Inputs, settings: Settings, *, draft_source: str | None = None,
                   task: str | None = None, on_step: Callable[[Step], None] | None = None,
                   on_window: Callable[[int, SpeechWindow], None] | None = None) -> GenerationResult:
    """One run of one configuration: the baseline (`draft_source` None), or assisted generation with drafts from
    "assistant" (the pair's own), "prompt_lookup" or "assistant_lookup" (both), for `task` (whose measured payback
    costs it starts from and leaves: `payback_costs`). compare and bench both run through here.

    A recording's windows run one after the other (`on_window` hears each as it begins), each with the settings'
    token budget and time limit, and come back as one run (`engine.decoding.joined`).

    The adaptive schedule starts from the pass costs and calibration that its last run with this pair, draft source
    and decoding (greedy, or sampled at this temperature and top-p) measured: each window of a recording after the
    first, and every such run after the first, drafts by measured costs from its first step instead of drafting
    blind for two. A process's first such run starts from what the last process measured (`schedule_store`)."""
    if draft_source not in (None, *DRAFT_SOURCES):
        raise ValueError(f"draft_source must be one of {', '.join(DRAFT_SOURCES)} or None, got {draft_source!r}")
    assistant = pair.assistant.model if draft_source in ("assistant", "assistant_lookup") else None
    tokenizers = ((pair.target.tokenizer, pair.assistant.tokenizer)
                  if assistant is not None and pair.mode == "different-tokenizer" else None)
    payback = (payback_costs(pair, task) if draft_source == "assistant_lookup" and pair.mode == "same-tokenizer"
               else None)
    key = schedule_key(draft_source, settings)
    measured = runtime(pair).schedules

    def one(model_inputs: dict) -> GenerationResult:
        if settings.schedule == "adaptive" and draft_source is not None:
            if key not in measured:   # a new process: what an earlier one measured on this machine
                stored = schedule_store.load(pair, key)
                if stored is not None:
                    remember(measured, key, stored)
            schedule = AdaptiveSchedule(settings.num_assistant_tokens, measured=measured.get(key))
        else:
            schedule = make_schedule(settings.schedule, settings.num_assistant_tokens)
        sampler = (Sampler(settings.temperature, settings.top_p, settings.seed, device=pair.target.model.device)
                   if settings.do_sample else None)
        # the prompt's shared beginning, read untimed once a model: every run of this input takes it from the cache
        keep_shared_prefix(pair.target.model, model_inputs)
        if assistant is not None and tokenizers is None:
            keep_shared_prefix(assistant, model_inputs, assistant=True)
        # the run's clock starts here: its setup (an encoder, the KV caches, the draft source) counts in its latency
        target = prepare(pair.target.model, model_inputs, settings.max_new_tokens, list(pair.target.eos_token_ids))
        source = None if draft_source is None else engine_draft_source(
            target, assistant_model=assistant, lookup=draft_source != "assistant", tokenizers=tokenizers,
            payback=payback)
        result = speculative_decode(target, source, schedule, sampler, on_step=on_step,
                                    max_time_s=settings.max_time_s)
        if isinstance(schedule, AdaptiveSchedule) and schedule.costs.known:
            # the next run's start; kept for the next process by `compare`, once judged
            remember(measured, key, schedule)
        return result
    if isinstance(inputs, dict):
        return one(inputs)
    results = []
    for i, window in enumerate(inputs):
        if on_window is not None:
            on_window(i, window)
        results.append(one(window.inputs))
    return joined(results)


def schedule_key(draft_source: str | None, settings: Settings) -> tuple:
    """Which measured schedule a run starts from and leaves: one per draft source and decoding, since sampled drafts
    are accepted at rates of their own, which depend on the temperature and top-p."""
    return (draft_source, settings.temperature, settings.top_p if settings.do_sample else None)


def payback_costs(pair: LoadedPair, task: str | None = None) -> PaybackCosts:
    """The pair's measured costs of the assistant's prompt pass and of what it saves on `task`, shared by its runs of
    that task (None: runs that name none): each starts its assistant only once that pass can pay back
    (`engine.drafting.PaybackGate`). A task has its own, since the assistant's drafts save more on code than on a
    translation. Before the first measurement the assistant's prompt pass is taken to cost its share of the target's
    parameters of the target's."""
    state = runtime(pair).payback
    if task not in state:   # a new process: what an earlier one measured on this machine, if it kept any
        state[task] = schedule_store.load_payback(pair, task) or PaybackCosts(1 / pair.parameter_ratio)
    return state[task]


def first_inputs(inputs: Inputs) -> dict:
    """The model inputs of a single input, or of a recording's first window."""
    return inputs if isinstance(inputs, dict) else inputs[0].inputs


def effective_draft_source(pair: LoadedPair, task: str, inputs: Inputs, draft_source: str | None
                           ) -> tuple[str | None, str | None]:
    """(the draft source a run uses, why drafting is off or None): prompt lookup for a pair without a usable
    assistant (the pair's reason is its mode_reason), nothing where the assistant cannot help (see
    `drafting_off_reason`). The page, the API, the CLI and bench all decide through here."""
    off = drafting_off_reason(pair, task, inputs)
    if draft_source in ("assistant", "assistant_lookup") and not pair.assistant_usable:
        return "prompt_lookup", off
    if draft_source in ("assistant", "assistant_lookup") and off is not None:
        return None, off
    return draft_source, off


def drafting_off_reason(pair: LoadedPair, task: str, inputs: Inputs) -> str | None:
    """Why the pair's assistant cannot help with this input, or None: an English-only Whisper assistant on speech in
    another language would draft English words, all rejected, and slow the run down. English-only is what the
    catalog says (distil-Whisper keeps its teacher's multilingual tokenizer), else what its tokenizer knows."""
    if task != "asr" or pair.assistant is None or not pair.assistant_usable:
        return None
    language = window_language(pair, first_inputs(inputs))
    known = list(pair.assistant.spec.languages) or languages(pair.assistant.model)
    if language in known:
        return None
    return (f"drafting is off: the assistant {pair.assistant.spec.name} knows only {', '.join(known)} and this "
            f"speech is in {language!r}, so its drafts would all be rejected; the assisted run decodes as the "
            "baseline does")


WARM_UP_TOKENS = 1


def warm_up(pair: LoadedPair, inputs: dict) -> None:
    """One short run through the path the comparison takes, so one-time costs (lazy initialisation, first-call
    kernels) hit neither timed run: assisted generation of 2 tokens, which runs the target's prompt pass, the
    assistant's drafting and a verification pass (a plain run for a pair without a usable assistant). The pair's
    speed probe is built first, once: it keeps an encoder output and a KV cache for good, and the timed runs' memory
    has to fit around them, as the warm-up's then does (built after it, the first comparison's baseline paid to fault
    in memory that the assisted run then reused, and its speedup read too high).

    A decoder-only prompt is cut to `WARM_UP_TOKENS`: what warms up is the model, not this prompt. The loader has
    already moved the weights into process memory, and then the first passes run at the speed of later ones, so a
    longer warm-up buys nothing and costs seconds per load. On a GPU the models' CUDA graphs are captured first
    (`engine.static_steps`), once."""
    assisted = pair.assistant is not None and pair.assistant_usable
    state = runtime(pair)
    # on a GPU, each pass size's CUDA graph is captured here, once, outside the timed runs (nothing on a CPU)
    prepare_graphs(pair.target.model)
    if assisted:
        prepare_graphs(pair.assistant.model)
    if state.probe is None:
        state.probe = SpeedProbe(pair.target.model, inputs)
        set_warm(pair.target, False)   # a target is shared between pairs: warmed by another pair, it warms up again
    if is_warm(pair.target) and (not assisted or is_warm(pair.assistant)):
        return
    if not pair.target.model.config.is_encoder_decoder and "input_ids" in inputs:
        inputs = {"input_ids": inputs["input_ids"][:, :WARM_UP_TOKENS]}
    run_generation(pair, inputs, Settings(max_new_tokens=2), draft_source="assistant" if assisted else None)
    set_warm(pair.target, True)
    if assisted:
        set_warm(pair.assistant, True)


def compare(pair: LoadedPair, task: str, inputs: Inputs, settings: Settings, *,
            on_baseline_step: Callable[[Step], None] | None = None,
            on_assisted_step: Callable[[Step], None] | None = None,
            on_phase: Callable[[str], None] | None = None,
            on_window: Callable[[str, int, int, SpeechWindow], None] | None = None,
            language: dict | None = None, prep: dict | None = None) -> Comparison:
    """Run the baseline, then assisted generation, one after the other (never concurrently: timings would mix),
    bracketed by a speed probe before, between and after, so that a machine whose speed moved is reported.

    `inputs` is one input, or a long recording's windows (each run goes through all of them). `on_phase` hears
    "warm-up", "probe", "baseline", "probe", "assisted", "probe" as each begins; `on_window` hears ("baseline" or
    "assisted", index, count, window) as each window begins. `language` (speech: the code, and whether it was
    detected) is reported as given, and so is `prep` (speech: {"audio_decode_s": the file decoded to 16 kHz mono,
    "features_s": the windows' features}, done once and shared by both runs: `request.request_inputs`), which each run's
    end-to-end latency adds to its own.
    """
    phase = on_phase or (lambda name: None)
    window = on_window or (lambda run, index, total, w: None)
    draft_source, off = effective_draft_source(pair, task, inputs, settings.draft_source)
    first = first_inputs(inputs)
    total = 1 if isinstance(inputs, dict) else len(inputs)
    phase("warm-up")
    warm_up(pair, first)
    phase("probe")
    probe = runtime(pair).probe
    before = probe.pass_s()
    phase("baseline")
    baseline = run_generation(pair, inputs, settings, task=task, on_step=on_baseline_step,
                              on_window=lambda i, w: window("baseline", i, total, w))
    phase("probe")
    between = probe.pass_s()
    phase("assisted")
    assisted = run_generation(pair, inputs, settings, draft_source=draft_source, task=task, on_step=on_assisted_step,
                              on_window=lambda i, w: window("assisted", i, total, w))
    phase("probe")
    after = probe.pass_s()
    rows = rows_to_probe(assisted)   # None when no check could use it: no passes spent on it
    rows_s = None if rows is None else probe.pass_s(rows)
    stability = judge({"before": before, "between": between, "after": after}, baseline, assisted, rows_s)
    key = schedule_key(draft_source, settings)
    if stability.stable and settings.schedule == "adaptive" and key in runtime(pair).schedules:
        # only what a steady machine measured is kept for the next process: costs measured while the machine's speed
        # moved would start every later process from them, and a verification size no later run drafts is never
        # measured again
        schedule_store.save(pair, key, runtime(pair).schedules[key])
    if stability.stable and task in runtime(pair).payback:
        schedule_store.save_payback(pair, task, runtime(pair).payback[task])
    spans = None if isinstance(inputs, dict) else [(w.start_s, w.end_s) for w in inputs]
    return Comparison(pair, task, settings, draft_source or "none", baseline, assisted,
                      decode(pair, baseline.new_tokens), decode(pair, assisted.new_tokens), stability,
                      language=language, windows=spans, drafting_off=off, prep=prep)
