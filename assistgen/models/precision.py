"""A Whisper encoder's matrix products in bfloat16, its residual stream and norms in float32
(`encoder_dtype: bfloat16` in models.yaml).

Whisper's encoder runs the same work over the 1500 frames of every 30 s window, however short the clip; it is
compute-bound at the CPU's float32 rate and is most of a short clip's latency, the same in both columns. A CPU that
multiplies bfloat16 in hardware does those products at twice the rate. The recipe is autocast's, made once at load:
each linear layer of the encoder keeps its weights in bfloat16 and casts its input to them, so every product and the
attention between them run in bfloat16 with float32 accumulation; the first convolution (over the mel features), the
positional embedding, the residual stream, the layer norms and so the encoder's output stay in float32. The attention
runs in blocks of query rows (`row_block_attention`), where torch's fused CPU attention gains nothing from bfloat16.
Two more products read only encoder-side data over all 1500 frames and run in bfloat16 too, their outputs in float32:
the second convolution, and the decoder's cross-attention key and value projections, made once per input (for base,
12.6 and 44 ms a window in float32, 7.3 and 29 in bfloat16).

The decoder's passes stay in float32: they choose every token, and a verification pass must compute each position as
the one-token steps do (the cross-attention keys and values are the same for every pass and position). Both columns
read the same encoder, so assisted output stays identical to the baseline's; the transcript itself can differ from
an all-float32 encoder's where the model hesitates. Figures: docs/results.md (the default speech pair) and
bench/results/whisper-bf16-encoder.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .catalog import ModelSpec
from .cpu import native_bfloat16
from .devices import torch_dtype

ROW_BLOCK = 300   # query rows a block, the fastest of 150, 300 and 750 for Whisper base over 1500 frames (docs/history.md)
ATTENTION = "assistgen_row_blocks"


class LowPrecisionLinear(nn.Linear):
    """A linear layer whose weights are in a lower precision than the activations around it: its input is cast to
    them, and its output stays in that precision (the residual addition after it promotes back to float32)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x.to(self.weight.dtype), self.weight, self.bias)


class EncoderSideLinear(LowPrecisionLinear):
    """A decoder's cross-attention key or value projection, which reads only the encoder's output, computed in the
    lower precision like the encoder's own products, its output returned in the input's precision: the keys and
    values are made once per input, and every decoder pass then attends to them in float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).to(x.dtype)


class LowPrecisionConv1d(nn.Conv1d):
    """A convolution whose weights are in a lower precision: its input is cast to them, its output back to the
    input's precision."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)


