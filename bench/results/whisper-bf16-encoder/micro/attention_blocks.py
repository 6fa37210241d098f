import torch, time, copy, statistics
from transformers import AttentionInterface
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool
pair = ModelPool(load_catalog()).pair("whisper-base+decoder-int8")
enc = pair.target.model.get_encoder()
BLOCK = int(__import__("sys").argv[1]) if len(__import__("sys").argv) > 1 else 300
def blocks(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    b, h, t, d = query.shape
    q = query.reshape(b * h, t, d); kt = key.reshape(b * h, -1, d).transpose(1, 2); v = value.reshape(b * h, -1, d)
    out = torch.empty(b * h, t, d, dtype=query.dtype)
    for i in range(0, t, BLOCK):
        s = torch.bmm(q[:, i:i + BLOCK], kt)
        if scaling not in (None, 1.0): s.mul_(scaling)
        torch.bmm(torch.softmax(s, -1), v, out=out[:, i:i + BLOCK])
    return out.view(b, h, t, d).transpose(1, 2), None
AttentionInterface.register("blocks", blocks)
def attn_impl(name):
    cfg = copy.copy(enc.config); cfg._attn_implementation = name
    for layer in enc.layers: layer.self_attn.config = cfg
res = {}
x = torch.randn(1, 80, 3000)
with torch.inference_mode():
    outs = {}
    for rnd in range(6):
        for name in ("sdpa", "blocks"):
            attn_impl(name); enc(x) if rnd == 0 else None
            t = time.perf_counter(); outs[name] = enc(x).last_hidden_state; res.setdefault(name, []).append(time.perf_counter() - t)
for k, v in res.items(): print(k, f"{statistics.median(v)*1000:.0f} ms", [round(s*1000) for s in v])
print("diff", (outs["sdpa"] - outs["blocks"]).abs().max().item())
