"""A comparison's and a sweep's figures as charts (matplotlib figures, closed: the caller saves or shows them): the
per-pass chart of one comparison, the break-even map, and a sweep's four panels. The values come from `comparison/`
(`Comparison.to_dict()`, `breakeven.BreakEven`, `sweep.Point`); nothing is computed here that a reader could not
read off the chart."""
from __future__ import annotations

import numpy as np

from ..comparison.breakeven import BreakEven, break_even_alpha
from ..comparison.sweep import OVER, Point, sweep_break_even


# The page lays a plot's label over its figure's top-left corner (Gradio's badge, about 30 px): a figure with a title
# keeps that much room above it, so that the badge does not cover the title
LABEL_BAND_IN = 0.45


def _below_label_band(fig, title: str = "") -> None:
    """Lay `fig` out (tight) below the page's label band, its `title` (a figure title) just under the band."""
    top = 1 - LABEL_BAND_IN / fig.get_figheight()
    if title:
        fig.suptitle(title, fontsize=10, y=top, va="top")
        top -= 0.15 / fig.get_figheight()
    fig.tight_layout(rect=(0, 0, 1, top))


def _pyplot():
    """matplotlib's pyplot on the Agg backend (no display), imported on first use: a module that only words results
    need not load it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def steps_figure(steps: list[dict], initial_window: int | None = None):
    """Per target pass: the window (the most drafts the schedule allowed; it starts at `initial_window`, the
    Settings' value, and moves as the schedule adapts), the drafts verified (and those drafted but withheld), and how
    many were accepted."""
    plt = _pyplot()
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
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.margins(x=0.01)
    fig.tight_layout()
    plt.close(fig)
    return fig


def break_even_figure(points: list[BreakEven], gamma: float | None = None):
    """The map: α across, c up, the break-even line (predicted speedup = 1) at the window γ, and each point where
    its measured parts put it, labelled with its measured speedup."""
    plt = _pyplot()
    gamma = gamma if gamma is not None else (points[0].gamma if points else 5.0)
    fig, ax = plt.subplots(figsize=(4.2, 3.2), dpi=100)
    cs = np.linspace(0.0, 1.0, 101)
    alphas = [break_even_alpha(gamma, c) for c in cs]
    line = [(a, c) for a, c in zip(alphas, cs) if a is not None]
    if line:
        ax.plot(*zip(*line), color="#b91c1c", label=f"break-even at γ = {gamma:.1f}")
        ax.fill_betweenx([c for _, c in line], [a for a, _ in line], 1.0, color="#dcfce7", label="predicted faster")
    for p in points:
        ax.scatter([p.alpha], [p.c], color="#4338ca", zorder=3,
                   label="a run (its measured speedup)" if p is points[0] else None)
        ax.annotate(f"{p.measured:.2f}×", (p.alpha, p.c), fontsize=7, xytext=(3, 3), textcoords="offset points")
    top = max([0.5] + [p.c * 1.2 for p in points])
    ax.set(xlim=(0, 1), ylim=(0, min(1.0, top)), xlabel="α (acceptance per draft reached)",
           ylabel="c (assistant / target cost per pass)", title="Where the runs sit against the break-even")
    ax.legend(fontsize=7, loc="upper left")
    _below_label_band(fig)
    plt.close(fig)
    return fig


def sweep_figure(over: str, points: list[Point], title: str = ""):
    """Four panels over the swept values: speedup (median, min–max over repeats, the formula's prediction), tokens
    per pass and mean acceptance length, draft acceptance rate and the share of passes that accepted nothing, and
    acceptance per draft position. Points without runs yet are left out."""
    plt = _pyplot()
    done = [p for p in points if p.runs]
    summaries = [p.summary() for p in done]
    x = list(range(len(points)))
    at = {p.value: i for i, p in enumerate(points)}
    xs = [at[p.value] for p in done]
    fig, axes = plt.subplots(2, 2, figsize=(9, 5.6), dpi=100)
    (speed, passes), (rate, position) = axes
    if summaries:
        ys = [s["speedup"] for s in summaries]
        speed.errorbar(xs, ys, yerr=[[y - s["speedup_min"] for y, s in zip(ys, summaries)],
                                     [s["speedup_max"] - y for y, s in zip(ys, summaries)]],
                       marker="o", capsize=4, label="measured (median, min–max)")
        pred = [(x_, s["predicted_speedup"]) for x_, s in zip(xs, summaries) if s["predicted_speedup"] is not None]
        if pred:
            speed.plot(*zip(*pred), "x", color="#b91c1c", label="formula, from measured α, c, γ")
        passes.plot(xs, [s["tokens_per_pass"] for s in summaries], marker="o", label="tokens per target pass")
        passes.plot(xs, [s["mean_acceptance_length"] for s in summaries], marker="s", ls="--",
                    label="mean acceptance length")
        rate.plot(xs, [s["draft_acceptance_rate"] for s in summaries], marker="o", label="draft acceptance rate")
        rate.plot(xs, [s["zero_accept_share"] for s in summaries], marker="s", ls="--",
                  label="passes that accepted nothing")
        for p, s in zip(done, summaries):
            if s["per_position"]:
                position.plot(range(1, len(s["per_position"]) + 1), s["per_position"], marker="o",
                              label=f"{over} = {p.value}")
    speed.axhline(1.0, color="grey", lw=1, ls="--")
    speed.set(ylabel="speedup", title="Speedup (baseline / assisted latency)")
    passes.set(ylabel="tokens", title="Tokens per pass")
    rate.set(ylabel="share", ylim=(-0.02, 1.02), title="Acceptance")
    position.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    position.set(xlabel="draft position", ylabel="accepted", ylim=(-0.02, 1.02), title="Acceptance per position")
    for ax in (speed, passes, rate):
        ax.set_xticks(x, [str(p.value) for p in points])
        ax.set_xlim(-0.5, len(points) - 0.5)
        ax.set_xlabel(OVER[over])
    for ax in axes.flat:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    _below_label_band(fig, title)
    plt.close(fig)
    return fig


def sweep_break_even_figure(points: list[Point]):
    """The break-even map (`break_even_figure`) with every finished run of every point."""
    return break_even_figure(*sweep_break_even(points))
