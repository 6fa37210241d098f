"""Whose encoder output an encoder-decoder target's assistant reads: the target's, or its own.

The target's encoder output is only the right input for a decoder that was trained on it: a decoder-only assistant
(distil-Whisper's decoder, or a Whisper model's own decoder loaded alone), or an assistant whose encoder is the
target's (the same shapes and the same weights). Any other assistant runs its own encoder: its cross-attention
expects its own width (flan-t5-small's 512 against flan-t5-large's 1024) and its own representation.
"""
from __future__ import annotations

import weakref

import torch
from torch import nn

from . import whisper_decoder

# assistant encoder -> (the target encoder it was compared with, whether they are equal): compared once per pair
_verdicts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_dense() if tensor.is_mkldnn else tensor   # a linear weight packed in oneDNN's layout


def module_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by name, the non-persistent ones too (a packed linear keeps its weight in one)."""
    return {**dict(module.named_parameters()), **{n: b for n, b in module.named_buffers() if b is not None}}


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Whether two sets of named tensors have the same names, shapes and values (compared in `a`'s dtype and on its
    device)."""
    if a.keys() != b.keys() or any(a[n].shape != b[n].shape for n in a):
        return False
    return all(x is y or torch.equal(_dense(x), _dense(y).to(x.device, x.dtype)) for x, y in ((a[n], b[n]) for n in a))


def same_encoder(target_encoder: nn.Module, assistant_encoder: nn.Module) -> bool:
    """Whether two encoders are one: the same module, or the same shapes and weights (compared once per pair)."""
    if target_encoder is assistant_encoder:
        return True
    seen = _verdicts.get(assistant_encoder)
    if seen is not None and seen[0]() is target_encoder:
        return seen[1]
    equal = same_tensors(module_tensors(target_encoder), module_tensors(assistant_encoder))
    _verdicts[assistant_encoder] = (weakref.ref(target_encoder), equal)
    return equal


def reads_target_encoder(model, assistant_model) -> bool:
    """Whether `assistant_model` drafts from the encoder output of `model` (an encoder-decoder target): when it has
    no encoder of its own, or its encoder is the target's."""
    if not model.config.is_encoder_decoder:
        return False
    if not assistant_model.config.is_encoder_decoder:
        return True
    return same_encoder(model.get_encoder(), assistant_model.get_encoder())


def assistant_encoder_outputs(model, assistant_model, inputs: dict, target_outputs,
                              audio_margin_s: float | None = whisper_decoder.AUDIO_MARGIN_S):
    """The encoder output an assistant of the same vocabulary reads: the target's where it may
    (`reads_target_encoder`); else None, for the assistant to run its own encoder on the inputs, except a Whisper
    one, whose encoder runs here over the clip's own frames plus `audio_margin_s` only
    (`whisper_decoder.assistant_encoder_outputs`)."""
    if target_outputs is None or reads_target_encoder(model, assistant_model):
        return target_outputs
    if "input_features" not in inputs:
        return None
    whisper_decoder.check_features(assistant_model, inputs)
    return whisper_decoder.assistant_encoder_outputs(assistant_model, inputs, audio_margin_s)
