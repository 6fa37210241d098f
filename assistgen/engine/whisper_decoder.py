"""Whisper's decoder for an assistant's drafts: the same arithmetic as transformers' modules, without their per-step
overhead.

A draft pass of a small Whisper is overhead more than arithmetic: through transformers' modules most of a decoder step
goes to cache objects, masks built for every step, attention reshapes and output records, not to its int8 matrix
products. Here the step is a plain loop over the layers:

- the self-attention's query, key and value projections are one product (their rows side by side);
- the cross-attention's keys and values are computed once per input, from the encoder's output;
- the self-attention's keys and values live in one buffer per layer, allocated once (each feed says where it starts,
  so rejected drafts are simply written over);
- no mask at all for one new token; an explicit causal mask when several are fed at once.

It only ever runs an assistant: the target's passes stay transformers' own, so nothing here can change a transcript,
only how fast drafts arrive. Tests hold its logits to transformers' on tiny random Whispers of both layouts
(``WhisperForConditionalGeneration`` and distil-Whisper's decoder-only ``WhisperForCausalLM``).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers.modeling_outputs import BaseModelOutput

from .fusing import fused_qkv

# An assistant with its own encoder runs it over a Whisper clip's own frames plus this much, not the 30 s of padding
# around a short clip (whisper.cpp's audio_ctx; `clip_encoder_outputs`): its encoder's cost grows with its length.
# The target decides every token, so this changes how often drafts are accepted, never the transcript.
# `decoding.generate(assistant_audio_margin_s=None)` runs it over the whole window. An assistant that reads the
# target's encoder output attends to all of it, as the target does: cutting it to the clip saved base's int8 decoder
# about 1 ms a draft and 15 ms at its start, but where the model hesitates (other languages, synthetic voices) its
# drafts then agreed far less often (docs/history.md).
AUDIO_MARGIN_S = 2.0


def supports(model) -> bool:
    """Whether `model` is a Whisper whose decoder this module runs."""
    decoder = getattr(getattr(model, "model", None), "decoder", None)
    return (getattr(model.config, "model_type", None) == "whisper" and decoder is not None
            and hasattr(model, "proj_out") and getattr(model.config, "activation_function", "gelu") == "gelu")


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(1, tokens, heads × dim) -> (1, heads, tokens, dim), a view."""
    return x.view(1, x.shape[-2], heads, x.shape[-1] // heads).transpose(1, 2)


def _norm(norm: nn.LayerNorm):
    """A layer norm as a plain function: a draft pass calls 19 of them, and a module's call costs more than a
    function's."""
    weight, bias, shape, eps = norm.weight, norm.bias, norm.normalized_shape, norm.eps
    return lambda x: F.layer_norm(x, shape, weight, bias, eps)


class _Layer:
    """One decoder layer's products (each module's own forward, without the module call around it), its norms, its
    cross-attention keys and values, and its self-attention cache."""

    def __init__(self, layer, encoder_hidden: torch.Tensor, heads: int, max_length: int):
        attn, cross = layer.self_attn, layer.encoder_attn
        self.qkv = fused_qkv(attn).forward
        self.self_out = attn.out_proj.forward
        self.cross_q, self.cross_out = cross.q_proj.forward, cross.out_proj.forward
        self.fc1, self.fc2 = layer.fc1.forward, layer.fc2.forward
        self.self_norm, self.cross_norm = _norm(layer.self_attn_layer_norm), _norm(layer.encoder_attn_layer_norm)
        self.final_norm = _norm(layer.final_layer_norm)
        self.scaling = attn.scaling
        head_dim = encoder_hidden.shape[-1] // heads
        keys = _split_heads(cross.k_proj(encoder_hidden), heads)
        self.cross_keys_t = keys.transpose(2, 3).contiguous()   # (1, heads, dim, frames)
        self.cross_values = _split_heads(cross.v_proj(encoder_hidden), heads).contiguous()
        self.keys = encoder_hidden.new_empty(1, heads, max_length, head_dim)
        self.values = encoder_hidden.new_empty(1, heads, max_length, head_dim)


class WhisperDecoderStep:
    """Logits for new decoder tokens of one Whisper model reading one encoder output, with its own KV cache.

    `logits(new, start, keep)`: `new` (a list of token ids) continues the first `start` tokens already fed (anything
    the cache held beyond `start` is dropped); returns the logits ``(keep, vocab)`` after each of the last `keep`.
    """

    @torch.inference_mode()
    def __init__(self, model, encoder_hidden: torch.Tensor):
        decoder = model.model.decoder
        config = model.config
        self.heads = config.decoder_attention_heads
        self.max_length = config.max_target_positions
        encoder_hidden = encoder_hidden.to(model.device, model.dtype)
        if encoder_hidden.dim() == 2:
            encoder_hidden = encoder_hidden.unsqueeze(0)
        self.device = model.device
        self.embed = decoder.embed_tokens
        self.positions = decoder.embed_positions.weight
        self.final_norm = _norm(decoder.layer_norm)
        self.proj_out = model.proj_out.forward
        self.layers = [_Layer(layer, encoder_hidden, self.heads, self.max_length) for layer in decoder.layers]

    @torch.inference_mode()
    def logits(self, new: list[int], start: int, keep: int = 1) -> torch.Tensor:
        n = len(new)
        end = start + n
        if end > self.max_length:
            raise ValueError(f"Whisper's decoder reads at most {self.max_length} tokens, got {end}")
        ids = torch.tensor([new], dtype=torch.long, device=self.device)
        hidden = self.embed(ids) + self.positions[start:end]
        mask = None
        if n > 1:   # row i sees the cache and new tokens up to its own
            mask = torch.ones(n, end, dtype=torch.bool, device=self.device).tril(diagonal=start)
        for layer in self.layers:
            hidden = hidden + self._self_attention(layer, hidden, start, end, mask)
            hidden = hidden + self._cross_attention(layer, hidden)
            hidden = hidden + layer.fc2(F.gelu(layer.fc1(layer.final_norm(hidden))))
        return self.proj_out(self.final_norm(hidden[0, n - keep:])).float()

    def _self_attention(self, layer: _Layer, hidden, start: int, end: int, mask) -> torch.Tensor:
        q, k, v = layer.qkv(layer.self_norm(hidden)).chunk(3, dim=-1)
        q = _split_heads(q * layer.scaling, self.heads)
        layer.keys[:, :, start:end] = _split_heads(k, self.heads)
        layer.values[:, :, start:end] = _split_heads(v, self.heads)
        out = F.scaled_dot_product_attention(q, layer.keys[:, :, :end], layer.values[:, :, :end], attn_mask=mask,
                                             scale=1.0)
        return layer.self_out(out.transpose(1, 2).reshape(hidden.shape))

    def _cross_attention(self, layer: _Layer, hidden) -> torch.Tensor:
        q = _split_heads(layer.cross_q(layer.cross_norm(hidden)) * layer.scaling, self.heads)
        # one query against every frame: two batched products (keys stored transposed) are faster than SDPA here,
        # whose kernel is built for many queries
        weights = torch.matmul(q, layer.cross_keys_t).softmax(dim=-1)
        out = torch.matmul(weights, layer.cross_values)
        return layer.cross_out(out.transpose(1, 2).reshape(hidden.shape))


# --- an assistant's view of the clip -----------------------------------------------------------------------------

def clip_encoder_outputs(model, features: torch.Tensor, frames: int, margin_s: float) -> BaseModelOutput:
    """A Whisper encoder's output over the first `frames` mel frames (100 a second) plus `margin_s`, not the whole
    30 s window: the positional embedding is sliced to match. The encoder's cost grows with its length, and a clip of
    5 s pads to 30. Only an assistant may read its input so: the target decides every token, so the assistant's
    encoder changes how often its drafts are accepted, never the transcript."""
    encoder = model.get_encoder()
    length = min(features.shape[-1], frames + round(100 * margin_s))
    length += length % 2   # the second convolution halves it
    hidden = F.gelu(encoder.conv1(features[..., :length].to(model.device, model.dtype)))
    hidden = F.gelu(encoder.conv2(hidden)).permute(0, 2, 1)
    hidden = hidden + encoder.embed_positions.weight[:hidden.shape[1]]
    for layer in encoder.layers:
        hidden = layer(hidden, None)
    return BaseModelOutput(last_hidden_state=encoder.layer_norm(hidden))


def assistant_encoder_outputs(assistant_model, inputs: dict, margin_s: float | None) -> BaseModelOutput | None:
    """A Whisper assistant's own encoder output over the clip plus `margin_s` (`clip_encoder_outputs`); None where
    the inputs do not say which frames are the clip's, or `margin_s` is None: the assistant's encoder then reads the
    whole window."""
    frames = inputs.get("attention_mask")
    if "input_features" not in inputs or frames is None or margin_s is None:
        return None
    return clip_encoder_outputs(assistant_model, inputs["input_features"], int(frames.sum()), margin_s)


def check_features(assistant_model, inputs: dict) -> None:
    """ValueError when a Whisper assistant expects other log-mel features than the target's inputs hold."""
    features = inputs.get("input_features")
    if features is not None and assistant_model.config.num_mel_bins != features.shape[1]:
        raise ValueError("the assistant expects other audio features than the target "
                         f"({assistant_model.config.num_mel_bins} vs {features.shape[1]} mel bins)")


def prefix_tokens_unknown_to(assistant_model, model) -> set[str]:
    """The special tokens of the target's forced prefix that an English-only Whisper assistant has none of: the
    language and task tokens (empty for any other assistant)."""
    if getattr(assistant_model.generation_config, "is_multilingual", True):
        return set()
    languages = getattr(model.generation_config, "lang_to_id", None) or {}
    return set(languages) | {"<|transcribe|>", "<|translate|>"}
