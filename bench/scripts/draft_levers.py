"""The levers on the text assistant's draft pass, each measured the same way: what a draft pass costs and how often its
token is the target's, and the speedup the two predict.

    .venv/bin/python -m bench.scripts.draft_levers [--half tuning] [--max-new-tokens 64] [--out DIR]

For the default text pair (the w8a8 1.5B target, the int8 0.5B assistant). Each prompt's greedy answer is the
target's own (a baseline run). Each lever then drafts along it as the assistant drafts in the engine: one one-row pass
per token through `engine.llama_decoder` (the lean loop the assistant runs), fed the target's tokens, so that every
pass is timed (the median, in milliseconds) and its token compared with the target's at that position (agreement).
A greedy draft at a position depends only on the tokens before it, so `schedules.replay` then steps the adaptive
schedule over those agreements and confidences, pricing the target's passes by the verify(k) curve measured here,
for the seconds an assisted run would take (the assistant alone: no prompt lookup, no payback gate, prompt passes
left out) against the target's one-row passes for the same tokens.

Levers (the target verifies over its whole vocabulary in every case; only the drafts change):
- `int8 0.5B, whole head`: the assistant choosing among every id;
- `head: first 32k ids`, `first 64k ids`: its output layer cut to those token ids, the prompt's own ids and the end
  ids (a smaller int8 product, the kept logits the same);
- `head: common ids and the sequence's`: the assistant as shipped (`drafting.draft_vocabulary`): the head's first
  block (the first 65,536 ids) and the rows of the other ids the sequence has used, except while the answer is
  empty or has just used a new id above the block;
- `first 23 layers`, `first 22 layers`: its last layers skipped (the final norm and head kept).

A benchmark: it prints figures and asserts nothing. Run `python -m assistgen prepare` first.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from assistgen.comparison.compare import run_generation
from assistgen.comparison.request import Settings
from assistgen.engine.drafting import draft_vocabulary
from assistgen.engine.llama_decoder import LlamaDecoderStep
from assistgen.engine.schedules import AdaptiveSchedule, replay
from assistgen.models.catalog import load_catalog
from assistgen.models.machine import machine
from assistgen.models.pool import ModelPool
from assistgen.models.quantized import Int8Linear
from assistgen.tools.bench import builtin_items, half, model_inputs
from assistgen.tools.passcosts import verify_curve

PAIR = "qwen2.5-coder-1.5b-w8a8+0.5b-int8"
INPUTS = Path(__file__).resolve().parents[1] / "inputs"
SUITES = ("code", "chat", "translation")
LEVERS = ("int8 0.5B, whole head", "head: first 32k ids", "head: first 64k ids", "head: common ids and the sequence's",
          "first 23 layers", "first 22 layers")
VERIFY_ROWS = (1, 2, 3, 4, 6, 8, 12)


def lever_step(model, lever: str, prompt: list[int], eos: set[int]) -> tuple[LlamaDecoderStep, torch.Tensor | None]:
    """The assistant's lean decoder with `lever` applied, and the token ids its head keeps (None: all)."""
    step = LlamaDecoderStep(model)
    ids = None
    if lever.startswith("head: first"):
        first = 1024 * int(lever.split("first ")[1].split("k")[0])
        ids = torch.tensor(sorted(set(range(first)) | set(prompt) | eos))
        head = model.lm_head
        assert isinstance(head, Int8Linear), "the head cut needs the int8 assistant"
        qweight, qscale, bias = head.stored()
        step.lm_head = Int8Linear(qweight[ids], qscale[ids], None if bias is None else bias[ids]).forward
    elif lever.startswith("first"):
        step.layers = step.layers[:int(lever.split()[1])]
    return step, ids


