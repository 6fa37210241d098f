"""torch.compile against the eager passes we run, on this CPU (issue 16's "torch.compile where it pays").

    .venv/bin/python -m bench.scripts.compiled_steps [--layers 4,12] [--clip CLIP]

Text: one-token steps of a model shaped as Qwen2.5-Coder-1.5B (the default target: 1536 wide, 12 heads, 2 KV heads,
an untied output layer) cut to each number of `--layers`, seeded random weights. Eager as the app runs a target
(oneDNN-packed linear layers, transformers' dynamic cache) against inductor with freezing (its own packed weights,
fused pointwise operations, a static cache, one shape). The per-layer cost is the slope between the two depths.

Speech: the default speech assistant's draft pass (Whisper base's decoder in int8, `engine.whisper_decoder`) on the
clip's encoder output, eager against its attention blocks compiled (dynamic shapes: the cache grows at every draft).
The int8 products cannot be traced (their packed weights are a TorchScript object, and each call breaks the graph),
so compiling the whole pass falls back to compiling these same blocks: the graph breaks are counted and printed.

Medians of the timed steps, rounds interleaved; the time of the first compiled call (the compilation, the prompt's
prefill and 3 steps) is printed too.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

PROMPT = 200
STEPS = 40


def _median_ms(times: list[float]) -> float:
    return round(1000 * statistics.median(times[5:] if len(times) > 10 else times), 1)


def text_step_ms(layers: int, rounds: int = 2) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM, StaticCache

    from assistgen.models.cpu import use_onednn_linears
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=layers, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096,
                         tie_word_embeddings=False)
    plain = Qwen2ForCausalLM(config).eval()
    packed = copy.deepcopy(plain)
    use_onednn_linears(packed)
    prompt = torch.randint(0, 1000, (1, PROMPT))

    @torch.inference_mode()
    def eager() -> list[float]:
        out = packed(input_ids=prompt, use_cache=True, logits_to_keep=1)
        cache, token, times = out.cache, out.logits[:, -1:].argmax(-1), []
        for _ in range(STEPS):
            start = time.perf_counter()
            out = packed(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - start)
        return times

    import torch._inductor.config as inductor
    inductor.freezing = True
    forward = torch.compile(plain.forward, dynamic=False)

    @torch.inference_mode()
    def compiled(steps: int = STEPS) -> list[float]:
        cache = StaticCache(config=config, max_cache_len=512)
        out = plain(input_ids=prompt, cache=cache, cache_position=torch.arange(PROMPT), use_cache=True,
                    logits_to_keep=1)
        token, times = out.logits[:, -1:].argmax(-1), []
        for i in range(steps):
            start = time.perf_counter()
            out = forward(input_ids=token, cache=cache, cache_position=torch.tensor([PROMPT + i]), use_cache=True,
                          logits_to_keep=1)
            token = out.logits[:, -1:].argmax(-1).clone()
            times.append(time.perf_counter() - start)
        return times

    start = time.perf_counter()
    compiled(3)
    compile_s = time.perf_counter() - start
    eager()   # its first-call costs
    runs = {"eager": [], "compiled": []}
    for _ in range(rounds):
        runs["eager"].append(_median_ms(eager()))
        runs["compiled"].append(_median_ms(compiled()))
    return {"layers": layers, "first compiled call s": round(compile_s, 1), **runs}


def speech_draft_ms(clip: str, rounds: int = 3) -> dict:
    from assistgen.comparison.audio import load_audio
    from assistgen.comparison.speech import asr_inputs
    from assistgen.engine import whisper_decoder
    from assistgen.engine.kv import ASSISTANT_AUDIO_MARGIN_S, clip_positions
    from assistgen.models.catalog import load_catalog
    from assistgen.models.pool import ModelPool
    pair = ModelPool(load_catalog()).pair("whisper-base+decoder-int8")
    inputs = asr_inputs(pair, load_audio(clip))
    with torch.inference_mode():
        hidden = pair.target.model.get_encoder()(inputs["input_features"]).last_hidden_state
    hidden = hidden[:, :clip_positions(inputs, ASSISTANT_AUDIO_MARGIN_S)]   # what the assistant reads
    prefix = inputs["decoder_input_ids"][0].tolist()

    def drafts(step) -> tuple[list[int], list[float]]:
        tokens = list(prefix)
        logits, times = step.logits(tokens, 0), []
        for _ in range(STEPS):
            tokens.append(int(logits[-1].argmax()))
            start = time.perf_counter()
            logits = step.logits([tokens[-1]], len(tokens) - 1)
            times.append(time.perf_counter() - start)
        return tokens, times

    from torch._dynamo.utils import counters
    eager = whisper_decoder.WhisperDecoderStep(pair.assistant.model, hidden)
    blocks = whisper_decoder.WhisperDecoderStep(pair.assistant.model, hidden)
    blocks._self_attention = torch.compile(blocks._self_attention, dynamic=True)
    blocks._cross_attention = torch.compile(blocks._cross_attention, dynamic=True)
    reference, _ = drafts(eager)
    start = time.perf_counter()
    tokens, _ = drafts(blocks)
    out = {"clip": clip, "first compiled call s": round(time.perf_counter() - start, 1),
           "same drafts": tokens == reference}
    whole = whisper_decoder.WhisperDecoderStep(pair.assistant.model, hidden)
    whole.logits = torch.compile(whole.logits, dynamic=True)
    drafts(whole)
    out["graph breaks compiling the whole pass"] = sum(counters["graph_break"].values())
    runs = {"eager": [], "compiled blocks": []}
    for _ in range(rounds):
        for name, step in (("eager", eager), ("compiled blocks", blocks)):
            runs[name].append(_median_ms(drafts(step)[1]))
    return {**out, **runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="4,12")
    parser.add_argument("--clip", default="bench/inputs/speech-real/librivox-sense-0870.flac")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    print("speech draft pass, ms:", speech_draft_ms(args.clip), flush=True)
    depths = [int(n) for n in args.layers.split(",") if n]   # --layers "": the speech part only
    text = [text_step_ms(n) for n in depths]
    for row in text:
        print("text one-token step, ms:", row, flush=True)
    if len(text) >= 2:
        a, b = text[0], text[-1]
        for name in ("eager", "compiled"):
            slope = (statistics.median(b[name]) - statistics.median(a[name])) / (b["layers"] - a["layers"])
            print(f"{name}: {slope:.2f} ms per layer")


if __name__ == "__main__":
    main()
