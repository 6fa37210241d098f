"""The int8 assistant stored in the cache: quantized once, rebuilt from plain tensors, the same function as the
model quantized at load."""
import pytest
import torch
from torch import nn

import helpers as tm
from assistgen.models import quantized
from helpers import AVX512_VNNI, host_has, needs_cpu_feature


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_a_stored_int8_model_loads_back_to_the_same_logits(tmp_path):
    model = tm.qwen2(0, vocab=96, hidden=32, layers=2, init=0.2)
    q = quantized.quantize(tm.qwen2(0, vocab=96, hidden=32, layers=2, init=0.2))
    source = {"made from": "qwen2 seed 0"}
    folder = quantized.store(q, tmp_path / "int8", source)
    assert quantized.is_stored(folder, source)
    assert not quantized.is_stored(folder, {"made from": "another conversion"})  # a changed source requantizes
    loaded = quantized.load(folder, type(model))
    ids = tm.decoder_inputs(3, length=12)["input_ids"]
    assert torch.equal(_logits(loaded, ids), _logits(q, ids))
    assert not torch.equal(_logits(loaded, ids), _logits(model, ids))  # it really is the int8 model
    products = [m for m in loaded.modules() if isinstance(m, quantized.Int8Linear)]
    assert len(products) == 2 * 4 + 1  # q/k/v as one, o, gate/up as one, down per layer, and the output projection
    assert sum(isinstance(m, quantized.ProductPart) for m in loaded.modules()) == 2 * 5


@pytest.mark.parametrize("layer", [quantized.Int8Linear, quantized.RowInt8Linear])
def test_layers_reading_one_input_packed_as_one_product_give_their_own_outputs_and_store_alike(tmp_path, monkeypatch,
                                                                                                layer):
    q = quantized.quantize(tm.qwen2(4, vocab=96, hidden=32, layers=2, init=0.2), layer)
    assert isinstance(q.model.layers[0].self_attn.q_proj, quantized.ProductPart)
    monkeypatch.setattr(quantized, "SIBLINGS", {})
    apart = quantized.quantize(tm.qwen2(4, vocab=96, hidden=32, layers=2, init=0.2), layer)
    assert isinstance(apart.model.layers[0].self_attn.q_proj, layer)
    ids = tm.decoder_inputs(2, length=10)["input_ids"]
    assert torch.equal(_logits(q, ids), _logits(apart, ids))
    a, b = quantized.tensors_of(q), quantized.tensors_of(apart)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)   # the stored format does not change
    attention = q.model.layers[1].self_attn
    x = torch.randn(3, 32)
    with torch.inference_mode():
        calls = []
        whole = attention.q_proj.whole
        whole.register_forward_hook(lambda *args: calls.append(1))
        parts = [attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)]
    assert len(calls) == 1   # one product for the three parts of one input
    assert torch.equal(torch.cat(parts, dim=-1), whole(x))


def test_the_stored_files_are_tensors_only(tmp_path):
    q = quantized.quantize(tm.whisper(1))
    folder = quantized.store(q, tmp_path / "int8", {"v": 1})
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(["assistgen-int8.json", "config.json", "generation_config.json", "model.safetensors"])
    loaded = quantized.load(folder, type(tm.whisper(1)))
    inputs = tm.whisper_inputs(0)
    with torch.inference_mode():
        a = loaded(input_features=inputs["input_features"], decoder_input_ids=inputs["decoder_input_ids"]).logits
        b = q(input_features=inputs["input_features"], decoder_input_ids=inputs["decoder_input_ids"]).logits
    assert torch.equal(a, b)


