"""`encoder_dtype: bfloat16`: a Whisper target's encoder computes its products and attention in bfloat16 while its
norms, residual stream and output stay in float32, the decoder is untouched, assisted output stays identical to the
baseline's, and the option applies only where the CPU computes bfloat16 natively."""

import dataclasses

import pytest
import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import helpers as tm
from assistgen.comparison.compare import target_numerics
from assistgen.engine.decoding import generate
from assistgen.models import packed, precision
from assistgen.models.catalog import CatalogError, load_catalog
from assistgen.models.cpu import OneDNNLinear, use_onednn_linears
from assistgen.models.loading import LoadError, load_model
from helpers import AVX512, needs_cpu_feature

PACKED = needs_cpu_feature("packed oneDNN weights in the cache", packed.can_store, *AVX512)


def _encode(model, features):
    with torch.inference_mode():
        return model.get_encoder()(features).last_hidden_state


def test_the_encoder_is_cast_and_of_the_decoder_only_what_reads_the_encoder():
    model = tm.whisper(0).eval()
    features = tm.whisper_inputs(1)["input_features"]
    before = _encode(model, features)
    names = [name for name, _ in model.named_parameters()]
    decoder = {name: p.clone() for name, p in model.model.decoder.named_parameters()}
    assert precision.encoder_dtype(model) is None
    h = torch.randn(1, 9, model.config.d_model)
    with torch.inference_mode():
        cross_before = model.model.decoder.layers[0].encoder_attn.v_proj(h)

    encoder_layers, decoder_layers = len(model.model.encoder.layers), len(model.model.decoder.layers)
    # the encoder's q k v o, fc1 fc2; the decoder's cross-attention k and v
    assert precision.cast_encoder(model, torch.bfloat16) == 6 * encoder_layers + 2 * decoder_layers
    assert precision.encoder_dtype(model) == torch.bfloat16
    assert [name for name, _ in model.named_parameters()] == names        # stored weights still find their layers
    assert model.dtype == torch.float32                                  # what the rest of the code reads
    encoder = model.model.encoder
    assert all(type(m) is not nn.Linear for m in encoder.modules())
    assert encoder.conv1.weight.dtype == encoder.layer_norm.weight.dtype == torch.float32
    assert type(encoder.conv2) is precision.LowPrecisionConv1d and encoder.conv2.weight.dtype == torch.bfloat16
    assert encoder.layers[0].self_attn.config._attn_implementation == precision.ATTENTION
    cross = {f"{i}.encoder_attn.{p}" for i in range(decoder_layers) for p in ("k_proj", "v_proj")}
    for name, m in model.model.decoder.layers.named_modules():
        if isinstance(m, nn.Linear):
            lowered = name in cross
            assert type(m) is (precision.EncoderSideLinear if lowered else nn.Linear), name
            assert m.weight.dtype == (torch.bfloat16 if lowered else torch.float32), name
    assert model.model.decoder.layers[0].self_attn.config._attn_implementation != precision.ATTENTION
    assert all(torch.equal(p, decoder[name].to(p.dtype)) for name, p in model.model.decoder.named_parameters())
    with torch.inference_mode():
        cross_after = model.model.decoder.layers[0].encoder_attn.v_proj(h)
    assert cross_after.dtype == torch.float32 and not torch.equal(cross_after, cross_before)   # computed in bfloat16
    assert torch.allclose(cross_after, cross_before, atol=0.02 * cross_before.abs().max().item())

    after = _encode(model, features)
    assert after.dtype == torch.float32
    assert not torch.equal(after, before)                                 # it did compute in bfloat16
    assert torch.allclose(after, before, atol=0.05 * before.abs().max().item())


@pytest.mark.parametrize("rows", [1, 7, 8, 20])
def test_row_block_attention_is_attention(monkeypatch, rows):
    monkeypatch.setattr(precision, "ROW_BLOCK", 3)   # blocks of 3 rows: a last block cut short, or a single one
    g = torch.Generator().manual_seed(rows)
    query, key, value = (torch.randn(2, 4, n, 8, generator=g) for n in (rows, 11, 11))
    module = nn.Module().eval()
    module.is_causal = False   # as a Whisper encoder's attention
    for scaling in (1.0, 0.25, None):   # None: the interface's default, 1/sqrt(head_dim)
        ours, weights = precision.row_block_attention(module, query, key, value, None, scaling=scaling)
        reference, _ = sdpa_attention_forward(module, query, key, value, None, scaling=scaling)
        assert weights is None and ours.shape == reference.shape == (2, rows, 4, 8)
        assert torch.allclose(ours, reference, atol=1e-5)
    low = [t.to(torch.bfloat16) for t in (query, key, value)]   # as it runs in the cast encoder
    ours, _ = precision.row_block_attention(module, *low, None, scaling=1.0)
    reference, _ = sdpa_attention_forward(module, *[t.float() for t in low], None, scaling=1.0)
    assert ours.dtype == torch.bfloat16 and torch.allclose(ours.float(), reference, atol=0.03)
    mask = torch.zeros(2, 1, rows, 11)
    mask[..., -2:] = -float("inf")
    masked, _ = precision.row_block_attention(module, query, key, value, mask, scaling=1.0)
    assert torch.allclose(masked, sdpa_attention_forward(module, query, key, value, mask, scaling=1.0)[0], atol=1e-5)
    module.is_causal = True
    causal, _ = precision.row_block_attention(module, query, key, value, None, scaling=1.0)
    assert torch.allclose(causal, sdpa_attention_forward(module, query, key, value, None, scaling=1.0)[0], atol=1e-5)