def row_block_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention as transformers' interface calls it, ``(batch, heads, rows, head_dim)`` in, ``(batch, rows, heads,
    head_dim)`` out, one block of `ROW_BLOCK` query rows at a time: each block's scores, their softmax and its
    product with the values, so the scores of a block stay in the cache. Whatever a Whisper encoder never asks for
    (a mask, dropout, causal attention, grouped key/value heads, the attention weights) goes to torch's fused
    attention."""
    if (attention_mask is not None or (dropout and module.training) or getattr(module, "is_causal", False)
            or key.shape[1] != query.shape[1] or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    batch, heads, rows, dim = query.shape
    scaling = dim ** -0.5 if scaling is None else scaling
    q = query.reshape(batch * heads, rows, dim)
    keys_t = key.reshape(batch * heads, -1, dim).transpose(1, 2)
    values = value.reshape(batch * heads, -1, dim)
    out = torch.empty(batch * heads, rows, dim, dtype=query.dtype, device=query.device)
    for start in range(0, rows, ROW_BLOCK):
        scores = torch.bmm(q[:, start:start + ROW_BLOCK], keys_t)
        if scaling != 1.0:
            scores.mul_(scaling)
        out[:, start:start + ROW_BLOCK] = torch.bmm(torch.softmax(scores, dim=-1), values)
    return out.view(batch, heads, rows, dim).transpose(1, 2), None


AttentionInterface.register(ATTENTION, row_block_attention)


def encoder_dtype_refusal(spec: ModelSpec, model: nn.Module) -> str | None:
    """Why `spec.encoder_dtype` cannot apply to this model at all (a LoadError's message), or None."""
    model_type = getattr(model.config, "model_type", None) or "another kind"
    if model_type != "whisper" or not model.config.is_encoder_decoder:
        return (f"{spec.name}: encoder_dtype applies to a Whisper model with its encoder; this one is {model_type}, "
                "so remove encoder_dtype from its entry in models.yaml")
    return None


def lowers_here(model: nn.Module, device: torch.device) -> bool:
    """Whether the encoder is cast on this machine: a float32 model wholly in memory on a CPU that multiplies
    bfloat16 in hardware. Elsewhere it is left as it is (on a GPU a model's dtype says its precision; emulated
    bfloat16 is slower than float32). The catalog already refuses it with quantization or a device map."""
    return (device.type == "cpu" and next(model.parameters()).dtype == torch.float32
            and not getattr(model, "hf_device_map", None) and native_bfloat16())


def _lowered(low: nn.Module, original: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`low`, made on the meta device with `original`'s shape, given `original`'s weight and bias in `dtype`."""
    low.weight = nn.Parameter(original.weight.detach().to(dtype), requires_grad=False)
    if original.bias is not None:
        low.bias = nn.Parameter(original.bias.detach().to(dtype), requires_grad=False)
    return low


def _lowered_linear(linear: nn.Linear, dtype: torch.dtype, kind: type[LowPrecisionLinear]) -> LowPrecisionLinear:
    return _lowered(kind(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta"),
                    linear, dtype)


def _lowered_conv(conv: nn.Conv1d, dtype: torch.dtype) -> LowPrecisionConv1d:
    return _lowered(LowPrecisionConv1d(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                                       padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                                       bias=conv.bias is not None, device="meta"), conv, dtype)


def cast_encoder(model: nn.Module, dtype: torch.dtype) -> int:
    """Turn every ``nn.Linear`` of the model's encoder into a LowPrecisionLinear in `dtype`, in place, before its
    layers are packed, and point its attention modules at `row_block_attention` (through a copy of the config, so
    the decoder's attention is untouched). The encoder's second convolution (the first reads the mel features) and
    the decoder's cross-attention key and value projections (which read only the encoder's output, once per input)
    compute in `dtype` too, their outputs in float32 (`LowPrecisionConv1d`, `EncoderSideLinear`). Returns how many
    linear layers were cast, the decoder's included. The parameters keep their names."""
    encoder = model.get_encoder()
    config = copy.copy(model.config)
    config._attn_implementation = ATTENTION
    for module in encoder.modules():
        if hasattr(module, "config") and hasattr(module, "q_proj"):   # an attention module: it reads its config's
            module.config = config                                     # attention at every call
    cast = 0
    for module in list(encoder.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, _lowered_linear(child, dtype, LowPrecisionLinear))
                cast += 1
    if type(getattr(encoder, "conv2", None)) is nn.Conv1d:
        encoder.conv2 = _lowered_conv(encoder.conv2, dtype)
    for layer in getattr(model.model.decoder, "layers", []):
        cross = layer.encoder_attn
        for name in ("k_proj", "v_proj"):
            if type(getattr(cross, name)) is nn.Linear:
                setattr(cross, name, _lowered_linear(getattr(cross, name), dtype, EncoderSideLinear))
                cast += 1
    return cast


def apply_encoder_dtype(spec: ModelSpec, model: nn.Module, device: torch.device) -> str | None:
    """What `encoder_dtype` in the model's catalog entry does at load: nothing when unset; the encoder cast where
    applies here (`lowers_here`); a LoadError's message, returned, when it cannot apply to this kind of model."""
    if not spec.encoder_dtype:
        return None
    refusal = encoder_dtype_refusal(spec, model)
    if refusal is None and lowers_here(model, device):
        cast_encoder(model, torch_dtype(spec.encoder_dtype, device))
    return refusal


def encoder_dtype(model) -> torch.dtype | None:
    """The dtype the encoder's linear layers compute in when cast, else None."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return None
    for module in model.get_encoder().modules():
        if isinstance(module, LowPrecisionLinear):
            return module.weight.dtype
    return None

