"""Whisper's decoder for an assistant's drafts: the same arithmetic as transformers' modules, without their per-step
overhead.

A draft pass of a small Whisper is overhead more than arithmetic: through transformers' modules most of a decoder step
goes to cache objects, masks built for every step, attention reshapes and output records, not to its int8 matrix
products. Here the step is a plain loop over the layers:

- the self-attention's query, key and value projections are one product (their rows side by side);
- the cross-attention's keys and values are computed once per input, from the encoder's output, or taken from the
  target's where the assistant's projections give them (base's own decoder in int8 does);
- the self-attention's keys and values live in one buffer per layer, allocated once (each feed says where it starts,
  so rejected drafts are simply written over);
- no mask at all for one new token; an explicit causal mask when several are fed at once.

It only ever runs an assistant: the target's passes stay transformers' own, so nothing here can change a transcript,
only how fast drafts arrive. For a Whisper target it computes the cross-attention keys and values once, with the
target's own modules and operations, and starts the target's cache with them (`cross_key_values`,
`prefilled_cache`): the first pass then reads them instead of computing and copying them, bit for bit the same.
Tests hold its logits to transformers' on tiny random Whispers of both layouts (``WhisperForConditionalGeneration``
and distil-Whisper's decoder-only ``WhisperForCausalLM``).
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F
from transformers import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from .fusing import fused_qkv

# An assistant with its own encoder runs it over a Whisper clip's own frames plus this much, not the 30 s of padding
# around a short clip (whisper.cpp's audio_ctx; `clip_encoder_outputs`): its encoder's cost grows with its length.
# The target decides every token, so this changes how often drafts are accepted, never the transcript.
# `decoding.draft_source(audio_margin_s=None)` runs it over the whole window. An assistant that reads the
# target's encoder output attends to all of it, as the target does: cutting it to the clip saved base's int8 decoder
# about 1 ms a draft and 15 ms at its start, but where the model hesitates (other languages, synthetic voices) its
# drafts then agreed far less often (docs/history.md).
AUDIO_MARGIN_S = 2.0
# An assistant takes the target's cross-attention keys and values as its own where its projections give them to within
# this share (relative, over the first `_PROBE_FRAMES` frames): an int8 copy of the target's projections differs by
# about 1 %, a decoder trained apart (distil-Whisper's) by about as much as the values themselves
SAME_PROJECTION_TOLERANCE = 0.05
_PROBE_FRAMES = 16

KeyValues = list[tuple[torch.Tensor, torch.Tensor]]   # per decoder layer: keys and values, (1, heads, frames, dim)


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


def cross_key_values(model, encoder_hidden: torch.Tensor) -> KeyValues:
    """A Whisper target's cross-attention keys and values over its encoder output, computed as transformers'
    `WhisperAttention` computes them at its first pass (the same modules, the same operations), once per input."""
    heads = model.config.decoder_attention_heads
    out = []
    for layer in model.model.decoder.layers:
        cross = layer.encoder_attn
        shape = (encoder_hidden.shape[0], -1, heads, cross.head_dim)
        out.append((cross.k_proj(encoder_hidden).view(shape).transpose(1, 2).contiguous(),
                    cross.v_proj(encoder_hidden).view(shape).transpose(1, 2).contiguous()))
    return out


def prefilled_cache(model, key_values: KeyValues) -> EncoderDecoderCache:
    """A cache for a Whisper model's decoder that already holds its cross-attention keys and values: its first pass
    reads them as every later pass does, instead of computing them and copying them into the cache."""
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = config.decoder_layers   # as WhisperDecoder builds its own cache
    cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    for i, (keys, values) in enumerate(key_values):
        layer = cache.cross_attention_cache.layers[i]
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        cache.is_updated[i] = True
    return cache


def _same_projection(cross, encoder_hidden: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     heads: int) -> bool:
    """Whether an assistant layer's cross-attention projections give the target's `keys` and `values` (to within
    SAME_PROJECTION_TOLERANCE) on the first frames of the encoder output both were computed from."""
    probe = encoder_hidden[:, :_PROBE_FRAMES]
    for proj, theirs in ((cross.k_proj, keys), (cross.v_proj, values)):
        if theirs.shape[1] != heads or theirs.shape[2] != encoder_hidden.shape[1]:
            return False
        ours = _split_heads(proj(probe), heads)
        reference = theirs[:, :, :probe.shape[1]].to(ours.dtype)
        if ours.shape != reference.shape or (ours - reference).norm() > SAME_PROJECTION_TOLERANCE * reference.norm():
            return False
    return True


class _Layer:
    """One decoder layer's products (each module's own forward, without the module call around it), its norms, its
    cross-attention keys and values, and its self-attention cache."""

    def __init__(self, layer, encoder_hidden: torch.Tensor, heads: int, max_length: int,
                 target_key_values: tuple[torch.Tensor, torch.Tensor] | None = None):
        attn, cross = layer.self_attn, layer.encoder_attn
        self.qkv = fused_qkv(attn).forward
        self.self_out = attn.out_proj.forward
        self.cross_q, self.cross_out = cross.q_proj.forward, cross.out_proj.forward
        self.fc1, self.fc2 = layer.fc1.forward, layer.fc2.forward
        self.self_norm, self.cross_norm = _norm(layer.self_attn_layer_norm), _norm(layer.encoder_attn_layer_norm)
        self.final_norm = _norm(layer.final_layer_norm)
        self.scaling = attn.scaling
        head_dim = encoder_hidden.shape[-1] // heads
        self.shares_target = (target_key_values is not None
                              and _same_projection(cross, encoder_hidden, *target_key_values, heads))
        if self.shares_target:   # the target's own, already computed
            keys, self.cross_values = target_key_values
        else:
            keys = _split_heads(cross.k_proj(encoder_hidden), heads)
            self.cross_values = _split_heads(cross.v_proj(encoder_hidden), heads).contiguous()
        # (1, heads, dim, frames), laid out so: a transposed view would cost each draft pass 0.1 ms a layer
        self.cross_keys_t = keys.transpose(2, 3).contiguous()
        self.keys = encoder_hidden.new_empty(1, heads, max_length, head_dim)
        self.values = encoder_hidden.new_empty(1, heads, max_length, head_dim)


class WhisperDecoderStep:
    """Logits for new decoder tokens of one Whisper model reading one encoder output, with its own KV cache.

    `logits(new, start, keep)`: `new` (a list of token ids) continues the first `start` tokens already fed (anything
    the cache held beyond `start` is dropped); returns the logits ``(keep, vocab)`` after each of the last `keep`.

    `target_key_values`: the target's cross-attention keys and values over the same encoder output
    (`cross_key_values`). A layer whose projections give them (an int8 copy of the target's decoder) takes them as its
    own, which saves its products over every frame at each input's start.
    """

    @torch.inference_mode()
    def __init__(self, model, encoder_hidden: torch.Tensor, target_key_values: KeyValues | None = None):
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
        shared = (target_key_values if target_key_values is not None and len(target_key_values) == len(decoder.layers)
                  else [None] * len(decoder.layers))
        self.layers = [_Layer(layer, encoder_hidden, self.heads, self.max_length, kv)
                       for layer, kv in zip(decoder.layers, shared)]

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

@torch.inference_mode()
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
