"""How often the default pair's assistant drafts what the target would say, in fp32 and in two int8 recipes: the
target's own greedy continuation of each prompt is fed to the assistant in one pass (teacher forcing), and at each
position we count whether the assistant's greedy token is the target's. That rate bounds what drafting can win; the
assistant's precision changes nothing else, since the target decides every token.

    .venv/bin/python -m bench.scripts.int8_agreement [--limit 5] [--max-new-tokens 48]

Recipes: fp32; torch's `quantize_dynamic` defaults (one scale per weight, inputs in 7 bits: the assistant until
2026-12-03); the assistant as the pair loads it now (`quantized.Int8Linear`: a scale per weight row, inputs in 8 bits
where the CPU has VNNI). Prompts: the first `--limit` of the bench's translation, chat and summarization suites, as
the bench builds them. Run `python -m assistgen prepare` first. A benchmark: it asserts nothing.
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from torch import nn

from assistgen.engine.decoding import generate
from assistgen.models.catalog import load_catalog
from assistgen.models.gguf import load_cached
from assistgen.models.conversion import weights_folder
from assistgen.models.devices import default_device
from assistgen.models.pool import ModelPool
from assistgen.tools.bench import builtin_items, model_inputs

PAIR = "qwen2.5-coder-1.5b+0.5b-int8"
SUITES = ("translation", "chat", "summarization")
INPUTS = Path(__file__).resolve().parents[1] / "inputs"


def agreement(model, prompt: list[int], continuation: list[int]) -> list[bool]:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + continuation])).logits[0]
    guesses = logits[len(prompt) - 1:len(prompt) + len(continuation) - 1].argmax(-1).tolist()
    return [g == t for g, t in zip(guesses, continuation)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    catalog = load_catalog()
    pair = ModelPool(catalog).pair(PAIR)
    folder = Path(weights_folder(pair.spec.assistant, catalog, default_device(), torch.float32, lambda f, m: None))
    fp32 = load_cached(folder, torch.float32, tokenizer=False)[0].eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch.ao.quantization is deprecated in 2.13, and works on the pinned torch
        one_scale = torch.ao.quantization.quantize_dynamic(fp32, {nn.Linear}, dtype=torch.qint8)  # a copy
    recipes = {"fp32": fp32, "int8, one scale, 7-bit inputs (before)": one_scale,
               "int8, a scale per row, 8-bit inputs (now)": pair.assistant.model}
    print("| suite | tokens | " + " | ".join(recipes) + " |")
    print("|---|---|" + "---|" * len(recipes))
    for suite in SUITES:
        hits = {name: [] for name in recipes}
        for item in builtin_items(suite, INPUTS, args.limit):
            prompt = model_inputs(pair, item)["input_ids"][0].tolist()
            continuation = generate(pair.target.model, {"input_ids": torch.tensor([prompt])},
                                    max_new_tokens=args.max_new_tokens).new_tokens
            for name, model in recipes.items():
                hits[name] += agreement(model, prompt, continuation)
        n = len(hits["fp32"])
        print(f"| {suite} ({args.limit}) | {n} | " + " | ".join(f"{sum(h) / n:.2f}" for h in hits.values()) + " |",
              flush=True)


if __name__ == "__main__":
    main()
