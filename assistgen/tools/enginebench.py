"""Engine benchmark: our baseline and assisted loops against transformers' own generate, on identical settings.

    python -m assistgen engine-bench [--models small,medium,offline] [--runs 5] [--max-new-tokens 64]

Prints medians over `--runs` interleaved runs after one warm-up: wall-time ratios (ours / transformers), tokens per
target pass, and whether every output was identical. A command, not a test: timings live here, never in asserts.
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from ..engine.decoding import generate, synchronized_clock
from ..models.catalog import load_catalog
from ..models.pool import ModelPool


@dataclass
class Workload:
    name: str
    target: object
    assistant: object
    prompts: list[dict]
    eos: list[int] | None


def _random_qwen2(hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int, vocab: int, seed: int):
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         tie_word_embeddings=True, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    return Qwen2ForCausalLM(config).eval()


def _random_prompts(vocab: int, count: int, length: int = 64) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(10, vocab, (1, length), generator=g)} for _ in range(count)]


def workloads(names: list[str]):
    """Built one at a time, so each is measured before the next one's models take memory."""
    for name in names:
        if name == "small":  # per-step overhead dominates: ~8M and ~1M parameters
            target = _random_qwen2(128, 4, 384, 4, 2, 8000, seed=0)
            yield Workload("small ~8M + ~1M, random weights", target,
                           _random_qwen2(64, 2, 192, 4, 2, 8000, seed=1), _random_prompts(8000, 2), None)
            yield Workload("small, target as its own assistant", target, target, _random_prompts(8000, 2), None)
        elif name == "medium":  # forward passes dominate: ~500M and ~50M parameters (Qwen2.5-0.5B-like shapes)
            target = _random_qwen2(896, 24, 4864, 14, 2, 151936 // 4, seed=0)
            assistant = _random_qwen2(256, 4, 1024, 4, 2, 151936 // 4, seed=1)
            yield Workload("medium ~500M + ~50M, random weights", target, assistant,
                           _random_prompts(151936 // 4, 2), None)
        elif name == "offline":
            pair = ModelPool(load_catalog()).pair("qwen2.5-coder-1.5b+0.5b")
            prompts = [pair.target.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt",
                return_dict=True) for text in OFFLINE_PROMPTS]
            yield Workload("offline Qwen2.5-Coder 1.5B + 0.5B (fp32, oneDNN linears)", pair.target.model,
                           pair.assistant.model, [dict(p) for p in prompts], list(pair.target.eos_token_ids))
        else:
            raise SystemExit(f"unknown workload {name!r}: choose from small, medium, offline")


OFFLINE_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function is_palindrome(s) that ignores case and non-alphanumeric characters.",
]


def set_assistant_knobs(assistant, num_assistant_tokens: int, schedule: str, confidence_threshold: float = 0.0) -> None:
    """transformers reads the assisted-generation knobs from the assistant's generation_config, and its heuristic
    schedule mutates num_assistant_tokens there: set them before every call (by default no confidence threshold,
    as ours)."""
    assistant.generation_config.num_assistant_tokens = num_assistant_tokens
    assistant.generation_config.num_assistant_tokens_schedule = schedule
    assistant.generation_config.assistant_confidence_threshold = confidence_threshold


def _transformers(workload: Workload, prompt: dict, assistant, max_new_tokens: int) -> tuple[list[int], float]:
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, pad_token_id=0,
                              eos_token_id=workload.eos)
    kwargs = {}
    if assistant is not None:
        set_assistant_knobs(assistant, 5, "heuristic")
        kwargs["assistant_model"] = assistant
    clock = synchronized_clock(workload.target.device)
    start = clock()
    with torch.inference_mode():
        out = workload.target.generate(**prompt, generation_config=config, **kwargs)
    elapsed = clock() - start
    return out[0, prompt["input_ids"].shape[1]:].tolist(), elapsed


def _ours(workload: Workload, prompt: dict, assistant, max_new_tokens: int):
    result = generate(workload.target, prompt, assistant_model=assistant, max_new_tokens=max_new_tokens,
                      num_assistant_tokens=5, num_assistant_tokens_schedule="heuristic", eos_token_id=workload.eos)
    return result.new_tokens, result.latency_s, result.tokens_per_pass


def bench(workload: Workload, runs: int, max_new_tokens: int) -> dict:
    times = {key: [] for key in ("ours_base", "hf_base", "ours_assist", "hf_assist")}
    identical, tokens_per_pass = True, []
    for prompt in workload.prompts:
        for run in range(runs + 1):  # run 0 warms up
            results = {}
            order = list(times)
            order = order[run % 4:] + order[:run % 4]  # interleave, so drift hits every configuration alike
            for key in order:
                assistant = workload.assistant if key.endswith("assist") else None
                if key.startswith("ours"):
                    tokens, seconds, tpp = _ours(workload, prompt, assistant, max_new_tokens)
                    if assistant is not None and run:
                        tokens_per_pass.append(tpp)
                else:
                    tokens, seconds = _transformers(workload, prompt, assistant, max_new_tokens)
                results[key] = tokens
                if run:
                    times[key].append(seconds)
            identical &= len({tuple(t) for t in results.values()}) == 1
    med = {key: statistics.median(v) for key, v in times.items()}
    return {"workload": workload.name, **{f"{k}_s": round(v, 4) for k, v in med.items()},
            "baseline_ratio": med["ours_base"] / med["hf_base"],
            "assisted_ratio": med["ours_assist"] / med["hf_assist"],
            "tokens_per_pass": statistics.median(tokens_per_pass), "identical": identical,
            "runs": runs, "prompts": len(workload.prompts)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m assistgen engine-bench`."""
    parser.add_argument("--models", default="small,medium", help="comma-separated: small, medium, offline")
    parser.add_argument("--runs", type=int, default=5, help="interleaved timed runs per workload (default 5)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per run (default 64)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")


def run(args: argparse.Namespace) -> int:
    """`python -m assistgen engine-bench`, with its parsed arguments."""
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {args.runs} runs after a warm-up")
    print("| workload | ours/hf baseline | ours/hf assisted | tokens/pass | identical | medians (s): ours base, hf base, "
          "ours assisted, hf assisted |")
    print("|---|---|---|---|---|---|")
    for workload in workloads(args.models.split(",")):
        r = bench(workload, args.runs, args.max_new_tokens)
        print(f"| {r['workload']} | {r['baseline_ratio']:.3f} | {r['assisted_ratio']:.3f} | "
              f"{r['tokens_per_pass']:.2f} | {r['identical']} | {r['ours_base_s']}, {r['hf_base_s']}, "
              f"{r['ours_assist_s']}, {r['hf_assist_s']} |", flush=True)
    return 0

