import torch, time, statistics
F = torch.nn.functional
torch.manual_seed(0)
q, k, v = (torch.randn(8, 1500, 64) for _ in range(3))
def t(name, fn, n=7):
    fn(); s = []
    for _ in range(n):
        a = time.perf_counter(); fn(); s.append(time.perf_counter() - a)
    print(name, f"{statistics.median(s) * 1000:.1f} ms")
with torch.inference_mode():
    for dt in (torch.float32, torch.bfloat16):
        qb, kb, vb = q.to(dt), k.to(dt), v.to(dt)
        kt = kb.transpose(-1, -2).contiguous()
        t(f"bmm qk {dt}", lambda: torch.bmm(qb, kt))
        t(f"bmm qk(T view) {dt}", lambda: torch.bmm(qb, kb.transpose(-1,-2)))
        s = torch.bmm(qb, kt)
        t(f"softmax {dt}", lambda: torch.softmax(s, -1))
        t(f"softmax->f32 {dt}", lambda: torch.softmax(s, -1, dtype=torch.float32))
        p = torch.softmax(s, -1)
        t(f"bmm pv {dt}", lambda: torch.bmm(p, vb))
        # chunked: rows of 250 to stay in cache
        def chunked():
            out = torch.empty_like(qb)
            for i in range(0, 1500, 300):
                sc = torch.bmm(qb[:, i:i+300], kt)
                torch.softmax(sc, -1, out=sc) if False else None
                out[:, i:i+300] = torch.bmm(torch.softmax(sc, -1), vb)
            return out
        t(f"chunked {dt}", chunked)
