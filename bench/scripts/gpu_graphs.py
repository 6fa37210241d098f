"""Eager against graph-captured passes on a GPU: what `engine/static_steps.py` buys for the hub pairs' real shapes
(random weights of the published configurations, `gpu_costs.CONFIGS`: a pass's cost does not depend on their values).

    .venv/bin/python -m bench.scripts.gpu_graphs [--device cuda] [--dtype float16] [--out bench/results/gpu]

For Qwen2.5 7B + 0.5B and 1.5B + 0.5B, each model's one-token step and 6-row pass (a window of 5 drafts verified)
after a 100-token prompt, the median of `--repeats` passes, the device synchronized before each timer is read, through

- `transformers`: transformers' modules over a dynamic cache (a float target's path off a GPU);
- `lean`: `llama_decoder.LlamaDecoderStep` (an assistant's path off a GPU);
- `static eager`: `static_steps.StaticDecoder`'s padded passes, run eagerly;
- `static graphs`: the same passes replayed as CUDA graphs, captured first (the capture's seconds are reported: the
  warm-up pays them), their logits compared with the eager passes';

then c (the assistant's step over the target's) per path, the speedups the Qwen pair's greedy acceptance recorded on
the CPU predicts with each path's costs (`gpu_costs.predicted`), and greedy identity on the device: the target alone,
assisted by its assistant and by prompt lookup, all through graphs, must give the same tokens; the target alone
through transformers' modules is compared too (float16 may part from it at a near tie: reported, not required).
Whisper large-v3 + distil-large-v3's decoder is timed eagerly only: encoder-decoder models are not captured yet.
Writes gpu_graphs.json and gpu_graphs.md. `bench/gpu.sh` runs it; `--small` (2 layers) checks the script on a CPU,
where the graph path is skipped.

Last run: none yet. Prepared on a CPU-only machine; no GPU was available to run it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from unittest import mock

import torch

from assistgen.engine import static_steps
from assistgen.engine.decoding import generate, synchronized_clock
from assistgen.engine.kv import CachedDecoder
from assistgen.engine.llama_decoder import LlamaDecoderStep
from bench.scripts.gpu_costs import build, predicted, prompt

PAIRS = [("Qwen2.5-7B", "Qwen2.5-0.5B"), ("Qwen2.5-1.5B", "Qwen2.5-0.5B"),
         ("whisper-large-v3", "distil-large-v3 decoder")]
ROWS = (1, 6)
NEW_TOKENS = 64


def _decoder(model, tokens: list[int], path: str) -> CachedDecoder:
    """A decoder of `model` whose passes take `path` (see the module's list)."""
    with mock.patch.object(static_steps, "use_static_steps", lambda m: False):
        decoder = CachedDecoder(model, {"input_ids": torch.tensor([tokens])}, prefix_length=len(tokens))
    if path == "lean":
        decoder._step = LlamaDecoderStep(model)
    elif path == "static eager":
        decoder._step = static_steps.StaticCacheStep(model, static_steps.StaticDecoder(model, graphs=False))
    elif path == "static graphs":
        decoder._step = static_steps.StaticCacheStep(model)
    return decoder


def pass_s(decoder: CachedDecoder, tokens: list[int], rows: int, repeats: int) -> float:
    """Median seconds of a pass over `rows` new tokens after `tokens` (the cache rolled back each time)."""
    decoder.logits(tokens)
    fed = tokens + [5] * rows
    clock = synchronized_clock(decoder.device)
    times = []
    for _ in range(repeats + 2):   # the first two: first-call costs
        start = clock()
        decoder.logits(fed, keep=rows)
        times.append(clock() - start)
    return statistics.median(times[2:])


def graphs_against_eager(model, tokens: list[int]) -> dict:
    """The largest difference between a replayed and an eager static pass's logits (prompt, one step, 6 rows)."""
    graphs, eager = _decoder(model, tokens, "static graphs"), _decoder(model, tokens, "static eager")
    diffs = [float((graphs.logits(t, keep).float() - eager.logits(t, keep)).abs().max())
             for t, keep in [(tokens, 1), (tokens + [5], 1), (tokens + [5, 6, 7, 8, 9, 10, 11], 6)]]
    return {"max_abs_logit_diff": max(diffs)}


def model_costs(model, tokens: list[int], paths: list[str], repeats: int) -> dict:
    """{path: {"1": s, "6": s}} and, for graphs, the seconds their capture took."""
    out: dict = {}
    if "static graphs" in paths:
        clock = synchronized_clock(model.device)
        start = clock()
        captured = static_steps.prepare_graphs(model)
        out["capture_s"] = round(clock() - start, 3)
        out["captured_rows"] = captured
    for path in paths:
        decoder = _decoder(model, tokens, path)
        out[path] = {str(rows): round(pass_s(decoder, tokens, rows, repeats), 6) for rows in ROWS}
    if "static graphs" in paths:
        out["graphs_against_eager"] = graphs_against_eager(model, tokens)
    return out


def greedy_identity(target, assistant, tokens: list[int]) -> dict:
    """Greedy tokens of the target alone, assisted, and with prompt lookup, through the device's default path (graphs
    on a GPU), and of the target alone through transformers' modules."""
    inputs = {"input_ids": torch.tensor([tokens])}
    runs = {"baseline": generate(target, inputs, max_new_tokens=NEW_TOKENS),
            "assisted": generate(target, inputs, assistant_model=assistant, max_new_tokens=NEW_TOKENS),
            "prompt lookup": generate(target, inputs, prompt_lookup_num_tokens=5, max_new_tokens=NEW_TOKENS)}
    with mock.patch.object(static_steps, "use_static_steps", lambda m: False):
        plain = generate(target, inputs, max_new_tokens=NEW_TOKENS)
    base = runs["baseline"].new_tokens
    same = lambda a, b: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))  # noqa: E731
    return {"identical": all(r.new_tokens == base for r in runs.values()),
            "runs": {name: {"identical": r.new_tokens == base, "latency_s": round(r.latency_s, 4),
                            "target_passes": r.target_passes, "tokens_per_pass": round(r.tokens_per_pass, 3)}
                     for name, r in runs.items()},
            "transformers_baseline": {"identical": plain.new_tokens == base,
                                      "tokens_agreeing": same(plain.new_tokens, base),
                                      "latency_s": round(plain.latency_s, 4)}}


