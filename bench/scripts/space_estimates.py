"""A click's estimated time for each hub pair of models.yaml on this CPU, without downloading a weight.

A pass costs the same whatever the weights' values, so each model is built from its published configuration with
random weights and only 1 and then 2 of its layers; a pass of the whole model is the 1-layer pass plus (layers - 1)
times the difference (the embeddings, the output layer and the per-pass overhead are in both). Timed here, through
the engine's own decoder (`engine.kv.CachedDecoder`) and the app's CPU setup (oneDNN-packed linear layers), in
float32:
- a decoding pass of one token, and a verification pass of 6 (a window of 5 drafts and the target's own), after a
  prompt of `PROMPT_TOKENS` tokens; Whisper: its encoder over one 30 s window;
- a click = baseline then assisted: the prompt pass and `NEW_TOKENS` one-token passes; then the prompt passes, the
  verification passes (`NEW_TOKENS / TOKENS_PER_PASS`) and 5 assistant passes for each; for speech the encoder once a
  run (the assistant's own encoder too where it has one). Loading, warm-up and the speed probe are not counted.

    python -m bench.scripts.space_estimates [--out bench/results/space-estimates] [--repeats 5]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import torch

from assistgen.engine.kv import CachedDecoder
from assistgen.models.catalog import load_catalog
from assistgen.models.cpu import materialize, onednn_enabled
from assistgen.models.limits import usable_cpus

PROMPT_TOKENS = 40           # a short chat request, or Whisper's forced prefix and a little
NEW_TOKENS = {"text": 128, "asr": 60}   # the text pairs' default budget; about 20 s of speech
TOKENS_PER_PASS = 2.5        # assisted tokens per target pass, typical of a same-family pair (README, Results)
WINDOW = 5

# Published configurations (the repositories' config.json), by hub id
WHISPER = {"openai/whisper-large-v3": (1280, 32, 32, 20, 5120, 51866, 128),
           "openai/whisper-large-v2": (1280, 32, 32, 20, 5120, 51865, 80),
           "openai/whisper-small.en": (768, 12, 12, 12, 3072, 51864, 80),
           "distil-whisper/distil-large-v3": (1280, 32, 2, 20, 5120, 51866, 128),
           "distil-whisper/distil-large-v2": (1280, 32, 2, 20, 5120, 51865, 80),
           "distil-whisper/distil-small.en": (768, 12, 4, 12, 3072, 51864, 80)}
QWEN = {"Qwen/Qwen2.5-7B-Instruct": (3584, 18944, 28, 28, 4, 152064, False),
        "Qwen/Qwen2.5-1.5B-Instruct": (1536, 8960, 28, 12, 2, 151936, True),
        "Qwen/Qwen2.5-0.5B-Instruct": (896, 4864, 24, 14, 2, 151936, True)}
T5 = {"google/flan-t5-large": (1024, 2816, 24, 16, 64), "google/flan-t5-small": (512, 1024, 8, 6, 64)}
OPT = {"facebook/opt-6.7b": (4096, 16384, 32, 32), "facebook/opt-125m": (768, 3072, 12, 12)}


def build(repo: str, layers: int, decoder_only: bool):
    """`repo`'s model with `layers` layers (each stack), random weights, as the app runs it on a CPU; and its full
    layer count."""
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
    materialize(model, onednn=onednn_enabled())
    return model, full


def inputs(model) -> dict:
    config = model.config
    if getattr(config, "model_type", "") == "whisper" and config.is_encoder_decoder:
        return {"input_features": torch.randn(1, config.num_mel_bins, 3000), "decoder_input_ids": torch.tensor([[1] * 4])}
    if config.is_encoder_decoder:
        return {"input_ids": torch.randint(5, 1000, (1, PROMPT_TOKENS)), "decoder_input_ids": torch.tensor([[0]])}
    return {"input_ids": torch.randint(5, 1000, (1, PROMPT_TOKENS))}


@torch.inference_mode()
def pass_costs(model, repeats: int, *, assistant: bool, encoder_outputs=None) -> dict:
    """Seconds of: the encoder (encoder-decoder models), the prompt pass, a one-token pass, a 6-token pass. A
    decoder-only Whisper reads `encoder_outputs`, as distil-Whisper reads its target's."""
    costs, feed = {}, inputs(model)
    if model.config.is_encoder_decoder:
        encoder = model.get_encoder()
        enc_inputs = {k: v for k, v in feed.items() if k in ("input_features", "input_ids")}
        costs["encoder"] = _median(lambda: encoder(**enc_inputs), repeats)
        encoder_outputs = encoder(**enc_inputs)   # run once: the decoder's passes read it
    elif encoder_outputs is not None:
        feed = {"input_ids": torch.tensor([[1] * 4])}
    prefix = feed.get("decoder_input_ids", feed.get("input_ids"))[0].tolist()

    def decoder():
        return CachedDecoder(model, feed, prefix_length=len(prefix), encoder_outputs=encoder_outputs,
                             assistant=assistant)
    costs["prompt"] = _median(lambda: decoder().logits(prefix), max(1, repeats // 2))
    warm = decoder()
    warm.logits(prefix)
    # the cache keeps the prefix: each call feeds only what follows it (1 token, then 6)
    costs["one"] = _median(lambda: warm.logits(prefix + [7]), repeats)
    costs["six"] = _median(lambda: warm.logits(prefix + list(range(7, 13)), keep=6), repeats)
    return costs


def _median(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)   # the least disturbed: the host may be shared


def model_costs(repo: str, decoder_only: bool, repeats: int, encoder_width: int | None, assistant: bool) -> dict:
    """Per-pass seconds of the whole model, from its 1- and 2-layer stand-ins."""
    measured = []
    full = None
    for layers in (1, 2):
        model, full = build(repo, layers, decoder_only)
        outputs = None
        if decoder_only and encoder_width:
            from transformers.modeling_outputs import BaseModelOutput
            outputs = BaseModelOutput(last_hidden_state=torch.randn(1, 1500, encoder_width))
        measured.append(pass_costs(model, repeats, assistant=assistant, encoder_outputs=outputs))
        print(f"  {repo}, {layers} layer(s): " + ", ".join(f"{k} {v:.4f} s" for k, v in measured[-1].items()),
              flush=True)
        del model
        gc.collect()
    one, two = measured
    scale = {"encoder": full[0]}
    return {k: one[k] + (two[k] - one[k]) * (scale.get(k, full[1]) - 1) for k in one}


def click_s(task: str, target: dict, assistant: dict | None) -> tuple[float, float]:
    """(baseline, assisted) seconds of one click's runs."""
    n = NEW_TOKENS[task]
    encoder = target.get("encoder", 0.0)
    baseline = encoder + target["prompt"] + (n - 1) * target["one"]
    verifications = n / TOKENS_PER_PASS
    assisted = encoder + target["prompt"] + verifications * target["six"]
    if assistant is not None:
        assisted += assistant.get("encoder", 0.0) + assistant["prompt"] + verifications * WINDOW * assistant["one"]
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
    meta = {"cpu_threads": torch.get_num_threads(), "cores": usable_cpus(),
            "torch": torch.__version__, "repeats": args.repeats, "prompt_tokens": PROMPT_TOKENS,
            "tokens_per_pass": TOKENS_PER_PASS, "window": WINDOW, "load_average": os.getloadavg()}
    costs, rows = {}, []
    for pair in pairs:
        task = "asr" if pair.tasks == ("asr",) else "text"
        for spec in (pair.target, pair.assistant):
            if spec is not None and spec.name not in costs:
                width = WHISPER[pair.target.location][0] if spec.decoder_only else None
                costs[spec.name] = model_costs(spec.location, spec.decoder_only, args.repeats, width,
                                               assistant=spec is pair.assistant)
                print(spec.name, {k: round(v, 4) for k, v in costs[spec.name].items()}, flush=True)
        baseline, assisted = click_s(task, costs[pair.target.name],
                                     costs[pair.assistant.name] if pair.assistant else None)
        rows.append({"pair": pair.name, "task": task, "new_tokens": NEW_TOKENS[task], "baseline_s": round(baseline, 1),
                     "assisted_s": round(assisted, 1), "click_s": round(baseline + assisted, 1)})
        write(out, meta, costs, rows)   # after each pair: what was measured survives an interrupted run


def write(out: Path, meta: dict, costs: dict, rows: list[dict]) -> None:
    (out / "estimates.json").write_text(json.dumps({"meta": meta, "models": costs, "pairs": rows}, indent=2))
    lines = ["| pair | new tokens | baseline s | assisted s | a click, s |", "|---|---|---|---|---|"]
    lines += [f"| {r['pair']} | {r['new_tokens']} | {r['baseline_s']} | {r['assisted_s']} | {r['click_s']} |"
              for r in rows]
    (out / "estimates.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
