"""Do Whisper base's transcripts change when its encoder runs in bf16? Baseline greedy runs through the engine."""
import glob, os, sys, time, torch
from torch import nn
from transformers import WhisperForConditionalGeneration
from assistgen.comparison.audio import load_audio
from assistgen.comparison.speech import speech_windows, detect_language
from assistgen.comparison.compare import run_generation
from assistgen.app.validation import request_settings
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool

catalog = load_catalog()
pair = ModelPool(catalog).pair("whisper-base+decoder-int8")
settings = request_settings(catalog.pair("whisper-base+decoder-int8"))
target = pair.target.model
fp32_encoder = target.model.encoder
plain = WhisperForConditionalGeneration.from_pretrained(os.path.expanduser("~/.cache/assistgen/models/whisper-base")).eval()

class Wrapped(nn.Module):
    def __init__(self, enc, mode):
        super().__init__(); self.enc = enc; self.mode = mode; self.config = enc.config
    def forward(self, input_features, attention_mask=None, return_dict=True, **kw):
        if self.mode == "bf16":
            out = self.enc(input_features.to(torch.bfloat16), return_dict=True)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = self.enc(input_features, return_dict=True)
        out.last_hidden_state = out.last_hidden_state.float()
        return out
variants = {"fp32": fp32_encoder,
            "autocast": Wrapped(plain.model.encoder, "autocast"),
            "bf16": Wrapped(WhisperForConditionalGeneration.from_pretrained(os.path.expanduser("~/.cache/assistgen/models/whisper-base")).eval().to(torch.bfloat16).model.encoder, "bf16")}
sets = sys.argv[1:] or ["speech-real", "speech", "speech-other", "speech-long"]
tok = pair.target.tokenizer
for s in sets:
    for clip in sorted(glob.glob(f"bench/inputs/{s}/*")):
        if clip.endswith(".txt"): continue
        samples = load_audio(clip)
        lang = detect_language(pair, samples)[0]
        windows = speech_windows(pair, samples, language=lang)
        outs = {}
        for name, enc in variants.items():
            target.model.encoder = enc
            t = time.perf_counter()
            r = run_generation(pair, windows, settings)
            outs[name] = (r.new_tokens, time.perf_counter() - t)
        target.model.encoder = fp32_encoder
        base = outs["fp32"][0]
        line = f"{s}/{os.path.basename(clip)} {lang} {len(base)} tok fp32 {outs['fp32'][1]:.2f}s"
        for name in ("autocast", "bf16"):
            same = outs[name][0] == base
            line += f" | {name} {'SAME' if same else 'DIFF'} {outs[name][1]:.2f}s"
        print(line, flush=True)
        for name in ("autocast", "bf16"):
            if outs[name][0] != base:
                print("   fp32:", tok.decode(base, skip_special_tokens=True)[:300])
                print(f"   {name}:", tok.decode(outs[name][0], skip_special_tokens=True)[:300])
