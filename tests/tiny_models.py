"""Tiny random transformers models, built in-process and seeded, for fast tests."""
from __future__ import annotations

import copy

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM, T5Config,
                          T5ForConditionalGeneration, WhisperConfig, WhisperForCausalLM,
                          WhisperForConditionalGeneration)

VOCAB = 96


def _seeded(build, seed: int):
    torch.manual_seed(seed)
    model = build()
    model.eval()
    model.generation_config.pad_token_id = 0
    return model


def qwen2(seed: int, *, vocab: int = VOCAB, hidden: int = 32, layers: int = 2, init: float = 0.02,
          eos: int | None = None) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=init, bos_token_id=None, eos_token_id=eos, pad_token_id=0,
                         tie_word_embeddings=False)
    return _seeded(lambda: Qwen2ForCausalLM(config), seed)


def gpt2(seed: int, *, layers: int = 2, eos: int | None = None) -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=4, n_positions=256,
                        bos_token_id=None, eos_token_id=eos, pad_token_id=0, initializer_range=0.5)
    return _seeded(lambda: GPT2LMHeadModel(config), seed)


def t5(seed: int, *, layers: int = 2, eos: int | None = None) -> T5ForConditionalGeneration:
    config = T5Config(vocab_size=VOCAB, d_model=32, d_ff=64, d_kv=8, num_layers=layers, num_heads=4,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=eos, initializer_factor=5.0)
    return _seeded(lambda: T5ForConditionalGeneration(config), seed)


def _whisper_config(layers: int, eos: int | None) -> WhisperConfig:
    return WhisperConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=layers,
                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                         num_mel_bins=8, max_source_positions=16, max_target_positions=128,
                         decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=eos,
                         suppress_tokens=None, begin_suppress_tokens=None, init_std=0.5)


def whisper(seed: int, *, layers: int = 2, eos: int | None = None) -> WhisperForConditionalGeneration:
    model = _seeded(lambda: WhisperForConditionalGeneration(_whisper_config(layers, eos)), seed)
    model.generation_config.eos_token_id = eos
    return model


def whisper_decoder_only(seed: int, *, layers: int = 1) -> WhisperForCausalLM:
    """A distil-Whisper style assistant: a decoder that reads the target's encoder outputs."""
    config = _whisper_config(layers, None)
    config.is_encoder_decoder = False
    return _seeded(lambda: WhisperForCausalLM(config), seed)


def perturbed(model, scale: float, seed: int):
    """A copy of `model` with noise on every weight: an assistant that agrees often, not always."""
    torch.manual_seed(seed)
    copy_ = copy.deepcopy(model)
    with torch.no_grad():
        for p in copy_.parameters():
            p.add_(torch.randn_like(p) * scale * p.std().clamp_min(1e-3))
    return copy_


def decoder_inputs(seed: int, length: int = 8) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (1, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def whisper_inputs(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"input_features": torch.randn(1, 8, 32, generator=g),
            "decoder_input_ids": torch.tensor([[1, 5, 7]])}
