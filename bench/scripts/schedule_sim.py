"""Window schedules replayed on recorded acceptance traces: a fast, repeatable way to compare schedules.

    .venv/bin/python -m bench.scripts.schedule_sim record     # ~16 min: greedy outputs of the offline Qwen pair + traces
    .venv/bin/python -m bench.scripts.schedule_sim            # replay every schedule on bench/acceptance_traces.json

A trace is, for each token of the target's greedy output, whether the assistant's own greedy prediction at that
position (teacher-forced on the target's tokens) matches it, and each model's probability of its own greedy token
there (its confidence: `int8_p`, `fp32_p`, `target_p`). With greedy drafting this is exact: a window of k drafted at
position i has min(k, run of matches from i) drafts accepted, and the confidences the schedule sees along an
accepted run are the ones the real loop would see. Pass costs come from measurements on this
machine (PASS_S below, median of 12, 150 tokens of context), so the replay prices each step as the real loop would.
The replay leaves out per-step bookkeeping and the assistant's catch-up pass, so it is a model of the real loop.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from assistgen.engine import schedules

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ROOT / "bench" / "inputs"
TRACES = INPUTS / "acceptance_traces.json"

# Qwen2.5-Coder 1.5B fp32 (oneDNN) forward seconds by the number of tokens it reads (1 = a plain step; k drafts are
# verified in a pass over k + 1 tokens); the 0.5B assistant's seconds per drafted token, int8 and fp32.
PASS_S = {1: 0.30, 2: 0.43, 3: 0.48, 4: 0.52, 6: 0.53, 8: 0.576, 12: 0.651, 16: 0.748, 33: 1.2}
ASSISTANT_S = {"int8": 0.045, "fp32": 0.097}
PREFILL_S = 1.5


def pass_seconds(rows: int) -> float:
    ks = sorted(PASS_S)
    for a, b in zip(ks, ks[1:]):
        if a <= rows <= b:
            return PASS_S[a] + (PASS_S[b] - PASS_S[a]) * (rows - a) / (b - a)
    return PASS_S[ks[-1]]


def replay(match: list[int], schedule, assistant_s: float, confidence: list[float] | None = None) -> float:
    """Speedup of one generation over plain decoding, under `schedule` (`assistgen.engine.schedules.replay`): with
    `confidence` the schedule may stop drafting and withhold drafts as it would in the real loop."""
    seconds = schedules.replay(schedule, [bool(m) for m in match], confidence, assistant_s=assistant_s,
                               pass_s=pass_seconds, prefill_s=PREFILL_S)
    return (len(match) * pass_seconds(1) + PREFILL_S) / seconds


def oracle(match: list[int], assistant_s: float) -> float:
    """An upper bound: a schedule that knows each run of matches and drafts exactly that run when it pays."""
    n, i, seconds = len(match), 0, PREFILL_S
    while i < n:
        run = 0
        while i + run < n - 1 and match[i + run] and run < 32:
            run += 1
        if run and (run + 1) / (run * assistant_s + pass_seconds(run + 1)) > 1 / pass_seconds(1):
            seconds += (run + 1) * assistant_s + pass_seconds(run + 1)
            i += run + 1
        else:
            seconds += pass_seconds(1)
            i += 1
    return (n * pass_seconds(1) + PREFILL_S) / seconds


def simulate() -> None:
    from assistgen.engine.schedules import AdaptiveSchedule, ConstantSchedule, HeuristicSchedule
    traces = json.loads(TRACES.read_text())
    schedules = {  # name: (make, replay with the assistant's confidences)
        "heuristic": (lambda: HeuristicSchedule(5), False), "constant 5": (lambda: ConstantSchedule(5), False),
        "adaptive": (lambda: AdaptiveSchedule(5), True),
        "adaptive, no confidences": (lambda: AdaptiveSchedule(5), False)}
    print("| assistant | suite | " + " | ".join(schedules) + " | oracle |")
    print("|---|---|" + "---|" * (len(schedules) + 1))
    for assistant, seconds in ASSISTANT_S.items():
        for suite in ("code", "chat", "translation"):
            names = [name for name in traces if name.startswith(suite)]
            cells = []
            for make, confident in schedules.values():
                speedups = [replay(traces[name][assistant], make(), seconds,
                                   traces[name][f"{assistant}_p"] if confident else None) for name in names]
                cells.append(f"{statistics.median(speedups):.2f}× (min {min(speedups):.2f})")
            best = statistics.median(oracle(traces[name][assistant], seconds) for name in names)
            print(f"| {assistant} | {suite} ({len(names)}) | " + " | ".join(cells) + f" | {best:.2f}× |")


def record() -> None:
    import torch

    from assistgen.tools.bench import builtin_items
    from assistgen.models.catalog import load_catalog
    from assistgen.engine.decoding import generate
    from assistgen.models.pool import ModelPool
    from assistgen.comparison.tasks import text_inputs
    catalog = load_catalog()
    pool = ModelPool(catalog)
    pair = pool.pair("qwen2.5-coder-1.5b+0.5b-int8")
    assistants = {"int8": pair.assistant.model, "fp32": pool.model(catalog.models["qwen2.5-coder-0.5b-instruct"]).model}
    traces = {}
    for suite in ("code", "chat", "translation"):
        for item in builtin_items(suite, INPUTS):
            inputs = text_inputs(pair, item.task, item.text)
            result = generate(pair.target.model, inputs, max_new_tokens=96, eos_token_id=list(pair.target.eos_token_ids))
            sequence = torch.cat([inputs["input_ids"], torch.tensor([result.new_tokens])], dim=1)
            start = inputs["input_ids"].shape[1]
            traces[item.name] = {"steps_s": [s.verify_s for s in result.steps]}
            for name, model in {"target": pair.target.model, **assistants}.items():
                with torch.inference_mode():
                    probs = model(input_ids=sequence).logits[0, start - 1:-1].float().softmax(-1)
                top, predicted = probs.max(-1)
                if name != "target":
                    traces[item.name][name] = [int(p == t) for p, t in zip(predicted.tolist(), result.new_tokens)]
                # the model's probability of its own greedy token at each position: its confidence
                traces[item.name][f"{name}_p"] = [round(p, 4) for p in top.tolist()]
            print(item.name, {n: round(sum(traces[item.name][n]) / len(result.new_tokens), 3) for n in assistants})
    TRACES.write_text(json.dumps(traces))


if __name__ == "__main__":
    record() if sys.argv[1:] == ["record"] else simulate()
