"""Comparison results as HTML, Markdown and a chart: what the app shows. No model code here."""
from __future__ import annotations

import html

from ..choices import DRAFT_SOURCES, MODE_LABELS
from ..comparison.breakeven import DISAGREE
from ..comparison.tasks import Detokenizer
from ..models.machine import machine_text

LEGEND = ("<div class='ag-legend'><span class='ag-acc'>accepted draft</span> <span class='ag-own'>target's own token"
          "</span> <span class='ag-rej'>rejected draft</span> <span class='ag-base'>baseline token</span></div>")

CSS = """
.ag-out {font-family: ui-monospace, monospace; white-space: pre-wrap; line-height: 1.7; min-height: 6em;
         padding: 8px; border-radius: 6px; border: 1px solid var(--border-color-primary);}
.ag-acc {background: #bbf7d0; color: #14532d; border-radius: 3px;}
.ag-own {background: #c7d2fe; color: #1e1b4b; border-radius: 3px;}
.ag-rej {color: #b91c1c; text-decoration: line-through; font-size: 0.8em; opacity: 0.75;}
.ag-out .ag-rej::after {content: attr(data-draft);}
.ag-base {background: #e5e7eb; color: #111827; border-radius: 3px;}
.ag-legend span {padding: 1px 6px; margin-right: 6px;}
.ag-big {font-size: 1.6em; font-weight: 700;}
.ag-note {opacity: 0.8;}
.ag-warn {background: #fef3c7; color: #78350f; border: 1px solid #f59e0b; border-radius: 6px; padding: 6px 10px;
          margin-bottom: 6px;}
"""


def _span(cls: str, text: str, title: str = "") -> str:
    t = f" title='{html.escape(title, quote=True)}'" if title else ""
    return f"<span class='{cls}'{t}>{html.escape(text)}</span>"


def _draft_span(text: str, title: str) -> str:
    """A rejected draft, shown by CSS from its attribute: generated content is never part of a selection, so copying
    the assisted column copies the assisted text alone."""
    draft, title = html.escape(text, quote=True), html.escape(title, quote=True)
    return f"<span class='ag-rej' data-draft='{draft}' title='{title}'></span>"


def baseline_html(pieces: list[str]) -> str:
    body = "".join(_span("ag-base", p) for p in pieces) or "<span class='ag-note'>…</span>"
    return f"<div class='ag-out'>{body}</div>"


def plain_html(pieces: list[str]) -> str:
    """The text so far, as one escaped text node: what a panel shows while its run is timed."""
    return f"<div class='ag-out'>{html.escape(''.join(pieces)) or '…'}</div>"


def assisted_html(steps: list[dict], pieces: list[str], draft_piece) -> str:
    """`steps` as in Comparison.to_dict(); `pieces[i]` is the text of the i-th emitted token; `draft_piece(id)` the
    text of a rejected draft token. Only the emitted tokens are text; a rejected draft is drawn beside them
    (`_draft_span`), out of what a reader selects and copies."""
    out, i = [], 0
    for n, step in enumerate(steps, 1):
        withheld = f" (+{step['withheld']} withheld)" if step.get("withheld") else ""
        title = f"pass {n}: verified {len(step['candidates'])}{withheld}, accepted {step['accepted']}"
        for _ in range(step["accepted"]):
            out.append(_span("ag-acc", pieces[i], title))
            i += 1
        rejected = step["candidates"][step["accepted"]:]
        if rejected and len(step["emitted"]) > step["accepted"]:
            out.append(_draft_span("".join(draft_piece(t) for t in rejected), title + " (rejected)"))
        if len(step["emitted"]) > step["accepted"]:
            out.append(_span("ag-own", pieces[i], title))
            i += 1
    return f"<div class='ag-out'>{''.join(out) or '…'}</div>"


def fmt_value(value, spec: str, unit: str = "", missing: str = "n/a") -> str:
    """A figure for display: `value` formatted by `spec` with its unit, or `missing` when there is none."""
    return missing if value is None else f"{format(value, spec)}{unit}"


