"""What transformers' modules add to a text model's one-token step: the step through `model(...)` against the same
arithmetic as a plain loop over the layers (`engine.llama_decoder.LlamaDecoderStep`, what the app's text assistants
draft through: one key and value buffer per layer, no cache object, no mask for one token, q/k/v in one product),
on an offline model, with the profile of the plain loop's operations.

    .venv/bin/python -m bench.scripts.lean_text_step [--model qwen2.5-coder-0.5b-instruct-int8] [--rounds 3]
    .venv/bin/python -m bench.scripts.lean_text_step --pair qwen2.5-coder-1.5b+0.5b-int8 [--limit 2] [--rounds 2]

Prints, per round, the median one-token step of each (30 steps after a code prompt's prefill), whether their
greedy tokens and final logits agree, and then the plain loop's most expensive operations.

With --pair: the pair's assisted generation at its defaults on the first `--limit` prompts of each of the code,
chat and translation suites, with the assistant's passes through `engine.llama_decoder` (as the app runs them) and
through transformers' modules, in alternating order, against one baseline run per prompt: latency, seconds per
assistant pass, and whether every output is the baseline's.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from assistgen.engine.llama_decoder import LlamaDecoderStep
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."
STEPS = 30


def transformers_steps(model, prompt: torch.Tensor) -> tuple[list[int], float, torch.Tensor]:
    with torch.inference_mode():
        out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
        cache, logits, tokens, times = out.cache, out.logits[0, -1], [], []
        for _ in range(STEPS):
            tokens.append(int(logits.argmax()))
            start = time.perf_counter()
            out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True, logits_to_keep=1)
            times.append(time.perf_counter() - start)
            logits = out.logits[0, -1]
    return tokens, statistics.median(times), logits.float()


def plain_steps(model, prompt: torch.Tensor) -> tuple[list[int], float, torch.Tensor]:
    step = LlamaDecoderStep(model)
    logits, tokens, times = step.logits(prompt[0].tolist(), 0)[-1], [], []
    for _ in range(STEPS):
        tokens.append(int(logits.argmax()))
        start = time.perf_counter()
        logits = step.logits([tokens[-1]], prompt.shape[1] + len(tokens) - 1)[-1]
        times.append(time.perf_counter() - start)
    return tokens, statistics.median(times), logits


def end_to_end(pair_name: str, limit: int, rounds: int) -> None:
    from unittest import mock

    from assistgen.app.validation import request_settings
    from assistgen.comparison.compare import run_generation, warm_up
    from assistgen.engine import kv
    from assistgen.tools.bench import builtin_items, model_inputs
    catalog = load_catalog()
    pair = ModelPool(catalog).pair(pair_name)
    settings = request_settings(catalog.pair(pair_name))
    source = catalog.pair(pair_name).draft_source
    inputs_folder = Path(__file__).resolve().parents[1] / "inputs"
    items = [item for suite in ("code", "chat", "translation") for item in builtin_items(suite, inputs_folder, limit)]
    warm_up(pair, model_inputs(pair, items[0]))
    rows = []
    for i, item in enumerate(items):
        inputs = model_inputs(pair, item)
        baseline = run_generation(pair, inputs, settings)
        for r in range(rounds):
            order = ("lean", "transformers") if (i + r) % 2 == 0 else ("transformers", "lean")
            for name in order:
                with mock.patch.object(kv.llama_decoder, "supports", (lambda m: False) if name == "transformers"
                                       else kv.llama_decoder.supports):
                    result = run_generation(pair, inputs, settings, draft_source=source)
                drafting = sum(s.draft_s for s in result.steps)
                rows.append((item.name, name, result.latency_s, baseline.latency_s,
                             drafting / max(1, result.assistant_passes), result.new_tokens == baseline.new_tokens))
                print(f"{item.name:14s} {name:12s} {result.latency_s:6.2f} s (baseline {baseline.latency_s:6.2f} s, "
                      f"{baseline.latency_s / result.latency_s:.2f}x), {1000 * rows[-1][4]:5.1f} ms per assistant "
                      f"pass, same output {rows[-1][5]}", flush=True)
    for name in ("lean", "transformers"):
        mine = [r for r in rows if r[1] == name]
        print(f"{name}: median speedup {statistics.median(r[3] / r[2] for r in mine):.2f}x, median "
              f"{1000 * statistics.median(r[4] for r in mine):.1f} ms per assistant pass, "
              f"{sum(r[5] for r in mine)} of {len(mine)} outputs the baseline's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct-int8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pair", help="assisted generation end to end, with and without the plain loop")
    parser.add_argument("--limit", type=int, default=2)
    args = parser.parse_args()
    if args.pair:
        end_to_end(args.pair, args.limit, args.rounds)
        return
    catalog = load_catalog()
    loaded = ModelPool(catalog).model(catalog.models[args.model])
    prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                                  return_tensors="pt", return_dict=True)["input_ids"]
    for _ in range(args.rounds):
        a, a_s, a_logits = transformers_steps(loaded.model, prompt)
        b, b_s, b_logits = plain_steps(loaded.model, prompt)
        print(f"transformers {a_s * 1000:.1f} ms, plain loop {b_s * 1000:.1f} ms; same tokens {a == b}, "
              f"largest logit difference {float((a_logits - b_logits).abs().max()):.3g}", flush=True)
    from torch.profiler import ProfilerActivity, profile
    step = LlamaDecoderStep(loaded.model)
    logits, position = step.logits(prompt[0].tolist(), 0)[-1], prompt.shape[1]
    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        for _ in range(10):
            logits = step.logits([int(logits.argmax())], position)[-1]
            position += 1
    print(profiled.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


if __name__ == "__main__":
    main()
