"""The int8 assistant stored in the cache: quantized once, rebuilt from plain tensors, the same function as the
model quantized at load."""
import torch

import helpers as tm
from assistgen.models import quantized


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_a_stored_int8_model_loads_back_to_the_same_logits(tmp_path):
    model = tm.qwen2(0, vocab=96, hidden=32, layers=2, init=0.2)
    q = quantized.quantize(model)
    source = {"made from": "qwen2 seed 0"}
    folder = quantized.store(q, tmp_path / "int8", source)
    assert quantized.is_stored(folder, source)
    assert not quantized.is_stored(folder, {"made from": "another conversion"})  # a changed source requantizes
    loaded = quantized.load(folder, type(model))
    ids = tm.decoder_inputs(3, length=12)["input_ids"]
    assert torch.equal(_logits(loaded, ids), _logits(q, ids))
    assert not torch.equal(_logits(loaded, ids), _logits(model, ids))  # it really is the int8 model
    linears = [m for m in loaded.modules() if isinstance(m, type(q.lm_head))]
    assert len(linears) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the output projection


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
    monkeypatch.setattr(quantized, "PACK_ROWS", 40)   # the 96-row lm_head in blocks of 40, 40 and 16 rows
    chunked = quantized.load(whole, type(model))
    assert isinstance(chunked.lm_head, quantized.RowChunkedLinear)
    assert [p.out_features for p in chunked.lm_head.parts] == [40, 40, 16]
    ids = tm.decoder_inputs(5, length=9)["input_ids"]
    assert torch.equal(_logits(chunked, ids), _logits(q, ids))
    again = quantized.store(chunked, tmp_path / "again", {"v": 1})   # stored whole, as it was quantized
    a, b = (quantized._read(f / "model.safetensors") for f in (whole, again))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
