"""The benchmark's runs turned into a summary, Markdown tables and PNG plots (figures to read, never asserts)."""
from __future__ import annotations

import math
import statistics
from collections import Counter
from pathlib import Path

from ..comparison.sweep import ACCEPTANCE_KEYS, point_figures
from ..views.text import fmt_value
from .passcosts import curve_markdown


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _quantile(values, q):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def _budget(max_new_tokens) -> str:
    """The run's token budget: one number, or each pair's own."""
    if isinstance(max_new_tokens, dict):
        return "each pair's own (" + ", ".join(f"{name}: {n}" for name, n in max_new_tokens.items()) + ")"
    return str(max_new_tokens)


def summarize(rows: list[dict]) -> list[dict]:
    """One row per (pair, suite, temperature, configuration): medians over items and repeats, with the speedup's
    spread, and where the time went. Speedup, latencies, tokens per pass, c and the acceptance figures are the
    sweep's own (`comparison.sweep.point_figures`), each temperature a point."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if "error" not in row:
            groups.setdefault((row.get("pair"), row["suite"], row["temperature"], row["config"]), []).append(row)
    summary = []
    for (pair, suite, temperature, config), group in groups.items():
        speedups = [r["speedup"] for r in group]
        identical = [r["identical"] for r in group if r["identical"] is not None]
        figures = point_figures(group)   # the sweep's own figures of a point, over this group's runs
        summary.append({
            "pair": pair, "suite": suite, "temperature": temperature, "config": config, "runs": len(group),
            "baseline_s": figures["baseline_latency_s"], "latency_s": figures["latency_s"],
            **{key: figures[key] for key in ("speedup", "speedup_min", "speedup_max")},
            "speedup_p10": _quantile(speedups, 0.1), "speedup_p90": _quantile(speedups, 0.9),
            "reference_speedup": _median(r.get("reference_speedup") for r in group),
            "tokens_per_pass": figures["tokens_per_pass"],
            "acceptance_rate": _median(r.get("acceptance_rate") for r in group),
            "cost_ratio": figures["cost_ratio"],
            **{key: figures[key] for key in ACCEPTANCE_KEYS}, "per_position": figures["per_position"],
            "identical_share": sum(identical) / len(identical) if identical else None,
            "ms_per_token": _median(r.get("ms_per_token") for r in group),
            **{key: _median(r.get(key) for r in group) for key in ("prompt_s", "drafting_s", "verifying_s",
                                                                   "s_per_pass", "tokens_per_s", "end_to_end_s",
                                                                   "baseline_end_to_end_s", "audio_decode_s",
                                                                   "features_s")},
            "engine": group[0].get("engine", "assistgen"),
            "tokens_per_s_min": min((r["tokens_per_s"] for r in group if r.get("tokens_per_s")), default=None),
            "tokens_per_s_max": max((r["tokens_per_s"] for r in group if r.get("tokens_per_s")), default=None),
        })
    return summary


def ranking(summary: list[dict]) -> list[dict]:
    """Our assisted configurations of each pair and temperature, best first, by the geometric mean over suites of each
    suite's median speedup: every task counts once, however many items its suite holds. A configuration whose greedy
    output ever differed from the baseline's comes last, whatever its speed."""
    groups: dict[tuple, dict[str, float]] = {}
    identical: dict[tuple, list[float]] = {}
    for s in summary:
        if s.get("engine", "assistgen") != "assistgen" or s["config"] == "baseline" or not s.get("speedup"):
            continue
        key = (s["pair"], s["temperature"], s["config"])
        groups.setdefault(key, {})[s["suite"]] = s["speedup"]
        if s.get("identical_share") is not None:
            identical.setdefault(key, []).append(s["identical_share"])
    ranked = []
    for (pair, temperature, config), by_suite in groups.items():
        exact = all(share == 1.0 for share in identical.get((pair, temperature, config), []))
        ranked.append({"pair": pair, "temperature": temperature, "config": config, "by_suite": by_suite,
                       "geomean": math.exp(statistics.fmean(math.log(v) for v in by_suite.values())),
                       "worst": min(by_suite.values()), "exact": exact})
    return sorted(ranked, key=lambda r: (r["pair"] or "", r["temperature"], not r["exact"], -r["geomean"], -r["worst"]))


