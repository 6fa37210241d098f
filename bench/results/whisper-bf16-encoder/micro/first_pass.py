import torch, time, statistics
from torch import nn
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool
from assistgen.models import precision
from transformers import DynamicCache, EncoderDecoderCache
pair = ModelPool(load_catalog()).pair("whisper-base+decoder-int8")
m = pair.target.model
enc = m.get_encoder()
x = torch.randn(1, 80, 3000)
prompt = torch.tensor([[50258, 50259, 50359, 50363]])
with torch.inference_mode():
    eo = enc(x)
    def first():
        return m(decoder_input_ids=prompt, encoder_outputs=eo, use_cache=True).logits
    def later(out_cache):
        pass
    for _ in range(2): first()
    s = []
    for _ in range(7):
        t = time.perf_counter(); first(); s.append(time.perf_counter() - t)
    print("first pass", f"{statistics.median(s)*1000:.1f} ms")
    kv = [l.encoder_attn.k_proj for l in m.model.decoder.layers] + [l.encoder_attn.v_proj for l in m.model.decoder.layers]
    h = eo.last_hidden_state
    s = []
    for _ in range(7):
        t = time.perf_counter()
        for lin in kv: lin(h)
        s.append(time.perf_counter() - t)
    print("cross kv fp32", f"{statistics.median(s)*1000:.1f} ms")
    w = [(lin.weight if not hasattr(lin, "_weight_plain") else None) for lin in kv]
    hb = h.bfloat16()
    ws = [torch.randn(512, 512).bfloat16() for _ in kv]
    s = []
    for _ in range(7):
        t = time.perf_counter()
        for wb in ws: nn.functional.linear(hb, wb).float()
        s.append(time.perf_counter() - t)
    print("cross kv bf16", f"{statistics.median(s)*1000:.1f} ms")
