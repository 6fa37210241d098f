"""An encoder's matrix products in bfloat16, its residual stream and norms in float32 (`encoder_dtype: bfloat16`).

Whisper's encoder is compute-bound: base's runs 87 GFLOP over the 1500 frames of every 30 s window, at the CPU's
fp32 rate, and it is most of a short clip's latency, the same in both columns. A CPU that computes bfloat16 natively
(AVX512-BF16 or AMX: oneDNN multiplies bf16 at twice its fp32 rate) runs it in about 0.6 of the time. The recipe is
autocast's, made once at load instead of at every call: each linear layer of the encoder keeps its weights in
bfloat16 and casts its input to them, so every matrix product and the attention between them run in bfloat16 with
float32 accumulation; the convolutions at the input, the positional embedding, the residual stream, the layer norms
and so the encoder's output stay in float32. GPUs run Whisper in half precision throughout.

The attention between them runs in blocks of query rows (`row_block_attention`): torch's fused CPU attention gains
nothing from bfloat16 here (33 against 32 ms a layer over 1500 frames), while bfloat16 products of 300 rows at a
time, their softmax between, take 23 ms; the encoder as a whole 323 against 382 ms (medians of 6, interleaved).

The decoder stays in float32: it chooses every token, and its verification passes must compute each position as its
one-token steps do. Both columns read the same encoder, so assisted output stays identical to the baseline's; the
transcript itself can differ from an all-float32 encoder's where the model hesitates (README, Results).
Elsewhere (a CPU without native bfloat16, where it would be slower, or a model not in float32 on the CPU) the
encoder is left as it is.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ROW_BLOCK = 300   # query rows a block: 150 337 ms, 300 323 ms, 750 425 ms for base's encoder (fused: 382 ms)
ATTENTION = "assistgen_row_blocks"


class LowPrecisionLinear(nn.Linear):
    """A linear layer whose weights are in a lower precision than the activations around it: its input is cast to
    them, and its output stays in that precision (the residual addition after it promotes back to float32)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x.to(self.weight.dtype), self.weight, self.bias)


def row_block_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention as transformers' interface calls it, ``(batch, heads, rows, head_dim)`` in, ``(batch, rows, heads,
    head_dim)`` out, one block of `ROW_BLOCK` query rows at a time: each block's scores, their softmax and its
    product with the values, so the scores of a block stay in the cache. Masked or dropout attention goes to torch's
    fused attention, as is causal attention (a Whisper encoder's is neither)."""
    if attention_mask is not None or (dropout and module.training) or getattr(module, "is_causal", False):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    batch, heads, rows, dim = query.shape
    q = query.reshape(batch * heads, rows, dim)
    keys_t = key.reshape(batch * heads, -1, dim).transpose(1, 2)
    values = value.reshape(batch * heads, -1, dim)
    out = torch.empty(batch * heads, rows, dim, dtype=query.dtype, device=query.device)
    for start in range(0, rows, ROW_BLOCK):
        scores = torch.bmm(q[:, start:start + ROW_BLOCK], keys_t)
        if scaling is not None and scaling != 1.0:
            scores.mul_(scaling)
        out[:, start:start + ROW_BLOCK] = torch.bmm(torch.softmax(scores, dim=-1), values)
    return out.view(batch, heads, rows, dim).transpose(1, 2), None


AttentionInterface.register(ATTENTION, row_block_attention)


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX tiles)."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):
        return False


def lower_encoder(model: nn.Module, dtype: torch.dtype) -> int:
    """Turn every ``nn.Linear`` of the model's encoder into a LowPrecisionLinear in `dtype`, in place, before its
    layers are packed, and point its attention modules at `row_block_attention` (through a copy of the config, so
    the decoder's attention is untouched); returns how many layers. The parameters keep their names."""
    encoder = model.get_encoder()
    config = copy.copy(model.config)
    config._attn_implementation = ATTENTION
    for module in encoder.modules():
        if hasattr(module, "config") and hasattr(module, "q_proj"):   # an attention module: it reads its config's
            module.config = config                                     # attention at every call
    lowered = 0
    for module in list(encoder.modules()):
        for name, child in list(module.named_children()):
            if type(child) is not nn.Linear:
                continue
            low = LowPrecisionLinear(child.in_features, child.out_features, bias=child.bias is not None,
                                     device="meta")
            low.weight = nn.Parameter(child.weight.detach().to(dtype), requires_grad=False)
            if child.bias is not None:
                low.bias = nn.Parameter(child.bias.detach().to(dtype), requires_grad=False)
            setattr(module, name, low)
            lowered += 1
    return lowered


def applies(model: nn.Module, device: torch.device) -> bool:
    """Whether `encoder_dtype: bfloat16` lowers this model's encoder here: a float32 encoder-decoder on a CPU that
    computes bfloat16 natively."""
    return (device.type == "cpu" and model.config.is_encoder_decoder and next(model.parameters()).dtype == torch.float32
            and native_bfloat16())


def encoder_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype the encoder's linear layers compute in when lowered, else None."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return None
    for module in model.get_encoder().modules():
        if isinstance(module, LowPrecisionLinear):
            return module.weight.dtype
    return None
