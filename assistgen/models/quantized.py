"""An assistant in int8 (torch's dynamic quantization, CPU), quantized once and stored in the cache as safetensors.

Quantizing at every load cost 7-12 s for the 0.5B (`quantize_dynamic` deep-copies the model, then packs it). The
int8 weights, their scales and every other tensor are stored instead, as plain tensors (never a pickle), and a load
rebuilds the quantized linear layers from them: the packing alone remains.
"""
from __future__ import annotations

import json
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn

from .packs import build_folder

FORMAT_VERSION = 1
MARKER = "assistgen-int8.json"
_QUANTIZED = (".qweight", ".qscale", ".qzero_point")


def _dynamic_linear():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import torch.ao.nn.quantized.dynamic as nnqd
    return nnqd.Linear


def quantize(model: nn.Module) -> nn.Module:
    """Every ``nn.Linear`` in int8 (per-tensor symmetric weights, activations quantized on the fly)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in 2.13, and works on the pinned torch
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def tensors_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """A quantized model as plain tensors: int8 weight, scale and zero point per quantized linear, the rest as is."""
    linear = _dynamic_linear()
    tensors: dict[str, torch.Tensor] = {}
    quantized = set()
    chunked = tuple(f"{name}.parts." for name, m in model.named_modules() if isinstance(m, RowChunkedLinear))
    for name, module in model.named_modules():
        if isinstance(module, RowChunkedLinear):   # stored whole, as it was quantized
            weight, bias = module.whole_weight_bias()
        elif isinstance(module, linear) and not name.startswith(chunked):
            weight, bias = module._weight_bias()
        else:
            continue
        if weight.qscheme() != torch.per_tensor_affine:
            raise ValueError(f"{name}: only per-tensor int8 weights are stored, got {weight.qscheme()}")
        tensors[f"{name}.qweight"] = weight.int_repr().contiguous()
        tensors[f"{name}.qscale"] = torch.tensor([weight.q_scale()], dtype=torch.float64)
        tensors[f"{name}.qzero_point"] = torch.tensor([weight.q_zero_point()], dtype=torch.int64)
        if bias is not None:
            tensors[f"{name}.bias"] = bias.detach().contiguous()
        quantized.add(name)
    seen, persistent = set(), set(model.state_dict())
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if name.rsplit(".", 1)[0] in quantized or name not in persistent or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())  # a tied weight once
        tensors[name] = tensor.detach().contiguous()
    return tensors


# fbgemm's packing grows faster than the size of the weight: the 0.5B's lm_head (151,936 x 896) took 4.5 s to pack
# whole against 1.3 s in four parts, while every other layer of the model took 1.9 s together. Larger layers are
# packed as row blocks; each output is a dot product over the same input row, so the blocks give the same numbers.
PACK_ROWS = 32768


class RowChunkedLinear(nn.Module):
    """A dynamic int8 linear stored as blocks of output rows, each packed alone; outputs concatenated."""

    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)

    def whole_weight_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        blocks = [part._weight_bias() for part in self.parts]
        first = blocks[0][0]
        weight = torch._make_per_tensor_quantized_tensor(torch.cat([w.int_repr() for w, _ in blocks]),
                                                         first.q_scale(), first.q_zero_point())
        return weight, None if blocks[0][1] is None else torch.cat([b for _, b in blocks])


def _packed(linear, weight: torch.Tensor, scale: float, zero_point: int, bias: torch.Tensor | None) -> nn.Module:
    # Built 1x1 and then given its weight: the constructor packs a zero weight of the full size first, which cost
    # more than the real packing (4.7 s of 7 s for the 0.5B).
    q = linear(1, 1, bias_=bias is not None, dtype=torch.qint8)
    q.in_features, q.out_features = weight.shape[1], weight.shape[0]
    quantized = torch._make_per_tensor_quantized_tensor(weight.contiguous(), scale, zero_point)
    q.set_weight_bias(quantized, bias)   # the packing: single-threaded, so two layers are packed at a time
    return q


def rebuild(model: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """Put `tensors_of`'s tensors into a freshly built float model of the same architecture, in place. The tensors
    are used as they are (not copied): pass tensors in process memory, not views of a memory map."""
    linear = _dynamic_linear()
    names = sorted({k[: -len(".qweight")] for k in tensors if k.endswith(".qweight")})
    quantized = set(names)
    rest = {k: v for k, v in tensors.items()
            if not k.endswith(_QUANTIZED) and not (k.endswith(".bias") and k[: -len(".bias")] in quantized)}
    missing, unexpected = model.load_state_dict(rest, strict=False, assign=True)
    untied = [k for k in missing if k.rsplit(".", 1)[0] not in quantized]  # only the layers rebuilt below
    if unexpected or untied:
        raise ValueError(f"int8 cache does not fit the model: missing {untied[:3]}, unexpected {unexpected[:3]}")
    def quantized_linear(name: str):
        parent_name, _, child = name.rpartition(".")
        old = getattr(model.get_submodule(parent_name), child)
        weight, bias = tensors[f"{name}.qweight"], tensors.get(f"{name}.bias")
        scale, zero_point = float(tensors[f"{name}.qscale"][0]), int(tensors[f"{name}.qzero_point"][0])
        rows = range(0, weight.shape[0], PACK_ROWS)
        parts = [_packed(linear, weight[r:r + PACK_ROWS], scale, zero_point,
                         None if bias is None else bias[r:r + PACK_ROWS]) for r in rows]
        q = parts[0] if len(parts) == 1 else RowChunkedLinear(parts)
        q.in_features, q.out_features = old.in_features, old.out_features
        return name, q

    # Quantized tensor creation is deprecated in torch and works here. The filter is set once, around the pool:
    # warnings' filters are process-wide, and a catch_warnings in each worker could restore another's on exit.
    with warnings.catch_warnings(), ThreadPoolExecutor(max(1, min(4, torch.get_num_threads()))) as pool:
        warnings.simplefilter("ignore", UserWarning)
        for name, q in pool.map(quantized_linear, names):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, q)
    return model.eval()


def _marker(source: dict) -> dict:
    return {"version": FORMAT_VERSION, "source": source}


def is_stored(out_dir: Path, source: dict) -> bool:
    try:
        return json.loads((Path(out_dir) / MARKER).read_text()) == _marker(source)
    except (OSError, ValueError):
        return False


def store(model: nn.Module, out_dir: Path, source: dict) -> Path:
    """Write a quantized model's tensors, config and generation config into `out_dir`, atomically.

    `source` identifies what it was quantized from (the float cache's own marker): a changed source is requantized.
    """
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        save_file(tensors_of(model), str(tmp / "model.safetensors"))
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(_marker(source)))
    return build_folder(Path(out_dir), lambda: is_stored(out_dir, source), write)


def load(out_dir: Path, model_class) -> nn.Module:
    """The stored int8 model, its float layers built untouched and filled from the cache."""
    from transformers import AutoConfig, GenerationConfig

    from .skeleton import check_filled, empty_model

    out_dir = Path(out_dir)
    config = AutoConfig.from_pretrained(out_dir)
    model = empty_model(model_class, config, torch.float32)
    rebuild(model, _read(out_dir / "model.safetensors"))
    check_filled(model)
    model.generation_config = GenerationConfig.from_pretrained(out_dir)
    model.config._name_or_path = model.name_or_path = str(out_dir)
    return model


def _read(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file in its stored dtype, in process memory. safetensors hands out views of a
    memory map, which the page cache can evict mid-generation: each is copied, but for the int8 weights, which the
    packing copies anyway."""
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return {name: f.get_tensor(name) if name.endswith(".qweight") else f.get_tensor(name).clone()
                for name in f.keys()}
