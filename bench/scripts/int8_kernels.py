"""The int8 assistant's linear layers under two int8 kernels: what the default pair uses (fbgemm's dynamic int8:
a scale per weight row, activations quantized on the fly; `assistgen.models.quantized.Int8Linear`; until 2026-12-03
one scale per weight) against weight-only int8 with a scale per output channel (`torch._weight_int8pack_mm`, the
kernel gpt-fast's int8 uses), its input in fp32 and in bf16; fp32 as the reference. Shapes of Qwen2.5-0.5B, the
default text pair's assistant; seeded random weights.

    .venv/bin/python -m bench.scripts.int8_kernels

Milliseconds, the lower quartile of the products, per layer shape and for a whole token (24 layers' projections and
the output layer), at 1 row (a draft step) and 4. Also each kernel's largest error against the fp32 product.
"""
from __future__ import annotations

import torch
from torch import nn

from assistgen.models.quantized import quantize, quantize_weight

from .linear_packing import quartile_us

LAYERS = 24
# name: (out, in, how many per layer; 0: once per token)
SHAPES = {"attention q/o 896x896": (896, 896, 2), "attention k/v 128x896": (128, 896, 2),
          "MLP gate/up 4864x896": (4864, 896, 2), "MLP down 896x4864": (896, 4864, 1),
          "output 151936x896": (151936, 896, 0)}
ROWS = (1, 4)


def kernels(weight: torch.Tensor):
    """Each kernel as a function of x (rows, in)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight.data = weight
    int8, scale = quantize_weight(weight)       # the same int8 weight and row scales as the assistant's
    scale, scale_bf16 = scale.float(), scale.to(torch.bfloat16)
    dynamic = quantize(nn.Sequential(linear))[0]   # as the default pair's assistant is quantized
    return {"fp32": lambda x: nn.functional.linear(x, weight),
            "dynamic int8 (fbgemm)": dynamic,
            "weight-only int8, fp32 input": lambda x: torch._weight_int8pack_mm(x, int8, scale),
            "weight-only int8, bf16 input": lambda x: torch._weight_int8pack_mm(x.to(torch.bfloat16), int8,
                                                                                 scale_bf16).float()}


def main() -> None:
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    names = list(kernels(torch.zeros(1, 1)))
    token: dict[tuple[int, str], float] = {}
    for rows in ROWS:
        print(f"\n| {rows} row(s): layer | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for name, (out, inp, per_layer) in SHAPES.items():
            weight = torch.randn(out, inp) * 0.02
            x = torch.randn(rows, inp)
            with torch.inference_mode():
                reference = nn.functional.linear(x, weight)
                cells = []
                for kernel, fn in kernels(weight).items():
                    ms = quartile_us(fn, x, 10 if per_layer == 0 else 100) / 1e3
                    error = (fn(x) - reference).abs().max().item()
                    token[rows, kernel] = token.get((rows, kernel), 0.0) + ms * (per_layer * LAYERS or 1)
                    cells.append(f"{ms:.3f} ms (error {error:.3f})")
            print(f"| {name} | " + " | ".join(cells) + " |")
        print("| **a token** | " + " | ".join(f"**{token[rows, k]:.1f} ms**" for k in names) + " |")


if __name__ == "__main__":
    main()