def test_a_layer_packed_in_row_blocks_gives_the_same_logits_and_stores_whole(tmp_path, monkeypatch):
    model = tm.qwen2(2, vocab=96, hidden=32, layers=1, init=0.2)
    q = quantized.quantize(model)
    whole = quantized.store(q, tmp_path / "whole", {"v": 1})
    monkeypatch.setattr(quantized, "PACK_ROWS", 40)   # the 96-row lm_head: its first 40 rows, then two blocks
    chunked = quantized.load(whole, type(model))
    assert [torch.ops.quantized.linear_unpack(b)[0].shape[0] for b in chunked.lm_head._blocks] == [40, 28, 28]
    ids = tm.decoder_inputs(5, length=9)["input_ids"]
    assert torch.equal(_logits(chunked, ids), _logits(q, ids))
    again = quantized.store(chunked, tmp_path / "again", {"v": 1})   # stored whole, as it was quantized
    a, b = (quantized._read(f / "model.safetensors") for f in (whole, again))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_each_row_of_a_weight_gets_its_own_scale():
    """One scale for the whole weight rounded the small rows of a layer to nothing; a scale per row keeps each."""
    torch.manual_seed(0)
    weight = torch.randn(3, 64) * torch.tensor([[1e-3], [1.0], [1e3]])
    qweight, qscale = quantized.quantize_weight(weight)
    assert qweight.dtype == torch.int8 and qscale.shape == (3,)
    back = qweight.double() * qscale[:, None]
    error = (back - weight.double()).norm(dim=1) / weight.double().norm(dim=1)
    assert error.max() < 0.01, error


def _layer_error(reduce_range: bool) -> float:
    torch.manual_seed(1)
    linear = nn.Linear(256, 128)
    layer = quantized.Int8Linear(*quantized.quantize_weight(linear.weight), linear.bias)
    layer.reduce_range = reduce_range
    x = torch.randn(4, 256)
    x[:, 3] *= 20   # an outlier channel, as in real activations
    with torch.inference_mode():
        return float((layer(x) - linear(x)).norm() / linear(x).norm())


def test_the_int8_layer_computes_the_float_layer_closely():
    """Within 3 % of the float layer with 8-bit inputs (a CPU with VNNI), 5 % with 7-bit ones (the rest: the input's
    step doubles, and the outlier channel makes it coarse for every other channel)."""
    full = quantized.full_range_inputs()
    assert _layer_error(reduce_range=not full) < (0.03 if full else 0.05)


@pytest.mark.skipif(not host_has(*AVX512_VNNI), reason="the host's CPU has no AVX-512 VNNI")
def test_an_avx512_vnni_host_takes_int8_inputs_in_all_eight_bits():
    quantized.full_range_inputs.cache_clear()
    assert quantized.full_range_inputs()
    assert not quantized.Int8Linear(*quantized.quantize_weight(torch.randn(8, 16))).reduce_range


@needs_cpu_feature("int8 inputs in 8 bits (VNNI)", quantized.full_range_inputs, *AVX512_VNNI)
def test_inputs_in_eight_bits_round_less_than_in_seven():
    assert _layer_error(reduce_range=False) < 0.8 * _layer_error(reduce_range=True)


def test_without_vnni_inputs_keep_seven_bits(monkeypatch):
    quantized.full_range_inputs.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: False, raising=False)
    try:
        layer = quantized.Int8Linear(*quantized.quantize_weight(torch.randn(8, 16)))
        assert layer.reduce_range
    finally:
        quantized.full_range_inputs.cache_clear()


def test_an_int8_model_counts_its_linear_weights_among_its_parameters():
    """An int8 model keeps its linear weights outside `parameters()`; its parameter count (which prices an assistant
    against its target) still counts them, as the float model does."""
    from assistgen.models.loading import _count, parameter_count
    model = tm.qwen2(0)
    floats = parameter_count(model, torch.float32)
    assert floats == sum(p.numel() for p in model.parameters())
    int8 = quantized.quantize(model)
    assert _count(int8)[0] < floats // 2          # what parameters() alone sees
    assert parameter_count(int8, torch.float32) == floats


def test_every_torch_int8_kind_the_catalog_accepts_has_its_layer():
    from assistgen.models.catalog import QUANTIZATIONS, TORCH_INT8
    assert set(TORCH_INT8) == set(quantized.LAYERS) and set(TORCH_INT8) <= set(QUANTIZATIONS)