def _choosing(meta: dict, summary: list[dict]) -> list[str]:
    """The ranking (`ranking`) as a table, where a pair ran more than one of our assisted configurations."""
    ranked = ranking(summary)
    counts = Counter((r["pair"], r["temperature"]) for r in ranked)
    ranked = [r for r in ranked if counts[(r["pair"], r["temperature"])] > 1]
    if not ranked:
        return []
    suites = list(dict.fromkeys(suite for r in ranked for suite in r["by_suite"]))
    half = meta.get("half")
    lines = ["", "## Choosing a default", "",
             "Our assisted configurations, best first: the geometric mean over suites of each suite's median speedup "
             "(every task counts once), then the worst suite's. A configuration whose greedy output ever differed "
             "from the baseline's comes last." + (f" Items: each set's {half} half." if half else ""), "",
             "| pair | temp | configuration | " + " | ".join(suites) + " | geometric mean | worst | exact |",
             "|---|---|---|" + "---|" * len(suites) + "---|---|---|"]
    for r in ranked:
        lines.append(f"| {r['pair']} | {r['temperature']:g} | {r['config']} | "
                     + " | ".join(f"{_dash(r['by_suite'].get(suite))}×" for suite in suites)
                     + f" | **{_dash(r['geomean'])}×** | {_dash(r['worst'])}× | {'yes' if r['exact'] else 'no'} |")
    return lines


def _dash(value, spec=".2f", suffix=""):
    return fmt_value(value, spec, suffix, missing="–")


def _order(s: dict) -> tuple:
    return s["pair"] or "", s["suite"], s["temperature"], s["config"] != "baseline", s["config"]


def _stored(meta: dict) -> str:
    """Which pairs' first adaptive runs started from measurements an earlier process kept (`schedule_store`)."""
    stored = [name for name, kept in meta.get("stored_schedules", {}).items() if kept]
    return (f"Adaptive schedules start from the pass costs and calibration an earlier process measured: "
            f"{', '.join(stored) or 'none'} (`comparison.schedule_store`).\n")


def _half(meta: dict) -> str:
    """Which half of each set ran (`bench.half`), or nothing when every item did."""
    half = meta.get("half")
    if half == "tuning":
        return "Items: the tuning half of each set (its 1st, 3rd, 5th... items), where defaults are chosen.\n"
    if half == "held-out":
        return ("Items: the held-out half of each set (its 2nd, 4th, 6th... items), never used to choose a "
                "default.\n")
    return ""


def _numerics(meta: dict) -> str:
    """The targets' numerics ("float32, encoder bfloat16"), or the first target's dtype in results made before
    bench recorded them."""
    numerics = set((meta.get("target_numerics") or {}).values())
    return "; ".join(sorted(numerics)) if numerics else meta["dtype"]


