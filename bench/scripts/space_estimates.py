"""A click's estimated time for each hub pair of models.yaml on this CPU, without downloading a weight.

A pass costs the same whatever the weights' values, so each model is built from its published configuration with
random weights and only 1 and then 2 of its layers; a pass of the whole model is the 1-layer pass plus (layers - 1)
times the difference (the embeddings, the output layer and the per-pass overhead are in both). Each runs as the app
runs it on a CPU, in the numerics its catalog entry gives there (`ModelSpec.on`: an exact w8a8 target, an int8
assistant, a Whisper encoder in bfloat16 where the CPU computes it natively; float32 layers oneDNN-packed), and is
timed through the engine's own decoder (`engine.kv.CachedDecoder`):
- a decoding pass of one token, and a verification pass of 6 (a window of 5 drafts and the target's own), after a
  prompt of `PROMPT_TOKENS` tokens; Whisper: its encoder over one 30 s window;
- a click = baseline then assisted. Baseline: the prompt pass and one pass a new token. Assisted: the prompt passes,
  then per new token the target passes and the assistant passes that the offline pair of the same family measured
  on the same task (`ACCEPTANCE`: target passes and drafted tokens per new token, medians over its runs; prompt
  lookup's free drafts counted as assistant passes, so the assisted column errs slow); for speech the encoder once a
  run (the assistant's own encoder too where it has one). Loading, warm-up and the speed probe are not counted.

    python -m bench.scripts.space_estimates [--out bench/results/space-estimates] [--repeats 5] [--pair NAME]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import torch

from assistgen.engine.attention import use_row_invariant_attention
from assistgen.engine.kv import CachedDecoder
from assistgen.models import quantized
from assistgen.models.catalog import load_catalog
from assistgen.models.cpu import materialize, native_bfloat16, onednn_enabled
from assistgen.models.precision import cast_encoder
from assistgen.models.limits import usable_cpus
from assistgen.models.machine import machine
from assistgen.app.service import numerics_here

PROMPT_TOKENS = 40           # a short chat request, or Whisper's forced prefix and a little
NEW_TOKENS = {"text": 128, "asr": 35}   # the text pairs' default budget; a 10 s clip (about 3.5 tokens a second)
# Acceptance by task, from the offline pairs (bench results of the same family on the same task): the text pairs'
# w8a8 Qwen2.5-Coder 1.5B with its 0.5B sibling in int8 (the hub Qwen2.5 1.5B and 0.5B have the same shapes) on
# chat, translation and summarization; speech: Whisper base with its own decoder in int8 on 8 real clips. A
# distil-Whisper decoder is another model than its target's, so it agrees less often than the target's own decoder
# in int8: its column with these figures is a bound it does not beat.
ACCEPTANCE = {"text": "bench/results/tasks-w8a8/results.json", "asr": "bench/results/peers-speech/results.json"}

# Published configurations (the repositories' config.json), by hub id
WHISPER = {"openai/whisper-large-v3": (1280, 32, 32, 20, 5120, 51866, 128),
           "openai/whisper-large-v2": (1280, 32, 32, 20, 5120, 51865, 80),
           "openai/whisper-small.en": (768, 12, 12, 12, 3072, 51864, 80),
           "openai/whisper-base": (512, 6, 6, 8, 2048, 51865, 80),
           "distil-whisper/distil-large-v3": (1280, 32, 2, 20, 5120, 51866, 128),
           "distil-whisper/distil-large-v2": (1280, 32, 2, 20, 5120, 51865, 80),
           "distil-whisper/distil-small.en": (768, 12, 4, 12, 3072, 51864, 80)}
QWEN = {"Qwen/Qwen2.5-7B-Instruct": (3584, 18944, 28, 28, 4, 152064, False),
        "Qwen/Qwen2.5-1.5B-Instruct": (1536, 8960, 28, 12, 2, 151936, True),
        "Qwen/Qwen2.5-0.5B-Instruct": (896, 4864, 24, 14, 2, 151936, True)}
T5 = {"google/flan-t5-large": (1024, 2816, 24, 16, 64), "google/flan-t5-small": (512, 1024, 8, 6, 64)}
OPT = {"facebook/opt-6.7b": (4096, 16384, 32, 32), "facebook/opt-125m": (768, 3072, 12, 12)}


def acceptance(task: str) -> dict:
    """Target passes and drafted tokens per new token of the offline pair's assisted runs on `task` (medians)."""
    import statistics
    runs = [r for r in json.loads(Path(ACCEPTANCE[task]).read_text())["runs"]
            if r["config"] != "baseline" and r.get("engine", "assistgen") == "assistgen" and r["new_tokens"]]
    return {"source": ACCEPTANCE[task], "runs": len(runs),
            "target_passes": statistics.median(r["target_passes"] / r["new_tokens"] for r in runs),
            "drafted": statistics.median(r["acceptance"]["drafted_tokens"] / r["new_tokens"] for r in runs)}