def whisper_costs(target, assistant, device: torch.device, repeats: int) -> dict:
    """Eager one-token and 6-row passes of a Whisper target and its decoder-only assistant (no graphs yet)."""
    from transformers.modeling_outputs import BaseModelOutput
    inputs = prompt(target, device)
    tokens = inputs["decoder_input_ids"][0].tolist()
    out = {"target": {"transformers": {str(r): round(pass_s(CachedDecoder(target, inputs, prefix_length=len(tokens)),
                                                             tokens, r, repeats), 6) for r in ROWS}}}
    hidden = BaseModelOutput(last_hidden_state=torch.randn(1, 1500, assistant.config.d_model, device=device,
                                                           dtype=assistant.dtype))
    out["assistant"] = {"lean": {str(r): round(pass_s(CachedDecoder(assistant, {}, prefix_length=len(tokens),
                                                                    encoder_outputs=hidden, assistant=True),
                                                       tokens, r, repeats), 6) for r in ROWS}}
    out["note"] = "encoder-decoder models are not captured as graphs yet"
    return out


def markdown(report: dict) -> list[str]:
    lines = [f"# Eager and graph-captured passes on {report['device']} ({report['dtype']}), {report['date']}", "",
             "Median seconds of a pass over 1 and 6 new rows after a 100-token prompt; random weights of the real "
             "configurations.", "", "| model | path | 1 row s | 6 rows s |", "|---|---|---|---|"]
    for pair, entry in report["pairs"].items():
        for role in ("target", "assistant"):
            for path, costs in entry[role].items():
                if isinstance(costs, dict) and "1" in costs:
                    lines.append(f"| {pair} {role} | {path} | {costs['1']:.5f} | {costs['6']:.5f} |")
    for pair, entry in report["pairs"].items():
        lines += ["", f"## {pair}", ""]
        if "c" in entry:
            lines.append("c (assistant step / target step): " + ", ".join(f"{k} {v:.3f}" for k, v in entry["c"].items()))
        for path, speedups in entry.get("predicted_speedup", {}).items():
            lines.append(f"predicted speedup, {path}: " + ", ".join(f"{k} {v:.2f}×" for k, v in speedups.items()))
        for role in ("target", "assistant"):
            if "capture_s" in entry[role]:
                lines.append(f"{role}'s graphs ({entry[role]['captured_rows']} rows) captured in "
                             f"{entry[role]['capture_s']:.2f} s; their logits against the eager passes': at most "
                             f"{entry[role]['graphs_against_eager']['max_abs_logit_diff']:.2e} apart")
        if "greedy" in entry:
            g = entry["greedy"]
            lines.append(f"greedy identity on the device (baseline, assisted, prompt lookup): {g['identical']}; "
                         f"transformers' baseline agrees for {g['transformers_baseline']['tokens_agreeing']} of "
                         f"{NEW_TOKENS} tokens")
        if "note" in entry:
            lines.append(entry["note"])
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--pairs", nargs="*", help="target names of PAIRS to run (default: all)")
    parser.add_argument("--out", default="bench/results/gpu")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    graphs = device.type == "cuda"
    paths = ["transformers", "lean", "static eager"] + (["static graphs"] if graphs else [])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if graphs else "CPU"
    report = {"device": name, "dtype": args.dtype, "date": time.strftime("%Y-%m-%d %H:%M"), "pairs": {}}
    for target_name, assistant_name in PAIRS:
        if args.pairs and target_name not in args.pairs:
            continue
        torch.manual_seed(0)
        target, assistant = build(target_name, device, dtype, args.small), build(assistant_name, device, dtype,
                                                                                  args.small)
        if target.config.model_type == "whisper":
            entry = whisper_costs(target, assistant, device, args.repeats)
        else:
            tokens = prompt(target, device)["input_ids"][0].tolist()
            entry = {"target": model_costs(target, tokens, paths, args.repeats),
                     "assistant": model_costs(assistant, tokens, paths, args.repeats)}
            entry["c"] = {path: round(entry["assistant"][path]["1"] / entry["target"][path]["1"], 3) for path in paths}
            entry["predicted_speedup"] = {
                path: predicted([{"rows": r, "seconds": entry["target"][path][str(r)]} for r in ROWS],
                                entry["assistant"][path]["1"]) for path in paths}
            entry["greedy"] = greedy_identity(target, assistant, tokens)
        report["pairs"][f"{target_name} + {assistant_name}"] = entry
        print(target_name, json.dumps(entry), flush=True)
        del target, assistant
        if graphs:
            torch.cuda.empty_cache()
    (out / "gpu_graphs.json").write_text(json.dumps(report, indent=1))
    lines = markdown(report)
    (out / "gpu_graphs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