def draft_along(model, lever: str, prompt: list[int], answer: list[int], eos: set[int]) -> dict:
    """One-row passes along the target's answer: per position, whether the lever's token is the target's, its
    confidence, and each pass's seconds."""
    step, ids = lever_step(model, lever, prompt, eos)
    rule = lever == "head: common ids and the sequence's"

    def extra(seq: list[int]) -> tuple[int, ...] | None:   # the engine's rule
        return draft_vocabulary(seq, len(prompt), step.common_vocab, eos) if rule else None

    def chosen(logits: torch.Tensor, ids: tuple[int, ...] | None) -> int:
        index = int(logits.argmax())
        return index if ids is None or index < step.common_vocab else ids[index - step.common_vocab]
    extras = [extra(prompt)]
    logits = step.logits(prompt, 0, extra_ids=extras[-1])[0]
    agreed, confidences, seconds = [], [], []
    for i, token in enumerate(answer):
        probs = torch.softmax(logits, -1)
        best = int(probs.argmax())
        agreed.append((chosen(logits, extras[-1]) if ids is None else int(ids[best])) == token)
        confidences.append(float(probs[best]))
        if i + 1 < len(answer):
            extras.append(extra(prompt + answer[:i + 1]))
            started = time.perf_counter()
            logits = step.logits([token], len(prompt) + i, extra_ids=extras[-1])[0]
            seconds.append(time.perf_counter() - started)
    commons = [e is not None for e in extras[1:]]
    # with the rule, passes of two sizes mix: each size's median, weighted by how often it ran
    pass_s = sum(statistics.median(s) * len(s) for s in (
        [t for t, c in zip(seconds, commons) if c], [t for t, c in zip(seconds, commons) if not c]) if s) / len(seconds)
    return {"agreed": agreed, "confidences": confidences, "pass_s": pass_s,
            "common_share": sum(commons) / max(len(commons), 1)}


def verify_costs(pair, inputs: dict) -> callable:
    """The target's pass over k rows (`tools.passcosts.verify_curve` at `VERIFY_ROWS`), joined linearly."""
    measured = {p["rows"]: p["seconds"] for p in verify_curve(pair.target.model, inputs, VERIFY_ROWS)}
    known = sorted(measured)

    def pass_s(rows: int) -> float:
        if rows in measured:
            return measured[rows]
        above = [k for k in known if k > rows]   # past the last size measured: the last two sizes' line
        a, b = (max(k for k in known if k < rows), above[0]) if above else known[-2:]
        return measured[a] + (measured[b] - measured[a]) * (rows - a) / (b - a)
    return pass_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", default="tuning", choices=("tuning", "held-out"))
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None, help="at most this many prompts a suite")
    parser.add_argument("--out", type=Path, default=None, help="a folder for results.json and results.md")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    catalog = load_catalog()
    pair = ModelPool(catalog).pair(next(p for p in catalog.pairs if p.name == PAIR))
    eos = set(pair.target.eos_token_ids)
    settings = Settings(max_new_tokens=args.max_new_tokens)
    rows, pass_s = [], None
    for suite in SUITES:
        for item in half(builtin_items(suite, INPUTS), args.half)[:args.limit]:
            inputs = model_inputs(pair, item)
            prompt = inputs["input_ids"][0].tolist()
            answer = run_generation(pair, inputs, settings, draft_source=None).new_tokens
            pass_s = pass_s or verify_costs(pair, inputs)
            for lever in LEVERS:
                drafted = draft_along(pair.assistant.model, lever, prompt, answer, eos)
                schedule = AdaptiveSchedule(5)
                assisted = replay(schedule, drafted["agreed"], drafted["confidences"],
                                  assistant_s=drafted["pass_s"], pass_s=pass_s)
                rows.append({"suite": suite, "item": item.name, "lever": lever, "tokens": len(answer),
                             "pass_ms": round(1000 * drafted["pass_s"], 2),
                             "agreement": round(sum(drafted["agreed"]) / len(answer), 4),
                             "common_share": round(drafted["common_share"], 3),
                             "speedup": round(len(answer) * pass_s(1) / assisted, 3)})
                print(json.dumps(rows[-1]), flush=True)
    table = ["| lever | draft pass ms | c (over the target's one-row pass) | agreement | predicted speedup: "
             + ", ".join(SUITES) + " |", "|---|---|---|---|---|"]
    for lever in LEVERS:
        mine = [r for r in rows if r["lever"] == lever]
        ms = statistics.median(r["pass_ms"] for r in mine)
        by_suite = ", ".join(f"{statistics.median(r['speedup'] for r in mine if r['suite'] == s):.2f}×" for s in SUITES)
        table.append(f"| {lever} | {ms:.1f} | {ms / 1000 / pass_s(1):.2f} | "
                     f"{statistics.median(r['agreement'] for r in mine):.1%} | {by_suite} |")
    header = (f"Target one-row pass {1000 * pass_s(1):.1f} ms; medians over the {args.half} half's prompts "
              f"({', '.join(SUITES)}), {args.max_new_tokens} tokens; {machine()['cpu']}.")
    print("\n" + header + "\n\n" + "\n".join(table))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"command": "python -m bench.scripts.draft_levers " + f"--half {args.half} --max-new-tokens "
                f"{args.max_new_tokens}", "machine": machine()}
        (args.out / "results.json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=1))
        (args.out / "results.md").write_text(f"# Draft levers\n\n`{meta['command']}`\n\n{header}\n\n"
                                             + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
