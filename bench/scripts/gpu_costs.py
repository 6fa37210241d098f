"""Pass costs on an accelerator, for real model sizes (random weights: the cost of a pass does not depend on their
values), and the speedup they predict with the acceptance recorded on this project's CPU.

    .venv/bin/python -m bench.scripts.gpu_costs [--device cuda] [--dtype float16] [--out bench/results/gpu]

For each pair of the catalog that a Space would serve (Qwen2.5 1.5B and 7B + 0.5B, Whisper large-v3 + distil-large-v3's
decoder, Whisper small.en + distil-small.en's decoder, OPT-6.7B + 125M), it times verify(k), one target pass over k
rows after a 100-token prompt (the device synchronized before each timer is read), and one assistant pass; then replays the greedy acceptance traces of
bench/inputs/acceptance_traces.json (the Qwen pair's, recorded on the CPU: code, chat, translation) under the
heuristic and adaptive schedules, priced with these costs. `bench/gpu.sh` runs it after the engine's tests on the
device. `--small` shrinks every model to a few layers, to check the script itself on a CPU. The passes take the
engine's own path: on a CUDA device a Qwen model's are graph-captured (`engine/static_steps.py`; `gpu_graphs` times
them against the eager ones), so figures from before it (docs/space.md's "On a GPU") are eager.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from assistgen.engine import schedules
from assistgen.tools.passcosts import VERIFY_ROWS, curve_markdown, plot_curves, verify_curve

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "bench" / "inputs" / "acceptance_traces.json"


def whisper(d_model: int, encoder_layers: int, decoder_layers: int, heads: int, ffn: int, vocab: int, mels: int, *,
            decoder_only: bool = False) -> dict:
    """A Whisper configuration's cost-setting fields; `decoder_only`: distil-Whisper's decoder, read as an assistant."""
    fields = dict(model_type="whisper", vocab_size=vocab, num_mel_bins=mels, d_model=d_model,
                  encoder_layers=encoder_layers, decoder_layers=decoder_layers, encoder_attention_heads=heads,
                  decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, max_source_positions=1500,
                  max_target_positions=448)
    return dict(fields, is_encoder_decoder=False) if decoder_only else fields


# The published configurations of the hub models (config.json of each repository), the fields that set a pass's cost.
QWEN = dict(model_type="qwen2", vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=32768,
            tie_word_embeddings=True)
CONFIGS = {
    "Qwen2.5-1.5B": dict(QWEN, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2),
    "Qwen2.5-7B": dict(QWEN, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "Qwen2.5-0.5B": dict(QWEN, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2),
    "whisper-large-v3": whisper(1280, 32, 32, 20, 5120, 51866, 128),
    "distil-large-v3 decoder": whisper(1280, 32, 2, 20, 5120, 51866, 128, decoder_only=True),
    "whisper-small.en": whisper(768, 12, 12, 12, 3072, 51864, 80),
    "distil-small.en decoder": whisper(768, 12, 4, 12, 3072, 51864, 80, decoder_only=True),
    "OPT-6.7B": dict(model_type="opt", vocab_size=50272, hidden_size=4096, ffn_dim=16384, num_hidden_layers=32,
                     num_attention_heads=32, word_embed_proj_dim=4096, max_position_embeddings=2048),
    "OPT-125M": dict(model_type="opt", vocab_size=50272, hidden_size=768, ffn_dim=3072, num_hidden_layers=12,
                     num_attention_heads=12, word_embed_proj_dim=768, max_position_embeddings=2048),
}
PAIRS = [("Qwen2.5-1.5B", "Qwen2.5-0.5B"), ("Qwen2.5-7B", "Qwen2.5-0.5B"), ("whisper-large-v3", "distil-large-v3 decoder"),
         ("whisper-small.en", "distil-small.en decoder"), ("OPT-6.7B", "OPT-125M")]


def build(name: str, device: torch.device, dtype: torch.dtype, small: bool):
    from transformers import AutoConfig, AutoModelForCausalLM, WhisperForCausalLM, WhisperForConditionalGeneration
    fields = dict(CONFIGS[name])
    model_type = fields.pop("model_type")
    if small:
        for key in ("num_hidden_layers", "encoder_layers", "decoder_layers"):
            if key in fields:
                fields[key] = min(fields[key], 2)
    config = AutoConfig.for_model(model_type, **fields)
    with torch.device(device):
        if model_type == "whisper":
            cls = WhisperForCausalLM if fields.get("is_encoder_decoder") is False else WhisperForConditionalGeneration
            model = cls._from_config(config, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def prompt(model, device: torch.device, length: int = 100) -> dict:
    if model.config.is_encoder_decoder:
        features = torch.randn(1, model.config.num_mel_bins, 3000, device=device, dtype=model.dtype)
        return {"input_features": features, "decoder_input_ids": torch.tensor([[50257, 50362, 50363]])
                if model.config.vocab_size == 51864 else torch.tensor([[50258, 50259, 50360, 50364]])}
    return {"input_ids": torch.randint(1000, 20000, (1, length))}


def assistant_pass_s(model, device: torch.device, target_inputs: dict, repeats: int = 10) -> float:
    """One drafting pass of the assistant (a decoder-only Whisper reads an encoder output of the target's shape)."""
    from assistgen.engine.decoding import synchronized_clock
    from assistgen.engine.kv import CachedDecoder
    if "input_features" in target_inputs:
        from transformers.modeling_outputs import BaseModelOutput
        hidden = torch.randn(1, 1500, model.config.d_model, device=device, dtype=model.dtype)
        tokens = target_inputs["decoder_input_ids"][0].tolist()
        decoder = CachedDecoder(model, {}, prefix_length=len(tokens),
                                encoder_outputs=BaseModelOutput(last_hidden_state=hidden), assistant=True)
    else:
        tokens = target_inputs["input_ids"][0].tolist()
        decoder = CachedDecoder(model, {"input_ids": torch.tensor([tokens])}, prefix_length=len(tokens),
                                assistant=True)
    decoder.logits(tokens)
    clock = synchronized_clock(device)
    times = []
    for _ in range(repeats):
        start = clock()
        decoder.logits(tokens + [5])
        times.append(clock() - start)
    return min(times)


def predicted(curve: list[dict], assistant_s: float) -> dict[str, float]:
    """Median speedup over the recorded traces (the Qwen pair's greedy acceptance, its fp32 assistant's), per suite
    and schedule, priced with this device's costs."""
    costs = {p["rows"]: p["seconds"] for p in curve}
    ks = sorted(costs)

    def pass_s(rows: int) -> float:
        for a, b in zip(ks, ks[1:]):
            if a <= rows <= b:
                return costs[a] + (costs[b] - costs[a]) * (rows - a) / (b - a)
        return costs[ks[-1]]
    traces = json.loads(TRACES.read_text())
    out = {}
    for suite in ("code", "chat", "translation"):
        names = [n for n in traces if n.startswith(suite)]
        for label, make, confident in (("heuristic", lambda: schedules.HeuristicSchedule(5), False),
                                       ("adaptive", lambda: schedules.AdaptiveSchedule(5), True)):
            speedups = []
            for name in names:
                match = [bool(m) for m in traces[name]["fp32"]]
                seconds = schedules.replay(make(), match, traces[name]["fp32_p"] if confident else None,
                                           assistant_s=assistant_s, pass_s=pass_s)
                speedups.append(len(match) * pass_s(1) / seconds)
            out[f"{suite} {label}"] = round(statistics.median(speedups), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--out", default="bench/results/gpu")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    report = {"device": name, "dtype": args.dtype, "date": time.strftime("%Y-%m-%d %H:%M"), "pairs": {}}
    curves = {}
    for target_name, assistant_name in PAIRS:
        torch.manual_seed(0)
        target = build(target_name, device, dtype, args.small)
        inputs = prompt(target, device)
        curve = verify_curve(target, inputs, rows=VERIFY_ROWS, rounds=3)
        del target
        assistant = build(assistant_name, device, dtype, args.small)
        a_s = assistant_pass_s(assistant, device, inputs)
        del assistant
        if device.type == "cuda":
            torch.cuda.empty_cache()
        curves[target_name] = curve
        entry = {"verify_curve": curve, "assistant_pass_s": round(a_s, 5),
                 "cost_ratio": round(a_s / curve[0]["seconds"], 3)}
        if target_name.startswith("Qwen"):
            entry["predicted_speedup"] = predicted(curve, a_s)
        report["pairs"][f"{target_name} + {assistant_name}"] = entry
        print(target_name, json.dumps(entry), flush=True)
    (out / "gpu_costs.json").write_text(json.dumps(report, indent=1))
    lines = [f"# Pass costs on {name} ({args.dtype}), {report['date']}", "", "## verify(k)", ""]
    lines += curve_markdown(curves)
    lines += ["", "## Assistants", "", "| pair | assistant pass s | c |", "|---|---|---|"]
    for pair, entry in report["pairs"].items():
        lines.append(f"| {pair} | {entry['assistant_pass_s']:.4f} | {entry['cost_ratio']:.3f} |")
    for pair, entry in report["pairs"].items():
        if "predicted_speedup" in entry:
            lines += ["", f"{pair}, predicted from the greedy acceptance of the Qwen2.5-Coder 1.5B + 0.5B pair recorded "
                      "on the CPU (bench/inputs/acceptance_traces.json): " + ", ".join(f"{k} {v:.2f}×" for k, v in
                                                             entry["predicted_speedup"].items())]
    (out / "gpu_costs.md").write_text("\n".join(lines) + "\n")
    plot_curves(curves, out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
