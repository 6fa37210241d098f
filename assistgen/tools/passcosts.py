"""What a target pass costs on this machine: the memory read bandwidth and the floor it sets for a one-token step, and
verify(k), the cost of one pass over k rows against a pass over one row (the price of verifying k - 1 drafts)."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from ..comparison.probe import SpeedProbe
from ..models.loading import weight_bytes
from ..models.quantized import Int8Linear

VERIFY_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def memory_bandwidth_gb_s(megabytes: int = 1024, repeats: int = 7) -> float:
    """Read bandwidth: the best of `repeats` sums over a tensor far larger than any cache. Decoding reads each
    weight once per token and writes almost nothing, so reading is what bounds it."""
    data = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best / 1e9


def floor(pair, bandwidth_gb_s: float) -> dict:
    """The fastest possible baseline: every weight read once per token, at the machine's read bandwidth."""
    model = pair.target.model
    per_token = pair.target.num_bytes  # counted at load, before linear weights moved into oneDNN's layout
    # The embedding lookup reads one row per token, not the table (unless the output layer shares it).
    embeddings = model.get_input_embeddings()
    # Tied: the output layer reads the whole table, counted once; an int8 output layer is a copy, counted beside it
    tied = (getattr(model.config, "tie_word_embeddings", False)
            and not isinstance(model.get_output_embeddings(), Int8Linear))
    if embeddings is not None and not tied:
        per_token -= embeddings.weight.numel() * embeddings.weight.element_size()
    if model.config.is_encoder_decoder:   # an encoder reads its weights once per input, not once per token
        per_token -= weight_bytes(model.get_encoder(), model.dtype)
    return {"bandwidth_gb_s": round(bandwidth_gb_s, 2), "bytes_per_token": int(per_token),
            "floor_ms_per_token": round(1000 * per_token / (bandwidth_gb_s * 1e9), 2)}


def verify_curve(model, inputs: dict, rows: tuple[int, ...] = VERIFY_ROWS, rounds: int = 2) -> list[dict]:
    """verify(k): seconds of one target pass over k rows after the whole prompt of `inputs`, each the fastest of
    `rounds` x 3 passes, the sizes interleaved round by round so that drift hits them alike."""
    probe = SpeedProbe(model, inputs, prompt_tokens=None)
    best: dict[int, float] = {}
    for _ in range(rounds):
        for k in rows:
            seconds = probe.pass_s(k)
            best[k] = min(best.get(k, seconds), seconds)
    one = best[rows[0]] if rows[0] == 1 else probe.pass_s(1)
    return [{"rows": k, "seconds": round(best[k], 5), "over_one_row": round(best[k] / one, 3)} for k in rows]


def curve_markdown(curves: dict[str, list[dict]]) -> list[str]:
    """One table: a column per curve, a row per size."""
    names = list(curves)
    rows = sorted({point["rows"] for curve in curves.values() for point in curve})
    lines = ["| rows | " + " | ".join(f"{n}: s (× one row)" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for k in rows:
        cells = []
        for name in names:
            point = next((p for p in curves[name] if p["rows"] == k), None)
            cells.append("–" if point is None else f"{point['seconds']:.3f} ({point['over_one_row']:.2f}×)")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines


def plot_curves(curves: dict[str, list[dict]], out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, curve in curves.items():
        ax.plot([p["rows"] for p in curve], [p["over_one_row"] for p in curve], marker="o", label=name)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set(xlabel="rows in one target pass (drafts verified + 1)", ylabel="cost over a one-row pass",
           title="verify(k): the price of a pass over k rows")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "verify_curve.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
