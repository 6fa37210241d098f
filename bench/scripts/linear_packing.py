"""One linear layer's product over 1 to 32 rows, with its weight packed for products of 1, 4, 8 or 16 rows: why
assistgen.models.cpu packs for 4 (README, "A cheaper verification pass"). Shapes from the offline models.

    .venv/bin/python -m bench.scripts.linear_packing

Microseconds, the lower quartile of 100 products; small weights stay in the CPU's caches, so read the shape of each
curve rather than its level.

    .venv/bin/python -m bench.scripts.linear_packing --model-rows qwen2.5-coder-1.5b+0.5b-int8 [--repeats 16]

A prepared pair's target instead: every packed linear layer its decoder runs at each step (the weights far larger
than any cache, as in a pass), over 1 to 4 rows, as oneDNN runs them and padded with zero rows to
`cpu.PACKED_FOR_ROWS` (what `cpu.OneDNNLinear` does below `cpu.PAD_BELOW_ROWS` rows), interleaved; milliseconds per
sweep, median and lower quartile of `--repeats`.
"""
from __future__ import annotations

import argparse
import statistics
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


def _decoder_linears(model) -> list:
    """The packed layers one decoding step runs: all of a decoder-only model's; an encoder-decoder model's decoder
    and output layers, less the cross-attention keys and values (computed once per input)."""
    from assistgen.models.cpu import OneDNNLinear
    layers = []
    for name, module in model.named_modules():
        if not isinstance(module, OneDNNLinear):
            continue
        if model.config.is_encoder_decoder and ("encoder." in name or "encoder_attn.k_proj" in name
                                                or "encoder_attn.v_proj" in name):
            continue
        layers.append(module)
    return layers


def model_rows(pair_name: str, repeats: int) -> None:
    import torch.nn.functional as F

    from assistgen.models.catalog import load_catalog
    from assistgen.models.cpu import PACKED_FOR_ROWS
    from assistgen.models.pool import ModelPool
    layers = _decoder_linears(ModelPool(load_catalog()).pair(pair_name).target.model)
    inputs = {}

    def sweep(rows: int, pad: bool) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            for m in layers:
                x = inputs.setdefault((m.in_features, rows), torch.randn(rows, m.in_features))
                if pad:
                    x = F.pad(x, (0, 0, 0, PACKED_FOR_ROWS - rows))
                torch.ops.mkldnn._linear_pointwise(x, m.weight, m.bias, "none", [], "")[:rows]
        return time.perf_counter() - start

    cases = [(rows, pad) for rows in range(1, PACKED_FOR_ROWS + 1) for pad in (False, True)
             if not (pad and rows == PACKED_FOR_ROWS)]
    times = {case: [] for case in cases}
    for _ in range(repeats):
        for case in cases:
            times[case].append(sweep(*case))
    weight_mb = sum(m.in_features * m.out_features for m in layers) * 4 / 1e6
    print(f"{pair_name}: {len(layers)} packed layers a step, {weight_mb:.0f} MB of fp32 weights; ms per sweep over "
          f"{repeats} repeats")
    print("| rows | as run: median | lower quartile | padded to 4: median | lower quartile |")
    print("|---|---|---|---|---|")
    for rows in range(1, PACKED_FOR_ROWS + 1):
        cells = []
        for pad in (False, True):
            v = times.get((rows, pad))
            cells += ["–", "–"] if v is None else [f"{statistics.median(v) * 1e3:.1f}",
                                                   f"{statistics.quantiles(v, n=4)[0] * 1e3:.1f}"]
        print(f"| {rows} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-rows", metavar="PAIR", help="time a prepared pair's target layers, padded or not")
    parser.add_argument("--repeats", type=int, default=16)
    args = parser.parse_args()
    if args.model_rows:
        model_rows(args.model_rows, args.repeats)
        return
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