def figures_markdown(run: dict, assisted: bool) -> str:
    t = run["time"]
    rows = [("latency", fmt_value(run["latency_s"], ".2f", " s")), ("new tokens", str(run["new_tokens"])),
            ("tokens / s", fmt_value(run["tokens_per_second"], ".2f")), ("target passes", str(run["target_passes"])),
            ("tokens / pass", fmt_value(run["tokens_per_pass"], ".2f"))]
    if assisted:
        rows.append(("assistant passes", str(run["assistant_passes"])))
        # the acceptance in vLLM's terms, its draft acceptance rate among them; the plain rate where it has none
        rows += (acceptance_rows(run.get("acceptance"))
                 or [("acceptance rate", fmt_value(run["acceptance_rate"], ".0%"))])
    rows += [("setup (encoder, caches)", fmt_value(t["setup_s"], ".2f", " s")),
             ("first step (prompt pass" + (", assistant's too" if assisted else "") + ")",
              fmt_value(t["prompt_s"], ".2f", " s"))]
    if assisted and not t["passes_after_prompt"]:
        rows.append(("later steps", "none: every token came from " + ("the first target pass" if run["target_passes"] == 1
                                                                     else "each window's first target pass")))
    elif assisted:
        rows += [("drafting (later steps)", fmt_value(t["drafting_s"], ".2f", " s")),
                 ("verifying (later target passes)", f"{fmt_value(t['verifying_s'], '.2f', ' s')}: {t['passes_after_prompt']}"
                  f" × {_ms(t['s_per_pass'])}, {t['rows_verified']} rows, {_ms(t['s_per_row'])} per row")]
    elif t["passes_after_prompt"]:
        rows.append(("decoding (later target passes)",
                     f"{fmt_value(t['verifying_s'], '.2f', ' s')}: {t['passes_after_prompt']} × {_ms(t['s_per_pass'])}"))
    rows.append(("other (bookkeeping, streaming)", fmt_value(t["other_s"], ".2f", " s")))
    if run.get("stop_reason") == "max_time":
        rows.append(("stopped", "time limit: partial output"))
    return "| figure | value |\n|---|---|\n" + "\n".join(f"| {k} | **{v}** |" for k, v in rows)


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


def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"


def _passes(n: int) -> str:
    return f"{n} pass" if n == 1 else f"{n} passes"


def explanation(result: dict) -> str:
    """Why the speedup is what it is, in the measured parts that add up to each latency."""
    b, a = result["baseline"], result["assisted"]
    tb, ta = b["time"], a["time"]
    fixed_b, fixed_a = tb["setup_s"] + tb["prompt_s"], ta["setup_s"] + ta["prompt_s"]
    later_b = (f"{_passes(tb['passes_after_prompt'])} × {_ms(tb['s_per_pass'])}" if tb["passes_after_prompt"]
               else "no later pass")
    later_a = (f"{ta['drafting_s']:.2f} s drafting + {_passes(ta['passes_after_prompt'])} × {_ms(ta['s_per_pass'])} "
               f"verifying ({ta['rows_verified']} rows)" if ta["passes_after_prompt"]
               else "no later pass")
    text = (f"Baseline {b['latency_s']:.2f} s = {fixed_b:.2f} s setup and first step + {later_b} + "
            f"{tb['other_s']:.2f} s other. Assisted {a['latency_s']:.2f} s = {fixed_a:.2f} s setup and first step + "
            f"{later_a} + {ta['other_s']:.2f} s other.")
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


def summary_html(result: dict) -> str:
    identical = result["identical"]
    stability = result.get("stability") or {}
    unreliable = stability.get("stable") is False
    mark = "Same output:" if identical else ("Sampling:" if result["settings"]["temperature"] > 0 else "Differs:")
    parts = []
    if unreliable:
        parts.append("<div class='ag-warn' id='ag-unreliable'><b>Timing not reliable:</b> the machine's speed moved "
                     "during this comparison (see the notes below), so the speedup below is not a fair figure. "
                     "Press <i>Run again</i> to measure it afresh.</div>")
    parts += [f"<div><span class='ag-big'>{result['speedup']:.2f}× speedup</span> measured"
              f"{' (unreliable)' if unreliable else ''}: {result['baseline']['latency_s']:.2f} s alone against "
              f"{result['assisted']['latency_s']:.2f} s assisted.</div>",
              f"<div class='ag-note'>{html.escape(explanation(result))}</div>",
              f"<div><b>{mark}</b> {html.escape(result['identical_note'])}</div>",
              f"<div class='ag-note'>Baseline ran first, then assisted ({html.escape(draft_source_words(result))} "
              f"drafts, {html.escape(MODE_LABELS.get(result['mode'], result['mode']))}); never at the same time, so "
              "the timings do not mix. A fixed target pass was timed before, between and after them"
              + (", and the machine's speed held." if stability.get("stable") else ".") + "</div>"]
    start = (result["assisted"].get("assistant_start") or {}).get("reason")
    if start:
        parts.append(f"<div class='ag-note' id='ag-assistant-start'><b>Assistant:</b> {html.escape(start)}.</div>")
    if result.get("machine"):
        machine = html.escape(machine_text(result["machine"]))
        parts.append(f"<div class='ag-note' id='ag-machine'><b>Machine:</b> {machine}.</div>")
    for line in (language_text(result), windows_text(result), end_to_end_text(result),
                 break_even_text(result)):
        if line:
            parts.append(f"<div class='ag-note'>{html.escape(line)}</div>")
    for warning in result.get("warnings", []):
        parts.append(f"<div class='ag-note'><b>Note:</b> {html.escape(warning)}</div>")
    if result["mode"] == "different-tokenizer":
        parts.append(f"<div class='ag-note'><b>Pair:</b> {html.escape(result['mode_reason'])}</div>")
    return "".join(parts)


