"""oneDNN-packed linear weights stored in the cache and mapped back: the same bytes, so the same logits as packing at
load; a store made under other facts, cut short, or for another shape is not used. Models built on the meta device
must be filled completely."""

import pytest
import torch
from torch import nn

import helpers as tm
from assistgen.models import packed
from assistgen.models.cpu import OneDNNLinear, use_onednn_linears
from helpers import AVX512, host_has, needs_cpu_feature

pytestmark = needs_cpu_feature("packed oneDNN weights in the cache", packed.can_store, *AVX512)

SOURCE = {"made from": "qwen2 seed 0"}


@pytest.mark.skipif(not host_has(*AVX512), reason="the host's CPU has no AVX-512")
def test_an_avx512_host_stores_packed_weights():
    assert packed.can_store()


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def _stored(tmp_path, seed=0):
    model = tm.qwen2(seed, vocab=96, hidden=64, layers=2, init=0.2)
    use_onednn_linears(model)
    count = packed.store(model, tmp_path / "onednn", SOURCE)
    return model, count, tmp_path / "onednn"


def test_stored_packed_weights_map_back_to_the_same_logits(tmp_path):
    reference, count, folder = _stored(tmp_path)
    assert count == 2 * 7 + 1 and packed.is_stored(folder, SOURCE)
    fresh = tm.qwen2(0, vocab=96, hidden=64, layers=2, init=0.2)
    assert packed.use_stored(fresh, folder) == count
    layers = [m for m in fresh.modules() if isinstance(m, OneDNNLinear)]
    assert len(layers) == count and all(m._backing is not None for m in layers)  # wrapped, not packed again
    assert not any(type(m) is nn.Linear for m in fresh.modules())
    ids = tm.decoder_inputs(3, length=12)["input_ids"]
    assert torch.equal(_logits(fresh, ids), _logits(reference, ids))
    other = tm.qwen2(1, vocab=96, hidden=64, layers=2, init=0.2)   # the store's weights, not the model's own
    x = torch.randn(3, 128)
    assert not torch.equal(other.model.layers[0].mlp.down_proj(x), reference.model.layers[0].mlp.down_proj(x))
    packed.use_stored(other, folder)
    assert torch.equal(other.model.layers[0].mlp.down_proj(x), reference.model.layers[0].mlp.down_proj(x))


def test_a_store_from_another_conversion_cpu_or_torch_is_not_used(tmp_path, monkeypatch):
    _, _, folder = _stored(tmp_path)
    assert not packed.is_stored(folder, {"made from": "another conversion"})
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "NO AVX")
    assert not packed.is_stored(folder, SOURCE)           # the blocked layout depends on the instruction set


def test_a_store_cut_short_is_not_used(tmp_path):
    _, _, folder = _stored(tmp_path)
    data = folder / packed.DATA
    data.write_bytes(data.read_bytes()[:-4096])
    assert not packed.is_stored(folder, SOURCE)


def test_a_store_for_other_shapes_is_refused_before_any_layer_is_swapped(tmp_path):
    _, _, folder = _stored(tmp_path)
    wider = tm.qwen2(0, vocab=96, hidden=32, layers=2, init=0.2)
    with pytest.raises(ValueError, match="does not fit"):
        packed.use_stored(wider, folder)
    assert not any(isinstance(m, OneDNNLinear) for m in wider.modules())


def test_the_marker_is_written_last(tmp_path, monkeypatch):
    """A store interrupted while writing leaves no marker, so it is redone rather than half used."""
    model = tm.qwen2(0, vocab=96, hidden=64, layers=2, init=0.2)
    use_onednn_linears(model)
    monkeypatch.setattr(packed.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        packed.store(model, tmp_path / "onednn", SOURCE)
    assert not (tmp_path / "onednn" / packed.MARKER).exists()
    assert not packed.is_stored(tmp_path / "onednn", SOURCE)


def test_a_model_built_on_the_meta_device_must_be_filled_completely():
    from transformers import Qwen2ForCausalLM

    from assistgen.models.skeleton import check_filled, empty_model
    reference = tm.qwen2(0)
    model = empty_model(Qwen2ForCausalLM, reference.config, torch.float32)
    assert all(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())   # computed at construction (rotary frequencies), not stored
    state = reference.state_dict()
    state.pop("model.norm.weight")
    model.load_state_dict(state, assign=True, strict=False)
    with pytest.raises(ValueError, match="model.norm.weight"):
        check_filled(model)
    model.load_state_dict(reference.state_dict(), assign=True)
    check_filled(model)
    ids = tm.decoder_inputs(3, length=6)["input_ids"]
    assert torch.equal(_logits(model, ids), _logits(reference, ids))