def build(repo: str, layers: int, decoder_only: bool, spec=None):
    """`repo`'s model with `layers` layers (each stack), random weights, as the app runs it on a CPU (in `spec`'s
    numerics there); and its full layer count."""
    import transformers as tf
    if repo in WHISPER:
        d, enc, dec, heads, ffn, vocab, mels = WHISPER[repo]
        config = tf.WhisperConfig(vocab_size=vocab, num_mel_bins=mels, d_model=d, encoder_layers=layers,
                                  decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
                                  encoder_ffn_dim=ffn, decoder_ffn_dim=ffn)
        full = (enc, dec)
        if decoder_only:
            config.is_encoder_decoder = False
            model = tf.WhisperForCausalLM(config)
        else:
            model = tf.WhisperForConditionalGeneration(config)
    elif repo in QWEN:
        d, ffn, n, heads, kv, vocab, tied = QWEN[repo]
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(vocab_size=vocab, hidden_size=d, intermediate_size=ffn,
                                                   num_hidden_layers=layers, num_attention_heads=heads,
                                                   num_key_value_heads=kv, tie_word_embeddings=tied))
        full = (n, n)
    elif repo in T5:
        d, ffn, n, heads, d_kv = T5[repo]
        model = tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=32128, d_model=d, d_ff=ffn, d_kv=d_kv,
                                                          num_layers=layers, num_heads=heads,
                                                          feed_forward_proj="gated-gelu", tie_word_embeddings=False))
        full = (n, n)
    else:
        d, ffn, n, heads = OPT[repo]
        model = tf.OPTForCausalLM(tf.OPTConfig(vocab_size=50272, hidden_size=d, ffn_dim=ffn, num_hidden_layers=layers,
                                               num_attention_heads=heads, word_embed_proj_dim=d))
        full = (n, n)
    model.eval()
    here = spec.on("cpu") if spec is not None else None
    if here is not None and here.encoder_dtype and native_bfloat16():
        cast_encoder(model, torch.bfloat16)
    if here is not None and here.quantization in quantized.LAYERS:
        quantized.quantize(model, quantized.LAYERS[here.quantization])
        if here.quantization == "w8a8":
            use_row_invariant_attention(model)
    else:
        materialize(model, onednn=onednn_enabled())
    return model, full


def inputs(model) -> dict:
    config = model.config
    if getattr(config, "model_type", "") == "whisper" and config.is_encoder_decoder:
        return {"input_features": torch.randn(1, config.num_mel_bins, 3000), "decoder_input_ids": torch.tensor([[1] * 4])}
    if config.is_encoder_decoder:
        return {"input_ids": torch.randint(5, 1000, (1, PROMPT_TOKENS)), "decoder_input_ids": torch.tensor([[0]])}
    return {"input_ids": torch.randint(5, 1000, (1, PROMPT_TOKENS))}


def pass_timers(model, *, assistant: bool, encoder_outputs=None) -> dict:
    """What to time, by name: the encoder (encoder-decoder models), the prompt pass, a one-token pass, a 6-token
    pass. A decoder-only Whisper reads `encoder_outputs`, as distil-Whisper reads its target's."""
    timers, feed = {}, inputs(model)
    if model.config.is_encoder_decoder:
        encoder = model.get_encoder()
        enc_inputs = {k: v for k, v in feed.items() if k in ("input_features", "input_ids")}
        timers["encoder"] = lambda: encoder(**enc_inputs)
        with torch.inference_mode():
            encoder_outputs = encoder(**enc_inputs)   # run once: the decoder's passes read it
    elif encoder_outputs is not None:
        feed = {"input_ids": torch.tensor([[1] * 4])}
    prefix = feed.get("decoder_input_ids", feed.get("input_ids"))[0].tolist()

    def decoder():
        return CachedDecoder(model, feed, prefix_length=len(prefix), encoder_outputs=encoder_outputs,
                             assistant=assistant)
    timers["prompt"] = lambda: decoder().logits(prefix)
    with torch.inference_mode():
        warm = decoder()
        warm.logits(prefix)
    # the cache keeps the prefix: each call feeds only what follows it (1 token, then 6)
    timers["one"] = lambda: warm.logits(prefix + [7])
    timers["six"] = lambda: warm.logits(prefix + list(range(7, 13)), keep=6)
    return timers


