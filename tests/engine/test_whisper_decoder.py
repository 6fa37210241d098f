"""The lean Whisper decoder that drafts for an assistant computes what transformers' modules compute."""
import pytest
import torch
from torch import nn

import helpers as tm
from assistgen.engine.decoding import generate
from assistgen.engine.kv import CachedDecoder
from assistgen.models import quantized
from assistgen.engine.fusing import fused_linear
from assistgen.engine import whisper_decoder
from assistgen.engine.whisper_decoder import WhisperDecoderStep, supports


def _transformers_logits(model, encoder_hidden, tokens):
    """Every position's logits from one uncached transformers pass."""
    with torch.inference_mode():
        if model.config.is_encoder_decoder:
            out = model(encoder_outputs=(encoder_hidden,), decoder_input_ids=torch.tensor([tokens], device=tm.DEVICE))
        else:
            out = model(input_ids=torch.tensor([tokens], device=tm.DEVICE), encoder_outputs=(encoder_hidden,))
    return out.logits[0].float()


def _encoder_hidden(seed: int) -> torch.Tensor:
    with torch.inference_mode():
        return tm.whisper(seed).get_encoder()(tm.whisper_inputs(seed)["input_features"]).last_hidden_state


def _pair_of_decoders(model, hidden):
    """The same model behind transformers' modules and behind the lean decoder, both with their own KV cache."""
    from transformers.modeling_outputs import BaseModelOutput
    outputs = BaseModelOutput(last_hidden_state=hidden)
    return (CachedDecoder(model, {}, prefix_length=1, encoder_outputs=outputs),
            CachedDecoder(model, {}, prefix_length=1, encoder_outputs=outputs, assistant=True))


# (tokens, keep): a prefix at once, then one token at a time, a rewind of three tokens with six fed at once, and
# another continuation from the third token (the cache's later entries are overwritten)
CALLS = [([1, 5, 7], 3), ([1, 5, 7, 9], 1), ([1, 5, 7, 9, 11], 1), ([1, 5, 7, 9, 11, 13], 1),
         ([1, 5, 7, 9, 11, 13, 15], 1), ([1, 5, 7, 9, 11, 13, 15, 17, 19, 21], 6), ([1, 5, 7, 30, 31], 2)]


@pytest.mark.parametrize("layout", ["encoder-decoder", "decoder-only", pytest.param("int8", marks=tm.CPU_ONLY)])
def test_logits_match_transformers_call_for_call(layout):
    model = tm.whisper_decoder_only(3, layers=2) if layout == "decoder-only" else tm.whisper(3)
    if layout == "int8":
        quantized.quantize(model)
    hidden = _encoder_hidden(3)
    reference, lean = _pair_of_decoders(model, hidden)
    assert lean._step is not None and reference._step is None
    for tokens, keep in CALLS:
        expected = reference.logits(tokens, keep)
        assert torch.allclose(lean.logits(tokens, keep), expected, atol=1e-4, rtol=1e-4), (tokens, keep)
        if layout != "int8":   # int8 inputs are quantized over the rows fed together, so only call for call
            assert torch.allclose(expected, _transformers_logits(model, hidden, tokens)[-keep:], atol=1e-4,
                                  rtol=1e-4)
    assert lean.passes == reference.passes == len(CALLS)


