"""The load's check that a decoder-only assistant's checkpoint holds its target's encoder, on stand-ins in the hub's
dtypes (tests/hub_cache.py): distil-Whisper's float16 file against its teacher's float32 one, which holds float16
values. The check compares the two files, so it holds whatever the target's load makes of its encoder."""
import dataclasses

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from assistgen.models import precision, quantized
from assistgen.models.catalog import load_catalog
from assistgen.models.cpu import native_bfloat16
from assistgen.models.loading import LoadError, check_pair, load_model
from hub_cache import add_to_cache, whisper_pair

CATALOG = load_catalog()
PAIR = CATALOG.pair("whisper-large-v2+distil-large-v2")
CPU = torch.device("cpu")
PERTURBED = "model.encoder.layers.0.fc1.weight"


def _one_float16_ulp_off(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (float16 values, in any dtype) with its first value moved to the next float16 value."""
    half = tensor.half().clone()
    half.view(-1).view(torch.int16)[0] += 1
    return half.to(tensor.dtype)


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """(teacher, distil checkpoint, a teacher one float16 ulp off in one encoder weight), each a folder."""
    work = tmp_path_factory.mktemp("whisper")
    teacher, distil = whisper_pair(work, 80)
    other = work / "other"
    other.mkdir()
    for path in teacher.iterdir():
        (other / path.name).write_bytes(path.read_bytes())
    weights = load_file(teacher / "model.safetensors")
    weights[PERTURBED] = _one_float16_ulp_off(weights[PERTURBED])
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    return teacher, distil, other


@pytest.fixture
def hub(stand_ins, tmp_path, monkeypatch):
    """A Hugging Face cache, read offline, holding the stand-ins under the pair's repo ids and the perturbed teacher
    under an id of its own; returns that perturbed teacher's spec."""
    import huggingface_hub.constants
    teacher, distil, other = stand_ins
    other_id = "openai/whisper-large-v2-perturbed"
    for repo_id, folder in ((PAIR.target.location, teacher), (PAIR.assistant.location, distil), (other_id, other)):
        add_to_cache(tmp_path, repo_id, folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return dataclasses.replace(PAIR.target, name="whisper-large-v2-perturbed", location=other_id)


def _target(spec, encoder_dtype):
    """The target loaded on the CPU with `encoder_dtype` (cast only where this CPU computes bfloat16 natively)."""
    loaded = load_model(dataclasses.replace(spec, encoder_dtype=encoder_dtype), CATALOG, device=CPU)
    cast = encoder_dtype is not None and native_bfloat16()
    assert precision.encoder_dtype(loaded.model) == (torch.bfloat16 if cast else None)
    return loaded


def test_the_stand_ins_hold_the_hubs_dtypes(stand_ins):
    teacher, distil, _ = stand_ins
    ours, theirs = load_file(teacher / "model.safetensors"), load_file(distil / "model.safetensors")
    assert {t.dtype for t in ours.values()} == {torch.float32}
    assert all(torch.equal(t, t.half().float()) for t in ours.values())   # float16 values in a float32 file
    assert {t.dtype for t in theirs.values()} == {torch.float16}
    assert AutoConfig.from_pretrained(distil).dtype == torch.float16
    encoder = [name for name in theirs if "encoder" in name.split(".")]
    assert encoder and all(torch.equal(theirs[name].float(), ours[name]) for name in encoder)


@pytest.mark.parametrize("encoder_dtype", [None, "bfloat16"])
def test_a_distil_checkpoint_holding_its_teachers_encoder_passes_whatever_the_targets_encoder_dtype(hub,
                                                                                                   encoder_dtype):
    target = _target(PAIR.target, encoder_dtype)
    assistant = load_model(PAIR.assistant, CATALOG, device=CPU)
    assert next(assistant.model.parameters()).dtype == torch.float32   # dtype auto, on a CPU
    pair = check_pair(PAIR, target, assistant)
    assert pair.assistant_usable and pair.mode == "same-tokenizer"


def test_the_check_reads_the_targets_checkpoint_not_what_its_load_made_of_it(hub):
    target = _target(PAIR.target, "bfloat16")
    quantized.quantize(target.model)   # int8 layers, encoder and decoder: no encoder weight is the file's any more
    assert not any(name.endswith("fc1.weight") for name, _ in target.model.named_parameters())
    assert check_pair(PAIR, target, load_model(PAIR.assistant, CATALOG, device=CPU)).assistant_usable


@pytest.mark.parametrize("encoder_dtype", [None, "bfloat16"])
def test_a_teacher_one_float16_ulp_off_in_one_encoder_weight_is_refused_naming_it(hub, encoder_dtype):
    # in bfloat16 the loaded weights are equal: only the files tell them apart
    target = _target(hub, encoder_dtype)
    assistant = load_model(PAIR.assistant, CATALOG, device=CPU)
    with pytest.raises(LoadError, match=rf"trained on another encoder than the target's \({PERTURBED} differs\)"):
        check_pair(PAIR, target, assistant)


def test_a_target_without_files_is_compared_as_loaded(hub):
    target = dataclasses.replace(_target(PAIR.target, None), folder=None)   # as a model built in memory
    assistant = load_model(PAIR.assistant, CATALOG, device=CPU)
    assert check_pair(PAIR, target, assistant).assistant_usable
    norm = target.model.model.encoder.layer_norm.weight   # a tensor the CPU setup leaves as it is
    with torch.no_grad():
        norm.copy_(_one_float16_ulp_off(norm))
    with pytest.raises(LoadError, match=r"\(model\.encoder\.layer_norm\.weight differs\)"):
        check_pair(PAIR, target, assistant)
