import time, statistics, sys, torch, glob
from assistgen.comparison.audio import load_audio
from assistgen.comparison.speech import asr_inputs
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool
torch.manual_seed(0)
catalog = load_catalog()
pair = ModelPool(catalog).pair("whisper-base+decoder-int8")
from transformers import WhisperForConditionalGeneration
import os
model = WhisperForConditionalGeneration.from_pretrained(os.path.expanduser("~/.cache/assistgen/models/whisper-base")).eval()
enc = model.get_encoder()
print(type(enc), model.dtype, torch.backends.mkldnn.is_available(), torch.ops.mkldnn._is_mkldnn_bf16_supported())
clips = sorted(glob.glob("bench/inputs/speech-real/*.*"))
clips = [c for c in clips if not c.endswith(".txt")]
inputs = asr_inputs(pair, load_audio(clips[0]))
x = inputs["input_features"]
print(x.shape, x.dtype)
import copy
enc16 = copy.deepcopy(enc).to(torch.bfloat16)
def run(e, dt):
    with torch.inference_mode():
        return e(x.to(dt)).last_hidden_state
for _ in range(2): run(enc, torch.float32); run(enc16, torch.bfloat16)
with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
    enc(x)
ts = {"fp32": [], "bf16": [], "autocast": []}
for i in range(7):
    t = time.perf_counter(); a = run(enc, torch.float32); ts["fp32"].append(time.perf_counter() - t)
    t = time.perf_counter(); b = run(enc16, torch.bfloat16); ts["bf16"].append(time.perf_counter() - t)
    t = time.perf_counter()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        c = enc(x).last_hidden_state
    ts["autocast"].append(time.perf_counter() - t)
for k, v in ts.items(): print(k, f"{statistics.median(v)*1000:.0f} ms", [round(s*1000) for s in v])
print("max abs diff bf16", (a - b.float()).abs().max().item(), "autocast", (a - c.float()).abs().max().item(), "scale", a.abs().max().item())
