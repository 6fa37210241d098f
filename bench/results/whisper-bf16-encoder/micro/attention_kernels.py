import torch, time, statistics
F = torch.nn.functional
torch.manual_seed(0)
q, k, v = (torch.randn(1, 8, 1500, 64) for _ in range(3))
def t(fn, n=7):
    fn(); s = []
    for _ in range(n):
        a = time.perf_counter(); fn(); s.append(time.perf_counter() - a)
    return statistics.median(s) * 1000
with torch.inference_mode():
    print("sdpa fp32", t(lambda: F.scaled_dot_product_attention(q, k, v)))
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    print("sdpa bf16", t(lambda: F.scaled_dot_product_attention(qb, kb, vb)))
    def manual(q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2)) * 0.125
        return torch.matmul(torch.softmax(s, -1, dtype=torch.float32).to(q.dtype), v)
    print("manual fp32", t(lambda: manual(q, k, v)))
    print("manual bf16", t(lambda: manual(qb, kb, vb)))
    def bmm(q, k, v):
        s = torch.baddbmm(torch.empty(0, dtype=q.dtype), q[0], k[0].transpose(-1, -2), beta=0, alpha=0.125)
        return torch.bmm(torch.softmax(s, -1), v[0])
    print("bmm fp32", t(lambda: bmm(q, k, v)))
    print("bmm bf16", t(lambda: bmm(qb, kb, vb)))
    for th in (1,):
        pass