def steps_figure(steps: list[dict], initial_window: int | None = None):
    """Per target pass: the window (the most drafts the schedule allowed; it starts at `initial_window`, the
    Settings' value, and moves as the schedule adapts), the drafts verified (and those drafted but withheld), and how
    many were accepted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 2.6), dpi=100)
    x = list(range(1, len(steps) + 1))
    ax.bar(x, [len(s["candidates"]) for s in steps], color="#fecaca", label="drafts verified")
    if any(s.get("withheld") for s in steps):
        ax.bar(x, [s.get("withheld", 0) for s in steps], bottom=[len(s["candidates"]) for s in steps], color="#d4d4d8",
               label="drafted, withheld")
    ax.bar(x, [s["accepted"] for s in steps], color="#22c55e", label="drafts accepted")
    initial = "" if initial_window is None else f" (initial {initial_window})"
    ax.step(x, [s["window"] for s in steps], where="mid", color="#4338ca",
            label=f"window: most drafts the schedule allowed{initial}")
    ax.set_xlabel("target pass")
    ax.set_ylabel("drafts")
    ax.legend(loc="lower right", bbox_to_anchor=(1, 1.0), fontsize=8, ncols=2, frameon=False)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.margins(x=0.01)
    fig.tight_layout()
    plt.close(fig)
    return fig


def result_outputs(result: dict) -> dict:
    """A finished comparison (as `Comparison.to_dict()`) for the page: both runs' figures, the summary, the per-pass
    chart, the raw JSON, and whether to offer a re-run (the timing was not reliable)."""
    return {"status": f"**done**: {result['pair']}; baseline ran first, then assisted",
            "baseline_figures": figures_markdown(result["baseline"], False),
            "assisted_figures": figures_markdown(result["assisted"], True),
            "summary": summary_html(result),
            "plot": steps_figure(result["assisted"]["steps"], result["settings"]["num_assistant_tokens"]), "raw": result,
            "unreliable": not (result["stability"] or {}).get("stable", True)}


STOPPED = ("**stopped**: the comparison was cut short, so there are no figures to compare; what each column had "
           "written stays. *Run* is back within seconds, once the stopped run has let go of the models.")

CLEARED = {"baseline_figures": "", "assisted_figures": "", "summary": "", "plot": None, "raw": None,
           "unreliable": False}   # the previous run's result, as a new run starts


class LiveView:
    """Turns the service's progress snapshots into the live part of the page (the status line and both panels),
    detokenizing each token once and rendering a panel only when it changed (the rendering shares two cores with
    the timed run). At the end it hands over the comparison (`result`), which `result_outputs` renders."""

    def __init__(self):
        self._base = self._assisted = None
        self._steps_seen = 0
        self._status = None
        self._cleared = self._started = False   # the panels cleared, the baseline's "…" shown: once each

    def _detokenizers(self, pair):
        if self._base is None:
            self._base, self._assisted = Detokenizer(pair.target.tokenizer), Detokenizer(pair.target.tokenizer)
        return self._base, self._assisted

    def outputs(self, snap) -> dict:
        out = {}
        status = f"**{snap.phase}**: {snap.message}"
        if snap.phase == "loading" and snap.fraction:
            status += f" ({snap.fraction:.0%})"
        if snap.phase == "done":
            status = "**runs finished**: drawing the figures"
        if status != self._status:
            out["status"] = self._status = status
        # Only what changed is sent: a snapshot comes again unchanged after a second without events (so that the
        # run can be stopped), and anything sent makes work for the server and the browser during the timed runs.
        if snap.pair is None:  # a new run: clear the previous one's panels
            if not self._cleared:
                self._cleared = True
                out.update(baseline_html="", assisted_html="")
            return out
        base, assisted = self._detokenizers(snap.pair)
        # While a timed run goes on, each panel streams as plain text (one text node for the browser to lay out,
        # on the same cores as the run when it is local); the coloured, per-token view comes with the result.
        if len(snap.baseline_tokens) > len(base.tokens) or not self._started:
            self._started = True
            base.feed(snap.baseline_tokens[len(base.tokens):])
            out["baseline_html"] = plain_html(base.pieces)
        if len(snap.assisted_steps) > self._steps_seen:
            for step in snap.assisted_steps[self._steps_seen:]:
                assisted.feed(step.emitted)
            self._steps_seen = len(snap.assisted_steps)
            out["assisted_html"] = plain_html(assisted.pieces)
        if snap.comparison is not None:
            result = snap.comparison.to_dict()
            decode_one = lambda t: snap.pair.target.tokenizer.decode([t], skip_special_tokens=True)  # noqa: E731
            out.update(baseline_html=baseline_html(base.pieces),
                       assisted_html=assisted_html(result["assisted"]["steps"], assisted.pieces, decode_one),
                       result=result)
        return out
