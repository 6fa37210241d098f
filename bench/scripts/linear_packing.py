"""One linear layer's product over 1 to 32 rows, with its weight packed for products of 1, 4, 8 or 16 rows: why
assistgen.models.cpu packs for 4 (README, "A cheaper verification pass"). Shapes from the offline models.

    .venv/bin/python -m bench.scripts.linear_packing

Microseconds, the lower quartile of 100 products; small weights stay in the CPU's caches, so read the shape of each
curve rather than its level.
"""
from __future__ import annotations

import time

import torch

SHAPES = {"Whisper base 512x512": (512, 512), "Whisper base MLP 2048x512": (2048, 512),
          "Whisper base output 51865x512": (51865, 512), "Qwen 1.5B attention 1536x1536": (1536, 1536),
          "Qwen 1.5B MLP 8960x1536": (8960, 1536)}
ROWS = (1, 2, 4, 8, 16, 32)


def quartile_us(fn, x, n: int = 100) -> float:
    for _ in range(5):
        fn(x)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 4] * 1e6


def main() -> None:
    torch.manual_seed(0)
    print("| layer | packed for | " + " | ".join(f"{r} rows" for r in ROWS) + " |")
    print("|---|---|" + "---|" * len(ROWS))
    for name, (out, inp) in SHAPES.items():
        weight, bias = torch.randn(out, inp), torch.randn(out)
        for pack in (1, 4, 8, 16):
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, pack)
            cells = [quartile_us(lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], ""),
                                 torch.randn(1, rows, inp)) for rows in ROWS]
            print(f"| {name} | {pack} | " + " | ".join(f"{c:.0f}" for c in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
