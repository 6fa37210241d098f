"""Comparison results as the page shows them: HTML and Markdown around the shared words and charts of
`assistgen.views`. No model code here."""
from __future__ import annotations

import html

from ..choices import MODE_LABELS
from ..comparison.tasks import Detokenizer
from ..models.machine import machine_text
from ..views.plots import steps_figure
from ..views.text import (acceptance_rows, break_even_text, draft_source_words, end_to_end_text, explanation,
                          fmt_value, language_text, ms_text, windows_text)

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
                  f" × {ms_text(t['s_per_pass'])}, {t['rows_verified']} rows, {ms_text(t['s_per_row'])} per row")]
    elif t["passes_after_prompt"]:
        rows.append(("decoding (later target passes)",
                     f"{fmt_value(t['verifying_s'], '.2f', ' s')}: {t['passes_after_prompt']} × "
                     f"{ms_text(t['s_per_pass'])}"))
    rows.append(("other (bookkeeping, streaming)", fmt_value(t["other_s"], ".2f", " s")))
    if run.get("stop_reason") == "max_time":
        rows.append(("stopped", "time limit: partial output"))
    return "| figure | value |\n|---|---|\n" + "\n".join(f"| {k} | **{v}** |" for k, v in rows)


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
