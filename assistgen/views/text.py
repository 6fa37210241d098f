"""A comparison's figures in words (`Comparison.to_dict()` in, text out): the lines the page's summary and the
CLI's report share."""
from __future__ import annotations

from ..choices import DRAFT_SOURCES
from ..comparison.breakeven import DISAGREE


def fmt_value(value, spec: str, unit: str = "", missing: str = "n/a") -> str:
    """A figure for display: `value` formatted by `spec` with its unit, or `missing` when there is none."""
    return missing if value is None else f"{format(value, spec)}{unit}"


def acceptance_rows(acc: dict | None) -> list[tuple[str, str]]:
    """The acceptance figures in vLLM's vocabulary (`comparison.acceptance`), for the assisted run's table."""
    if not acc or not acc["drafting_passes"]:
        return []
    positions = " · ".join(f"{i + 1}: {v:.0%}" for i, v in enumerate(acc["per_position"][:8]))
    return [("mean acceptance length (1 + accepted / drafting passes)", fmt_value(acc["mean_acceptance_length"], ".2f")),
            ("draft acceptance rate (accepted / drafted)", fmt_value(acc["draft_acceptance_rate"], ".0%")),
            ("acceptance per draft position", positions or "n/a"),
            ("drafting passes that accepted nothing", fmt_value(acc["zero_accept_share"], ".0%"))]


def break_even_text(result: dict) -> str | None:
    """The speedup the standard formula predicts from this run's measured α, γ and c, beside the measured one."""
    be = result.get("break_even")
    if not be:
        return None
    line = (f"Break-even: with α = {be['alpha']:.2f} (acceptance per draft reached), γ = {be['gamma']:.1f} drafts per "
            f"pass and c = {be['c']:.2f} (assistant / target cost per pass), the formula (1 - α^(γ+1)) / ((1 - α)(γc + 1)) "
            f"predicts {be['predicted']:.2f}×; measured {be['measured']:.2f}×. ")
    line += (f"Below α = {be['break_even_alpha']:.2f} assisted would be slower here." if be["break_even_alpha"] is not None
             else "At this c no acceptance could pay.")
    if be["disagrees"]:
        line += f" They disagree by more than {DISAGREE * 100:.0f} %: {be['why']}."
    return line


def ms_text(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"


def _passes(n: int) -> str:
    return f"{n} pass" if n == 1 else f"{n} passes"


def explanation(result: dict) -> str:
    """Why the speedup is what it is, in the measured parts that add up to each latency."""
    b, a = result["baseline"], result["assisted"]
    tb, ta = b["time"], a["time"]
    fixed_b, fixed_a = tb["setup_s"] + tb["prompt_s"], ta["setup_s"] + ta["prompt_s"]
    later_b = (f"{_passes(tb['passes_after_prompt'])} × {ms_text(tb['s_per_pass'])}" if tb["passes_after_prompt"]
               else "no later pass")
    later_a = (f"{ta['drafting_s']:.2f} s drafting + {_passes(ta['passes_after_prompt'])} × "
               f"{ms_text(ta['s_per_pass'])} verifying ({ta['rows_verified']} rows)" if ta["passes_after_prompt"]
               else "no later pass")
    text = (f"Baseline {b['latency_s']:.2f} s = {fixed_b:.2f} s setup and first step + {later_b} + "
            f"{tb['other_s']:.2f} s other. Assisted {a['latency_s']:.2f} s = {fixed_a:.2f} s setup and first step + "
            f"{later_a} + {ta['other_s']:.2f} s other.")
    kept = tb.get("prompt_tokens_kept")
    if kept and kept == ta.get("prompt_tokens_kept"):
        text += (f" Both first steps took the prompt's first {kept} tokens (the chat template's, and the task's "
                 "instruction where it has one) from the cache, and read the rest.")
    if a["target_passes"] != b["target_passes"]:
        text += f" The target ran {_passes(a['target_passes'])} instead of {b['target_passes']}."
    if tb["s_per_pass"] and ta["s_per_pass"]:
        text += f" A verifying pass cost {ta['s_per_pass'] / tb['s_per_pass']:.2f}× a plain one"
        text += f", and drafting added {ta['drafting_s']:.2f} s." if ta["drafting_s"] else "."
    return text


LANGUAGE_SURE = 0.5   # a detected language less likely than this is shown as a guess


def language_text(result: dict) -> str | None:
    """Speech: the language transcribed, and how it was chosen."""
    language = result.get("language")
    if not language:
        return None
    if not language["detected"]:
        return f"Language: {language['code']}, as chosen."
    unsure = ("; the target is unsure: if this is not the spoken language, pick it in the menu"
              if language["probability"] < LANGUAGE_SURE else "")
    return f"Language: {language['code']}, detected by the target (p = {language['probability']:.2f}){unsure}."


def windows_text(result: dict) -> str | None:
    """A long recording: how many windows, and the runs' seconds per window."""
    windows = result.get("windows")
    if not windows or len(windows) < 2:
        return None
    lengths = [w["end_s"] - w["start_s"] for w in windows]

    def spread(run: str) -> str:
        seconds = [w[run]["latency_s"] for w in windows]
        return f"{min(seconds):.2f}–{max(seconds):.2f} s"
    return (f"{len(windows)} windows of {min(lengths):.0f}–{max(lengths):.0f} s, cut at pauses; per window the "
            f"baseline took {spread('baseline')} and assisted generation {spread('assisted')} (every window's "
            "figures are in the JSON).")


def draft_source_words(result: dict) -> str:
    """The draft source as the page names it ("assistant + prompt lookup"), not its id."""
    return DRAFT_SOURCES.get(result["draft_source"], result["draft_source"])


def end_to_end_text(result: dict) -> str | None:
    """Speech: the whole path from the file, its decoding and features (done once, shared by both runs) added to
    each run's model time."""
    prep, total = result.get("prep"), result.get("end_to_end_s")
    if not prep or not total:
        return None
    return (f"From the file: decoding {prep.get('audio_decode_s', 0):.2f} s and features {prep.get('features_s', 0):.2f}"
            f" s, shared by both runs; end to end the baseline took {total['baseline']:.2f} s and assisted generation "
            f"{total['assisted']:.2f} s.")
