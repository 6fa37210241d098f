"""The int8 assistant stored in the cache: quantized once, rebuilt from plain tensors, the same function as the
model quantized at load."""
import torch

import tiny_models as tm
from assistgen import quantized


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