@tm.CPU_ONLY
def test_an_int8_model_gives_the_same_logits_as_its_own_transformers_modules_not_just_the_float_ones():
    """The int8 check above is not lenient: int8 logits differ from the float model's by far more than its
    tolerance, so matching the quantized modules means computing with them."""
    model = tm.whisper(3)
    hidden = _encoder_hidden(3)
    tokens = [1, 5, 7, 9]
    float_logits = _transformers_logits(model, hidden, tokens)
    quantized.quantize(model)
    got = WhisperDecoderStep(model, hidden).logits(tokens, 0, keep=4)
    assert torch.allclose(got, _transformers_logits(model, hidden, tokens), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(got, float_logits, atol=1e-3, rtol=1e-3)


def test_past_the_models_positions_is_a_clear_error():
    step = WhisperDecoderStep(tm.whisper(0), _encoder_hidden(0))
    with pytest.raises(ValueError, match="at most 128 tokens"):
        step.logits([1] * 129, 0)


@pytest.mark.parametrize("kind", ["float", "int8"])
def test_fused_projections_give_each_layers_own_outputs(kind):
    torch.manual_seed(0)
    layers = [nn.Linear(16, 8, bias=False), nn.Linear(16, 8), nn.Linear(16, 4)]
    if kind == "int8":
        layers = [quantized.Int8Linear(*quantized.quantize_weight(m.weight.detach()),
                                       None if m.bias is None else m.bias.detach()) for m in layers]
    x = torch.randn(3, 16)
    with torch.inference_mode():
        fused = fused_linear(layers)(x)
        assert torch.equal(fused, torch.cat([m(x) for m in layers], dim=-1))


def test_only_an_assistant_drafts_through_it_and_assisted_whisper_keeps_the_transcript():
    target, assistant = tm.whisper(0), tm.whisper(1, layers=1)
    inputs = tm.whisper_inputs(0)
    assert supports(assistant) and not supports(tm.qwen2(0))
    assert CachedDecoder(target, inputs, prefix_length=3)._step is None
    assert CachedDecoder(assistant, inputs, prefix_length=3, assistant=True)._step is not None
    baseline = generate(target, inputs, max_new_tokens=20)
    assisted = generate(target, inputs, assistant_model=target, max_new_tokens=20)
    assert assisted.new_tokens == baseline.new_tokens
    assert assisted.acceptance_rate == 1.0   # the target's own decoder, run lean, drafts exactly what it then keeps


def test_an_assistant_reading_the_targets_encoder_attends_to_the_whole_window_as_the_target_does():
    target = tm.whisper(0)
    frames = torch.zeros(1, 32, dtype=torch.long)
    frames[:, :12] = 1   # the clip's own mel frames; the rest is padding
    inputs = {**tm.whisper_inputs(0), "attention_mask": frames}
    decoder = CachedDecoder(target, inputs, prefix_length=3, assistant=True)
    assert decoder._step.layers[0].cross_values.shape[2] == 16   # every position of the encoder's output
    baseline = generate(target, inputs, max_new_tokens=20)
    # the target's own decoder, reading the target's encoder output even with a small margin asked for: the same
    # view as the target's, so it drafts exactly what the target keeps
    assisted = generate(target, inputs, assistant_model=target, max_new_tokens=20, assistant_audio_margin_s=0.02)
    assert assisted.new_tokens == baseline.new_tokens and assisted.assistant_passes > 0
    assert assisted.acceptance_rate == 1.0


def test_a_whisper_targets_prefilled_cache_gives_its_own_first_pass_logits_bit_for_bit():
    """The target's cross-attention keys and values, computed once before its first pass and handed to its cache,
    are the very ones its first pass would compute: every logit after is the same, bit for bit."""
    from transformers.modeling_outputs import BaseModelOutput
    model = tm.whisper(3)
    outputs = BaseModelOutput(last_hidden_state=_encoder_hidden(3))
    prefilled = CachedDecoder(model, {}, prefix_length=1, encoder_outputs=outputs)
    assert prefilled.cross_key_values is not None and prefilled._cache is not None
    own = CachedDecoder(model, {}, prefix_length=1, encoder_outputs=outputs)
    own.cross_key_values = own._cache = None   # transformers computes them at the first pass, as it would alone
    for tokens, keep in CALLS:
        assert torch.equal(prefilled.logits(tokens, keep), own.logits(tokens, keep)), (tokens, keep)


@tm.CPU_ONLY
def test_an_assistant_takes_the_targets_cross_attention_only_where_its_own_projections_give_it():
    from transformers.modeling_outputs import BaseModelOutput
    target = tm.whisper(3)
    hidden = _encoder_hidden(3)
    key_values = CachedDecoder(target, {}, prefix_length=1,
                               encoder_outputs=BaseModelOutput(last_hidden_state=hidden)).cross_key_values
    int8_copy = tm.whisper(3)   # the target's own weights, quantized: base's decoder in int8 is this
    quantized.quantize(int8_copy)
    shared = WhisperDecoderStep(int8_copy, hidden, key_values)
    assert all(layer.shares_target for layer in shared.layers)
    assert shared.layers[0].cross_values is key_values[0][1]   # the target's values themselves, not a copy
    assert torch.equal(shared.layers[0].cross_keys_t, key_values[0][0].transpose(2, 3))
    apart = WhisperDecoderStep(tm.whisper(4), hidden, key_values)   # a decoder trained apart: its own
    assert not any(layer.shares_target for layer in apart.layers)
    assert not any(layer.shares_target for layer in WhisperDecoderStep(int8_copy, hidden).layers)
    inputs = tm.whisper_inputs(3)
    baseline = generate(target, inputs, max_new_tokens=20)
    assisted = generate(target, inputs, assistant_model=int8_copy, max_new_tokens=20)
    assert assisted.new_tokens == baseline.new_tokens and assisted.assistant_passes > 0


def test_no_encoder_keeps_an_autograd_graph_beside_its_output():
    # a loaded model's parameters require grad: an encoder run outside inference mode would keep every layer's
    # activations for a backward pass that never comes, as long as its output is held (a speed probe's, for good)
    target, assistant = tm.whisper(0).requires_grad_(True), tm.whisper(1, layers=1).requires_grad_(True)
    frames = torch.zeros(1, 32, dtype=torch.long)
    frames[:, :12] = 1
    inputs = {**tm.whisper_inputs(0), "attention_mask": frames}
    decoder = CachedDecoder(target, inputs, prefix_length=3)
    assert decoder.encoder_outputs.last_hidden_state.grad_fn is None
    seen = []   # whether autograd records, in the assistant's first encoder layer (it reads the clip's frames)
    layer = assistant.get_encoder().layers[0]
    hook = layer.register_forward_pre_hook(lambda module, args: seen.append(torch.is_grad_enabled()))
    try:
        generate(target, inputs, assistant_model=assistant, max_new_tokens=4)
    finally:
        hook.remove()
    clip = whisper_decoder.clip_encoder_outputs(assistant, inputs["input_features"], 12, 0.02)
    assert clip.last_hidden_state.grad_fn is None and seen == [False]
