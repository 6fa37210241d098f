"""Several linear layers that read the same input as one product: an assistant's query, key and value projections
(`whisper_decoder`, `llama_decoder`), fused once per attention block, and its MLP's gate and up projections
(`llama_decoder`), fused once per MLP."""
from __future__ import annotations

import weakref
from typing import Protocol, Sequence, runtime_checkable

import torch
from torch import nn


@runtime_checkable
class RowFusable(Protocol):
    """A linear layer of its own kind (int8, say) that joins layers of its kind reading the same input into one
    product, each output row still its own weight row's product."""

    def fused(self, others: Sequence["RowFusable"]) -> nn.Module:
        """This layer and `others` as one layer, outputs in that order, side by side."""
        ...


@runtime_checkable
class ProductPart(Protocol):
    """A layer whose outputs are the columns `span` of a larger product, `whole` (layers reading the same input,
    packed as one at load)."""

    whole: nn.Module
    span: tuple[int, int]


def _whole_of(linears: list[nn.Module]) -> nn.Module | None:
    """The product that `linears` are the parts of, in order and without a gap, or None."""
    if not all(isinstance(m, ProductPart) for m in linears) or any(m.whole is not linears[0].whole for m in linears):
        return None
    spans = [m.span for m in linears]
    ends = [0] + [stop for _, stop in spans]
    whole = linears[0].whole
    fits = all(start == end for (start, _), end in zip(spans, ends)) and ends[-1] == whole.out_features
    return whole if fits else None


def fused_linear(linears: list[nn.Module]) -> nn.Module:
    """One product for several linear layers that read the same input, their outputs side by side. Exact: each
    output row is still its own weight row's product (an int8 layer keeps its per-row scales; its input is quantized
    once, as each layer would have quantized it). Layers packed as one product at load are that product."""
    whole = _whole_of(linears)
    if whole is not None:
        return whole
    first = linears[0]
    if isinstance(first, RowFusable) and all(type(m) is type(first) for m in linears):
        return first.fused(linears[1:])
    if all(type(m) is nn.Linear for m in linears):
        weight = torch.cat([m.weight.detach() for m in linears])
        fused = nn.Linear(weight.shape[1], weight.shape[0], bias=True, device=weight.device, dtype=weight.dtype)
        fused.weight.data.copy_(weight)
        fused.bias.data.copy_(torch.cat([m.bias.detach() if m.bias is not None
                                         else torch.zeros(m.out_features, device=weight.device, dtype=weight.dtype)
                                         for m in linears]))
        return fused.requires_grad_(False)
    return _Side(linears)   # other kinds (oneDNN-packed, bitsandbytes): each on its own, outputs side by side


# Each block's fused product, made once per model: fusing int8 layers unpacks and repacks them, which costs more than
# the rest of a step's setup
_FUSED: "weakref.WeakKeyDictionary[nn.Module, nn.Module]" = weakref.WeakKeyDictionary()


def _fused_once(block: nn.Module, names: tuple[str, ...]) -> nn.Module:
    fused = _FUSED.get(block)
    if fused is None:
        fused = _FUSED[block] = fused_linear([getattr(block, name) for name in names])
    return fused


def fused_qkv(attention: nn.Module) -> nn.Module:
    """An attention block's query, key and value projections as one product (`fused_linear`), made once per block."""
    return _fused_once(attention, ("q_proj", "k_proj", "v_proj"))


def fused_gate_up(mlp: nn.Module) -> nn.Module:
    """A gated MLP's gate and up projections as one product (`fused_linear`), gate first, made once per MLP."""
    return _fused_once(mlp, ("gate_proj", "up_proj"))


class _Side(nn.Module):
    def __init__(self, linears: list[nn.Module]):
        super().__init__()
        self.linears = nn.ModuleList(linears)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([m(x) for m in self.linears], dim=-1)
