"""The lean Llama-style decoder that drafts for a text assistant computes what transformers' modules compute."""
import pytest
import torch

import helpers as tm
from assistgen.engine import llama_decoder, static_steps
from assistgen.engine.decoding import generate
from assistgen.engine.kv import CachedDecoder
from assistgen.engine.llama_decoder import LlamaDecoderStep, supports
from assistgen.models import quantized

# (tokens, keep): a prompt at once, then one token at a time, a rewind of three tokens with six fed at once, and
# another continuation from the third token (the buffers' later entries are overwritten)
CALLS = [([1, 5, 7], 3), ([1, 5, 7, 9], 1), ([1, 5, 7, 9, 11], 1), ([1, 5, 7, 9, 11, 13], 1),
         ([1, 5, 7, 9, 11, 13, 15], 1), ([1, 5, 7, 9, 11, 13, 15, 17, 19, 21], 6), ([1, 5, 7, 30, 31], 2)]


def _uncached_logits(model, tokens):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens], device=tm.DEVICE)).logits[0].float()


@pytest.mark.parametrize("family", ["qwen2", "llama", pytest.param("qwen2-int8", marks=tm.CPU_ONLY)])
def test_logits_match_transformers_call_for_call_and_the_buffers_grow(family, monkeypatch):
    monkeypatch.setattr(llama_decoder, "FIRST_CAPACITY", 4)   # so the calls below grow the buffers twice
    monkeypatch.setattr(static_steps, "use_static_steps", lambda model: False)   # on a GPU: the lean step all the same
    model = tm.llama(3) if family == "llama" else tm.qwen2(3)
    if family == "qwen2-int8":
        quantized.quantize(model)
    reference = CachedDecoder(model, tm.decoder_inputs(3), prefix_length=3)
    lean = CachedDecoder(model, tm.decoder_inputs(3), prefix_length=3, assistant=True)
    assert isinstance(lean._step, LlamaDecoderStep) and reference._step is None
    for tokens, keep in CALLS:
        expected = reference.logits(tokens, keep)
        assert torch.allclose(lean.logits(tokens, keep), expected, atol=1e-5, rtol=1e-5), (tokens, keep)
        if family != "qwen2-int8":   # int8 inputs are quantized over the rows fed together, so only call for call
            assert torch.allclose(expected, _uncached_logits(model, tokens)[-keep:], atol=1e-5, rtol=1e-5)
    assert lean._step.layers[0].keys.shape[2] == 16
    assert lean.passes == reference.passes == len(CALLS)


@tm.CPU_ONLY
def test_an_int8_model_gives_its_own_modules_logits_not_the_float_ones():
    model = tm.qwen2(3, init=0.2)
    tokens = [1, 5, 7, 9]
    float_logits = _uncached_logits(model, tokens)
    quantized.quantize(model)
    got = LlamaDecoderStep(model).logits(tokens, 0, keep=4)
    assert torch.allclose(got, _uncached_logits(model, tokens), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, float_logits, atol=1e-3, rtol=1e-3)


def test_which_models_it_runs():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    assert supports(tm.qwen2(0)) and supports(tm.llama(0))
    assert not supports(tm.gpt2(0)) and not supports(tm.whisper(0)) and not supports(tm.t5(0))
    sliding = Qwen2Config(vocab_size=tm.VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                          max_window_layers=0)
    assert not supports(Qwen2ForCausalLM(sliding))


def test_past_the_models_positions_is_a_clear_error():
    with pytest.raises(ValueError, match="at most 256 tokens"):
        LlamaDecoderStep(tm.qwen2(0)).logits([1] * 257, 0)


def test_only_an_assistant_drafts_through_it_and_assisted_output_is_the_baseline():
    target = tm.qwen2(0, layers=3)
    inputs = tm.decoder_inputs(0)
    assert CachedDecoder(target, inputs, prefix_length=8)._step is None
    baseline = generate(target, inputs, max_new_tokens=24)
    own = generate(target, inputs, assistant_model=target, max_new_tokens=24)
    assert own.new_tokens == baseline.new_tokens
    assert own.acceptance_rate == 1.0   # the target's own layers, run lean, draft exactly what it then keeps
    other = generate(target, inputs, assistant_model=tm.qwen2(2), max_new_tokens=24)
    assert other.new_tokens == baseline.new_tokens and other.assistant_passes > 0