def test_assisted_output_stays_identical_with_a_lowered_target():
    target = tm.whisper(0).eval()
    precision.cast_encoder(target, torch.bfloat16)
    assistant = tm.perturbed(tm.whisper(0).eval(), 0.05, seed=5)   # agrees often, reading its own float32 encoder
    passes = {"baseline": 0, "assisted": 0}
    for seed in range(4):
        inputs = tm.whisper_inputs(seed)
        baseline = generate(target, inputs, max_new_tokens=24)
        assisted = generate(target, inputs, assistant_model=assistant, max_new_tokens=24)
        assert assisted.new_tokens == baseline.new_tokens and len(baseline.new_tokens) == 24
        passes["baseline"] += baseline.target_passes
        passes["assisted"] += assisted.target_passes
    assert passes["assisted"] < passes["baseline"]   # its drafts were accepted: the check did verify some


@PACKED
def test_a_store_packed_from_a_cast_model_maps_back_onto_one(tmp_path):
    """A fresh cache: `prepare` stores the packed layers of the model as loaded, its encoder already cast."""
    cast = tm.whisper(0).eval()
    lowered = precision.cast_encoder(cast, torch.bfloat16)
    count = use_onednn_linears(cast)
    assert count == sum(isinstance(m, nn.Linear) for m in tm.whisper(0).modules()) - lowered
    assert packed.store(cast, tmp_path, {"made from": "whisper seed 0"}) == count
    model = tm.whisper(0).eval()
    precision.cast_encoder(model, torch.bfloat16)
    assert packed.use_stored(model, tmp_path) == count
    features = tm.whisper_inputs(1)
    with torch.inference_mode():
        assert torch.equal(model(**features).logits, cast(**features).logits)


@PACKED
def test_a_store_packed_before_casting_leaves_the_cast_layers_alone(tmp_path):
    packed_model = tm.whisper(0).eval()
    count = use_onednn_linears(packed_model)
    assert packed.store(packed_model, tmp_path, {"made from": "whisper seed 0"}) == count
    model = tm.whisper(0).eval()
    lowered = precision.cast_encoder(model, torch.bfloat16)
    assert packed.use_stored(model, tmp_path) == count - lowered
    assert precision.encoder_dtype(model) == torch.bfloat16
    assert not any(isinstance(m, OneDNNLinear) for m in model.model.encoder.modules())


def _catalog(tmp_path, entry: str):
    root = tmp_path / "models"
    tm.build_tiny_catalog(root)
    path = root / "models.yaml"
    path.write_text(path.read_text().replace(
        f"tiny-speech-target: {{local: {root / 'speech-target'}, dtype: float32}}",
        f"tiny-speech-target: {{local: {root / 'speech-target'}, dtype: float32{entry}}}"))
    return load_catalog(path)


def test_the_encoder_is_cast_only_on_a_cpu_for_a_float32_model_wholly_in_memory(monkeypatch):
    monkeypatch.setattr(precision, "native_bfloat16", lambda: True)
    model = tm.whisper(0)
    cpu = torch.device("cpu")
    assert precision.lowers_here(model, cpu)
    assert not precision.lowers_here(model, torch.device("cuda"))       # a GPU: the model's dtype says its precision
    assert not precision.lowers_here(tm.whisper(0).to(torch.bfloat16), cpu)
    model.hf_device_map = {"model.encoder": "cpu", "model.decoder": "disk"}
    assert not precision.lowers_here(model, cpu)                          # accelerate's hooks hold its layers
    monkeypatch.setattr(precision, "native_bfloat16", lambda: False)      # emulated bfloat16: slower than float32
    assert not precision.lowers_here(tm.whisper(0), cpu)


@pytest.mark.parametrize("native", [True, False])
def test_loading_lowers_the_encoder_only_where_the_cpu_computes_bfloat16(tmp_path, monkeypatch, native):
    catalog = _catalog(tmp_path, ", encoder_dtype: bfloat16")
    spec = catalog.models["tiny-speech-target"]
    assert spec.encoder_dtype == "bfloat16"
    monkeypatch.setattr(precision, "native_bfloat16", lambda: native)
    loaded = load_model(spec, catalog, device=torch.device("cpu"))
    assert precision.encoder_dtype(loaded.model) == (torch.bfloat16 if native else None)
    pair = dataclasses.make_dataclass("P", ["target"])(loaded)
    assert target_numerics(pair) == ("float32, encoder bfloat16" if native else "float32")


def test_encoder_dtype_on_a_model_other_than_whisper_says_what_to_do(tmp_path, monkeypatch):
    from assistgen.models import availability
    monkeypatch.setattr(availability, "_failures", {})   # the refused load is remembered per process: not past here
    catalog = _catalog(tmp_path, "")
    spec = dataclasses.replace(catalog.models["tiny-text-target"], encoder_dtype="bfloat16")
    with pytest.raises(LoadError, match="applies to a Whisper model with its encoder; this one is qwen2, so remove"):
        load_model(spec, catalog, device=torch.device("cpu"))
    t5 = tm.t5(0)   # an encoder-decoder, but not one whose encoder this was measured on
    assert "this one is t5" in precision.apply_encoder_dtype(spec, t5, torch.device("cpu"))
    assert precision.encoder_dtype(t5) is None


@pytest.mark.parametrize("entry,message", [
    (", encoder_dtype: float16", "is not one of bfloat16"),
    (", encoder_dtype: bfloat16, decoder_only: true", "decoder_only model has no encoder"),
    (", encoder_dtype: bfloat16, quantization: dynamic_int8", "not with quantization or device_map"),
    (", encoder_dtype: bfloat16, device_map: auto", "not with quantization or device_map"),
])
def test_the_catalog_refuses_an_encoder_dtype_it_cannot_apply(tmp_path, entry, message):
    with pytest.raises(CatalogError, match=message):
        _catalog(tmp_path, entry)
