"""A w8a8 target (`quantized.RowInt8Linear` and `attention.row_invariant_attention`): a pass over several tokens
gives each exactly what one-token steps give, so assisted greedy output equals the baseline's token for token."""
import pytest
import torch
from torch import nn

import helpers as tm
from assistgen.engine import attention
from assistgen.engine.decoding import generate
from assistgen.engine.kv import CachedDecoder
from assistgen.engine.llama_decoder import LlamaDecoderStep
from assistgen.models import quantized

pytestmark = tm.CPU_ONLY


def _rows_of_mixed_sizes(rows: int, width: int) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(rows, width) * torch.logspace(-2, 2, rows)[:, None]


def test_a_row_int8_layer_gives_each_row_what_it_gives_that_row_alone():
    torch.manual_seed(1)
    layer = nn.Linear(48, 40)
    x = _rows_of_mixed_sizes(9, 48)
    row_wise = quantized.RowInt8Linear(*quantized.quantize_weight(layer.weight), layer.bias)
    alone = torch.cat([row_wise(x[i:i + 1]) for i in range(len(x))])
    assert torch.equal(row_wise(x), alone)
    assert torch.allclose(row_wise(x), layer(x), rtol=0.05, atol=0.05 * float(x.abs().max()))   # still the layer
    # One scale for the whole input (the assistant's Int8Linear): the small rows come out otherwise among large ones
    per_pass = quantized.Int8Linear(*quantized.quantize_weight(layer.weight), layer.bias)
    assert not torch.equal(per_pass(x), torch.cat([per_pass(x[i:i + 1]) for i in range(len(x))]))


def test_fused_row_int8_layers_give_each_layer_its_own_outputs():
    torch.manual_seed(2)
    layers = [quantized.RowInt8Linear(*quantized.quantize_weight(torch.randn(n, 24)), torch.randn(n)) for n in (8, 5)]
    x = _rows_of_mixed_sizes(4, 24)
    fused = layers[0].fused(layers[1:])
    assert isinstance(fused, quantized.RowInt8Linear)
    assert torch.equal(fused(x), torch.cat([m(x) for m in layers], dim=-1))


def test_row_invariant_attention_computes_each_new_row_as_a_step_of_its_own():
    torch.manual_seed(3)
    query, key, value = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8)
    module = nn.Module()
    module.is_causal, module.num_key_value_groups, module.training = True, 2, False
    out, _ = attention.row_invariant_attention(module, query, key, value, None, scaling=8 ** -0.5)
    for i in range(6):
        alone, _ = attention.row_invariant_attention(module, query[:, :, i:i + 1], key[:, :, :15 + i],
                                                     value[:, :, :15 + i], None, scaling=8 ** -0.5)
        assert torch.equal(out[:, i:i + 1], alone)


def _decoder(model, path: str, row_invariant: bool = True) -> CachedDecoder:
    decoder = CachedDecoder(model, tm.decoder_inputs(7), prefix_length=7)
    if path == "transformers":   # the modules' own path, which a family the lean step does not know takes
        decoder._step = None
    else:
        assert isinstance(decoder._step, LlamaDecoderStep) and decoder._step.row_invariant
        decoder._step.row_invariant = row_invariant
    return decoder


def _verified_and_stepped(model, path: str, row_invariant: bool = True):
    prompt, continuation = [3, 17, 9, 41, 5, 22, 8], [11, 30, 2, 19, 27, 6, 14, 33]
    steps = _decoder(model, path, row_invariant)
    one_by_one = [steps.logits(prompt)]
    for i in range(len(continuation)):
        one_by_one.append(steps.logits(prompt + continuation[:i + 1]))
    verifying = _decoder(model, path, row_invariant)
    assert torch.equal(verifying.logits(prompt), one_by_one[0])
    together = verifying.logits(prompt + continuation, keep=len(continuation))   # the pass feeds the 8 new tokens
    return together, torch.cat(one_by_one[1:])


@pytest.mark.parametrize("path", ["lean", "transformers"])
def test_a_verification_pass_equals_one_token_steps_bit_for_bit(path):
    together, one_by_one = _verified_and_stepped(tm.w8a8_qwen2(4, layers=3), path)
    assert torch.equal(together, one_by_one)


def test_the_lean_target_pass_needs_its_rows_attended_one_by_one():
    together, one_by_one = _verified_and_stepped(tm.w8a8_qwen2(4, layers=3), "lean", row_invariant=False)
    assert not torch.equal(together, one_by_one)


def test_drafts_appended_to_the_prompt_are_verified_in_a_pass_of_their_own():
    """The fused attention blocks a prompt's rows by their number: drafts appended to it would change the prompt's
    own last row. So the first pass reads the prompt alone, as the baseline does, then the drafts."""
    model = tm.w8a8_qwen2(5)
    prompt, drafts = [3, 17, 9, 41, 5, 22, 8, 12, 40], [11, 30, 2]
    steps = CachedDecoder(model, tm.decoder_inputs(9), prefix_length=9)
    expected = torch.cat([steps.logits(prompt)] + [steps.logits(prompt + drafts[:i + 1]) for i in range(3)])
    calls = []
    first = CachedDecoder(model, tm.decoder_inputs(9), prefix_length=9)
    step = first._step.logits
    first._step.logits = lambda new, start, keep: calls.append(len(new)) or step(new, start, keep)
    assert torch.equal(first.logits(prompt + drafts, keep=4), expected)
    assert calls == [len(prompt), len(drafts)] and first.passes == 1


@pytest.mark.parametrize("seed", range(4))
def test_assisted_greedy_output_equals_the_w8a8_baseline(seed):
    # The assistant: the same weights with one input scale a pass, so it agrees often, and not always
    target, assistant = tm.w8a8_qwen2(seed, layers=3), quantized.quantize(tm.qwen2(seed, layers=3, init=0.2))
    inputs = tm.decoder_inputs(seed, length=10)
    baseline = generate(target, inputs, max_new_tokens=40)
    for schedule in ("heuristic", "constant"):
        assisted = generate(target, inputs, assistant_model=assistant, max_new_tokens=40,
                            num_assistant_tokens_schedule=schedule, num_assistant_tokens=6)
        assert assisted.new_tokens == baseline.new_tokens
        assert assisted.tokens_per_pass > 2   # drafts were verified several at a time
    lookup = generate(target, inputs, prompt_lookup_num_tokens=4, max_new_tokens=40)
    assert lookup.new_tokens == baseline.new_tokens