@torch.inference_mode()
def least_times(timers: list[dict], repeats: int) -> list[dict]:
    """Each timer's least seconds over `repeats` rounds (after one untimed call), the models' timers taking turns
    within each round, so that a stretch of load on a shared host falls on all of them alike, not on one."""
    for timer in timers:
        for fn in timer.values():
            fn()
    least = [{name: float("inf") for name in timer} for timer in timers]
    for _ in range(repeats):
        for timer, best in zip(timers, least):
            for name, fn in timer.items():
                started = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - started)
    return least


def model_costs(spec, repeats: int, encoder_width: int | None, assistant: bool) -> dict:
    """Per-pass seconds of the whole model, from its 1- and 2-layer stand-ins."""
    repo, decoder_only = spec.location, spec.decoder_only
    outputs = None
    if decoder_only and encoder_width:
        from transformers.modeling_outputs import BaseModelOutput
        outputs = BaseModelOutput(last_hidden_state=torch.randn(1, 1500, encoder_width))
    built = [build(repo, layers, decoder_only, spec) for layers in (1, 2)]
    full = built[0][1]
    one, two = least_times([pass_timers(model, assistant=assistant, encoder_outputs=outputs) for model, _ in built],
                           repeats)
    for layers, measured in ((1, one), (2, two)):
        print(f"  {repo}, {layers} layer(s): " + ", ".join(f"{k} {v:.4f} s" for k, v in measured.items()), flush=True)
    del built
    gc.collect()
    scale = {"encoder": full[0]}
    return {k: one[k] + (two[k] - one[k]) * (scale.get(k, full[1]) - 1) for k in one}


def click_s(task: str, target: dict, assistant: dict | None, accepted: dict) -> tuple[float, float]:
    """(baseline, assisted) seconds of one click's runs."""
    n = NEW_TOKENS[task]
    encoder = target.get("encoder", 0.0)
    baseline = encoder + target["prompt"] + (n - 1) * target["one"]
    if assistant is None:
        return baseline, baseline
    assisted = (encoder + target["prompt"] + n * accepted["target_passes"] * target["six"]
                + assistant.get("encoder", 0.0) + assistant["prompt"] + n * accepted["drafted"] * assistant["one"])
    return baseline, assisted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/space-estimates")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pair", action="append", help="only these pairs (default: every hub pair)")
    args = parser.parse_args()
    catalog = load_catalog()
    pairs = ([catalog.pair(name) for name in args.pair] if args.pair
             else [p for p in catalog.pairs if p.target.source == "hub"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    accepted = {task: acceptance(task) for task in ACCEPTANCE}
    meta = {"machine": machine(), "cpu_threads": torch.get_num_threads(), "cores": usable_cpus(),
            "torch": torch.__version__, "repeats": args.repeats, "prompt_tokens": PROMPT_TOKENS,
            "new_tokens": NEW_TOKENS, "acceptance": accepted, "load_average": os.getloadavg()}
    costs, rows = {}, []
    for pair in pairs:
        task = "asr" if pair.tasks == ("asr",) else "text"
        for spec in (pair.target, pair.assistant):
            if spec is not None and spec.name not in costs:
                width = WHISPER[pair.target.location][0] if spec.decoder_only else None
                costs[spec.name] = model_costs(spec, args.repeats, width, assistant=spec is pair.assistant)
                print(spec.name, {k: round(v, 4) for k, v in costs[spec.name].items()}, flush=True)
        baseline, assisted = click_s(task, costs[pair.target.name],
                                     costs[pair.assistant.name] if pair.assistant else None, accepted[task])
        numerics = " + ".join(numerics_here(m, torch.device("cpu")) for m in (pair.target, pair.assistant) if m)
        rows.append({"pair": pair.name, "task": task, "numerics": numerics, "new_tokens": NEW_TOKENS[task],
                     "baseline_s": round(baseline, 2), "assisted_s": round(assisted, 2),
                     "click_s": round(baseline + assisted, 1)})
        write(out, meta, costs, rows)   # after each pair: what was measured survives an interrupted run


def write(out: Path, meta: dict, costs: dict, rows: list[dict]) -> None:
    (out / "estimates.json").write_text(json.dumps({"meta": meta, "models": costs, "pairs": rows}, indent=2))
    lines = ["| pair | numerics on a CPU | new tokens | baseline s | assisted s | a click, s |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['pair']} | {r['numerics']} | {r['new_tokens']} | {r['baseline_s']} | {r['assisted_s']} | "
              f"{r['click_s']} |" for r in rows]
    (out / "estimates.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
