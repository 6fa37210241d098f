"""Would a distil-style assistant pay without training? Whisper base's own decoder cut to a few of its six layers
(distil-Whisper keeps the teacher's first and last), reading base's encoder output: how often does its greedy token
agree with base's, teacher-forced over base's own transcripts of bench/inputs/speech-real?

    ASSISTGEN_ONEDNN=0 .venv/bin/python -m bench.scripts.truncated_decoder

(ASSISTGEN_ONEDNN=0 keeps the weights dense, so the decoder can be copied.) Prints the agreement per choice of
layers. A benchmark: it asserts nothing.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from assistgen.comparison.audio import load_audio
from assistgen.comparison.compare import Settings, run_generation
from assistgen.comparison.speech import speech_windows
from assistgen.engine.decoding import decoder_prefix
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool

CLIPS = Path(__file__).resolve().parents[1] / "inputs" / "speech-real"
CHOICES = [(0, 5), (0, 1, 5), (0, 4, 5), (0, 1, 4, 5)]


def truncated(model, keep: tuple[int, ...]):
    """A copy of `model` whose decoder keeps only the layers `keep`."""
    cut = copy.deepcopy(model)
    layers = cut.model.decoder.layers
    cut.model.decoder.layers = torch.nn.ModuleList([layers[i] for i in keep])
    for i, layer in enumerate(cut.model.decoder.layers):
        layer.self_attn.layer_idx = layer.encoder_attn.layer_idx = i
    cut.config.decoder_layers = len(keep)
    return cut


def main() -> None:
    pair = ModelPool(load_catalog()).pair("whisper-base+tiny.en-int8")
    model = pair.target.model
    variants = {keep: truncated(model, keep) for keep in CHOICES}
    agreed = {keep: 0 for keep in CHOICES}
    total = 0
    with torch.inference_mode():
        for clip in sorted(CLIPS.glob("*.flac")):
            window = speech_windows(pair, load_audio(clip), language="en")[0]
            tokens = run_generation(pair, [window], Settings(max_new_tokens=128)).new_tokens
            prefix = decoder_prefix(model, window.inputs)
            sequence = torch.tensor([prefix + tokens])
            encoded = model.get_encoder()(input_features=window.inputs["input_features"])
            total += len(tokens)
            for keep, cut in variants.items():
                logits = cut(encoder_outputs=encoded, decoder_input_ids=sequence).logits[0]
                guesses = logits[len(prefix) - 1:-1].argmax(-1).tolist()
                agreed[keep] += sum(g == t for g, t in zip(guesses, tokens))
    print(f"Whisper base's decoder cut to some of its 6 layers, untrained; agreement with base over {total} tokens:")
    for keep, n in agreed.items():
        print(f"  layers {keep}: {n}/{total} = {n / total:.0%}")


if __name__ == "__main__":
    main()