def _engines(meta: dict, summary: list[dict]) -> list[str]:
    """Every configuration's rate and latency side by side, the peer engines' among ours, with the numerics each ran
    (none when no peer engine ran)."""
    if not meta.get("peers"):
        return []
    numerics = meta.get("target_numerics") or {}
    lines = ["", "## Engines side by side", "",
             "Medians over items x repeats (min–max). Tokens/s: new tokens over the run's latency, the prompt pass "
             "included. End to end (speech): from the file, its decoding and features included; our columns share "
             "one decoding and one set of features (`audio_decode_s` + `features_s`, added to each column's model "
             "time), a peer engine times its own. Identical: the peer's tokens equal our baseline's (for information: "
             "another engine's numerics may differ).", "",
             "| pair | suite | temp | engine | configuration | numerics | runs | latency s | end to end s | "
             "tokens/s (min–max) | identical to our baseline |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(summary, key=_order):
        engine = s.get("engine", "assistgen")
        if engine in ("assistgen", "transformers"):
            kind = numerics.get(s["pair"], meta.get("dtype", ""))
        else:
            kind = _peer_numerics(engine, s["config"])
        lines.append(f"| {s['pair']} | {s['suite']} | {s['temperature']:g} | {engine} | {s['config']} | {kind} | "
                     f"{s['runs']} | {_dash(s['latency_s'])} | {_dash(s.get('end_to_end_s'))} | "
                     f"{_dash(s.get('tokens_per_s'), '.1f')} ({_dash(s.get('tokens_per_s_min'), '.1f')}–"
                     f"{_dash(s.get('tokens_per_s_max'), '.1f')}) | "
                     f"{'–' if s['config'] == 'baseline' else _dash(s['identical_share'], '.0%')} |")
    return lines


def _peer_numerics(engine: str, config: str) -> str:
    if engine == "llama.cpp":
        return "GGUF Q4_K_M" + (" + 0.5B Q4_K_M draft" if config.endswith("speculative") else "")
    if engine == "faster-whisper":
        return "CTranslate2 " + config.split()[-1]
    return ""


def markdown(meta: dict, summary: list[dict], rows: list[dict]) -> str:
    pairs = meta["pairs"]
    lines = [f"# assistgen bench: {', '.join(pairs)}", "",
             f"{meta['machine']}; torch {meta['torch']}, transformers {meta['transformers']}, {meta['threads']} "
             f"threads; {_numerics(meta)}; max_new_tokens {_budget(meta['max_new_tokens'])}; {meta['repeats']} repeat(s); "
             f"{meta['date']}.", "", f"Command: `{meta['command']}`", "", _half(meta) + _stored(meta),
             "Speedup = baseline latency / assisted latency of the same item, repeat and temperature, with the same "
             "pair's target; medians over items x repeats, spread min–max. transformers' peer runs the heuristic "
             "schedule on the same model objects and is timed against our baseline. Identical: share of greedy runs "
             "whose tokens equal the baseline's.", "",
             "| pair | suite | temp | configuration | runs | baseline s | assisted s | speedup (min–max) | "
             "tokens/pass | acceptance | c | identical |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(summary, key=_order):
        if s["config"] == "baseline":
            continue
        lines.append(
            f"| {s['pair']} | {s['suite']} | {s['temperature']:g} | {s['config']} | {s['runs']} | "
            f"{_dash(s['baseline_s'])} | {_dash(s['latency_s'])} | {_dash(s['speedup'])}× "
            f"({_dash(s['speedup_min'])}–{_dash(s['speedup_max'])}) | {_dash(s['tokens_per_pass'])} | "
            f"{_dash(s['acceptance_rate'], '.0%')} | {_dash(s['cost_ratio'])} | {_dash(s['identical_share'], '.0%')} |")
    lines += ["", "## Where the time goes", "",
              "Medians of each run's own measured parts: the first step (the prompt pass; in an assisted run the "
              "assistant's prompt pass and first draft too), then drafting and verifying in the later steps.", "",
              "| pair | suite | temp | configuration | latency s | first step s | drafting s | verifying s | "
              "s per target pass |", "|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(summary, key=_order):
        lines.append(f"| {s['pair']} | {s['suite']} | {s['temperature']:g} | {s['config']} | {_dash(s['latency_s'])} | "
                     f"{_dash(s['prompt_s'])} | {_dash(s['drafting_s'])} | {_dash(s['verifying_s'])} | "
                     f"{_dash(s['s_per_pass'], '.3f')} |")
    lines += _engines(meta, summary)
    lines += _choosing(meta, summary)
    if len(pairs) > 1:
        lines += ["", f"## Against {pairs[0]}'s baseline", "",
                  f"Each run's latency against the baseline of the first pair ({pairs[0]}) on the same item, repeat "
                  "and temperature: for another pair's baseline, what its target alone gains; for its assisted runs, "
                  "the whole gain, of which the speedup above is what assistance adds.", "",
                  "| pair | suite | temp | configuration | latency s | against the first baseline | identical |",
                  "|---|---|---|---|---|---|---|"]
        for s in sorted(summary, key=_order):
            lines.append(f"| {s['pair']} | {s['suite']} | {s['temperature']:g} | {s['config']} | "
                         f"{_dash(s['latency_s'])} | {_dash(s['reference_speedup'])}× | "
                         f"{_dash(s['identical_share'], '.0%')} |")
    curves = meta.get("verify_curves")
    if curves:
        lines += ["", "## verify(k)", "", "One target pass over k rows (k - 1 drafts verified), after the first item's "
                  "prompt; the fastest of 6 passes per size, sizes interleaved.", ""] + curve_markdown(curves)
    for name, fl in (meta.get("floor") or {}).items():
        measured = _median(s["ms_per_token"] for s in summary if s["config"] == "baseline" and s["pair"] == name)
        lines += ["", f"## The floor: {name}", "",
                  f"Memory read bandwidth {fl['bandwidth_gb_s']} GB/s; the target reads {fl['bytes_per_token'] / 1e9:.2f}"
                  f" GB of weights per token, so no baseline can beat {fl['floor_ms_per_token']} ms/token here. "
                  f"Measured baseline: {_dash(measured, '.1f')} ms/token (median per-step time after the prefill)"
                  + (f", {fl['floor_ms_per_token'] / measured:.0%} of the floor's speed." if measured else ".")]
    errors = [r for r in rows if "error" in r]
    if errors:
        lines += ["", "## Runs that failed", ""] + [f"- {r.get('pair')} {r['item']} {r['config']}: {r['error']}"
                                                     for r in errors[:20]]
    lines += ["", "## Per item (median over repeats)", "", "| pair | suite | item | temp | configuration | speedup | "
              "tokens/pass | identical |", "|---|---|---|---|---|---|---|---|"]
    per_item: dict[tuple, list[dict]] = {}
    for r in rows:
        if "error" not in r and r["config"] != "baseline":
            per_item.setdefault((r.get("pair"), r["suite"], r["item"], r["temperature"], r["config"]), []).append(r)
    for (pair, suite, item, temperature, config), group in per_item.items():
        identical = [r["identical"] for r in group if r["identical"] is not None]
        lines.append(f"| {pair} | {suite} | {item} | {temperature:g} | {config} | "
                     f"{_dash(_median(r['speedup'] for r in group))}× | "
                     f"{_dash(_median(r.get('tokens_per_pass') for r in group))} | "
                     f"{_dash(sum(identical) / len(identical) if identical else None, '.0%')} |")
    return "\n".join(lines) + "\n"


def _label(s: dict, several_pairs: bool) -> str:
    return f"{s['pair']}: {s['config']}" if several_pairs else s["config"]


def plots(summary: list[dict], rows: list[dict], out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    several = len({s["pair"] for s in summary}) > 1
    assisted = [s for s in summary if s["config"] != "baseline"]
    configs = sorted({_label(s, several) for s in assisted})
    suites = sorted({s["suite"] for s in assisted})

    temperatures = sorted({s["temperature"] for s in assisted})
    if len(temperatures) > 1:
        fig, ax = plt.subplots(figsize=(7, 4))
        for suite in suites:
            for config in configs:
                points = sorted((s["temperature"], s["speedup"]) for s in assisted
                                if s["suite"] == suite and _label(s, several) == config)
                if points:
                    ax.plot(*zip(*points), marker="o", label=f"{suite}: {config}")
        ax.axhline(1.0, color="grey", lw=1, ls="--")
        ax.set(xlabel="temperature", ylabel="speedup (median)", title="Speedup vs temperature")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out / "speedup_vs_temperature.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(suites) * max(1, len(configs)) / 2), 4))
    width = 0.8 / max(1, len(configs))
    greedy = min(temperatures) if temperatures else 0
    for i, config in enumerate(configs):
        xs, ys, lo, hi = [], [], [], []
        for j, suite in enumerate(suites):
            match = [s for s in assisted if s["suite"] == suite and _label(s, several) == config
                     and s["temperature"] == greedy]
            if match:
                s = match[0]
                xs.append(j + i * width)
                ys.append(s["speedup"])
                lo.append(s["speedup"] - s["speedup_min"])
                hi.append(s["speedup_max"] - s["speedup"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=config)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xticks([j + width * (len(configs) - 1) / 2 for j in range(len(suites))], suites)
    ax.set(ylabel=f"speedup (median, min–max), temperature {greedy:g}", title="Speedup by task and schedule")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "speedup_by_task.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    ours = sorted({(r.get("pair"), r["config"]) for r in rows if r.get("emitted_per_pass") and r["config"] != "baseline"})
    data = [[n for r in rows if (r.get("pair"), r["config"]) == key and r.get("emitted_per_pass")
             for n in r["emitted_per_pass"]] for key in ours]
    if data:
        top = max(max(d) for d in data if d)
        ax.hist(data, bins=range(1, top + 2), label=[f"{p}: {c}" if several else c for p, c in ours], align="left")
        ax.legend(fontsize=8)
    ax.set(xlabel="tokens emitted by one target pass", ylabel="target passes", title="Tokens per pass")
    fig.tight_layout()
    written.append(out / "tokens_per_pass.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written
