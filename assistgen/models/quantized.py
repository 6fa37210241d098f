"""An assistant in int8 (fbgemm's dynamic int8 linear, CPU), quantized once and stored in the cache as safetensors.

Each linear layer keeps its weight in int8 with a scale per output row, and quantizes its input to 8 bits at each call
(`Int8Linear`): at the same speed, its greedy tokens agree with the target's far more often than with one scale per
weight and 7-bit inputs (torch's `quantize_dynamic` defaults), and nearly as often as fp32's
(`bench/scripts/int8_agreement.py`; docs/results.md, "int8 agreement"). The input's eighth bit needs a CPU whose int8
products accumulate in 32 bits (VNNI): without it, fbgemm sums pairs of products in 16 bits, which the full range can
overflow, so it keeps 7.

Quantizing takes seconds at every load, so the int8 weights, their scales and every other tensor are stored instead,
as plain tensors (never a pickle), and a load rebuilds the layers from them: the packing alone remains. Layers that
read the same input (`SIBLINGS`: a self-attention's query, key and value projections, a gated MLP's gate and up
projections) are packed as one product (`ProductPart`): one int8 call instead of three or two, each quantizing its
input once, and the same outputs, since each output row is its own weight row's product.
"""
from __future__ import annotations

import functools
import json
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import AutoConfig, GenerationConfig

from .packs import build_folder
from .skeleton import check_filled, empty_model

FORMAT_VERSION = 2   # 1: one scale per weight (torch's quantize_dynamic); 2: a scale per output row
MARKER = "assistgen-int8.json"
_QUANTIZED = (".qweight", ".qscale")

# fbgemm's packing time grows faster than the size of the weight, so layers of more rows than this are packed as row
# blocks (`block_sizes`); each output is a dot product over the same input row, so the blocks give the same numbers.
# Fewer blocks make a cheaper call, so the blocks are as large as packing allows.
PACK_ROWS = 65536


def block_sizes(rows: int) -> list[int]:
    """The row blocks of a weight of `rows` rows: the first `PACK_ROWS` rows as a block of their own (in an output
    layer, the ids a BPE vocabulary merged first, its most frequent: `Int8Linear.first_block`), the rest as few blocks
    as keep each within `PACK_ROWS`, of about equal size."""
    if rows <= PACK_ROWS:
        return [rows]
    rest = rows - PACK_ROWS
    blocks = -(-rest // PACK_ROWS)
    size = -(-rest // blocks)
    return [PACK_ROWS] + [size] * (blocks - 1) + [rest - size * (blocks - 1)]


@functools.lru_cache(maxsize=1)
def full_range_inputs() -> bool:
    """Whether this CPU's int8 products accumulate in 32 bits (VNNI), so that inputs may use all 8 bits."""
    check = getattr(torch.cpu, "_is_vnni_supported", None)
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:
        return False


class Int8Linear(nn.Module):
    """``nn.Linear`` with an int8 weight, symmetric with a scale per output row, and its input quantized to 8 bits
    (7 without VNNI: `full_range_inputs`) at each call, by fbgemm's dynamic int8 linear. A weight of more than
    `PACK_ROWS` rows is packed as row blocks (`block_sizes`), outputs concatenated; a draft may read the first block
    alone (`first_block`) and a few rows of the others (`later_rows`)."""

    OFFERS_FIRST_BLOCK = True   # a draft may read the first block alone, and a few of the later rows

    def __init__(self, qweight: torch.Tensor, qscale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.reduce_range = not full_range_inputs()
        self.has_bias = bias is not None   # packed with the weight, in float32
        blocks = block_sizes(self.out_features)
        weights, scales = qweight.split(blocks), qscale.double().split(blocks)
        biases = [None] * len(weights) if bias is None else bias.float().split(blocks)
        self._blocks = [
            torch.ops.quantized.linear_prepack(torch._make_per_channel_quantized_tensor(
                w.contiguous(), s.contiguous(), torch.zeros(len(s), dtype=torch.long), 0),
                None if b is None else b.contiguous())
            for w, s, b in zip(weights, scales, biases)]
        # the rows past the first block, kept as loaded (77 MB for the 0.5B's output layer): unpacked from fbgemm's
        # blocks instead, they took 0.35 s of every process's warm-up
        self._later = None
        if len(weights) > 1 and self.OFFERS_FIRST_BLOCK:
            first = blocks[0]
            self._later = (qweight[first:].clone(), qscale[first:].float(),
                           None if bias is None else bias[first:].float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self._blocks) == 1:   # most layers: no list, no concatenation (a draft pass makes dozens of calls)
            out = torch.ops.quantized.linear_dynamic(x, self._blocks[0], reduce_range=self.reduce_range)
        else:
            out = torch.cat([torch.ops.quantized.linear_dynamic(x, block, reduce_range=self.reduce_range)
                             for block in self._blocks], dim=-1)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    @property
    def first_rows(self) -> int:
        """The rows a draft may read alone (`first_block`): the first block's, or all of them when the weight is one
        block or the layer offers no first block."""
        if len(self._blocks) == 1 or not self.OFFERS_FIRST_BLOCK:
            return self.out_features
        return block_sizes(self.out_features)[0]

    def first_block(self, x: torch.Tensor) -> torch.Tensor:
        """The outputs of the first `first_rows` rows alone: one product over that block."""
        out = torch.ops.quantized.linear_dynamic(x, self._blocks[0], reduce_range=self.reduce_range)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    @property
    def later_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """The int8 weight, row scales and bias of the rows past the first block, as loaded (None for one block): a
        draft's few rows from them (`drafting.draft_vocabulary`)."""
        return self._later

    def stored(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The int8 weight, the scale of each row and the bias, whole."""
        parts = [torch.ops.quantized.linear_unpack(block) for block in self._blocks]
        qweight = torch.cat([w.int_repr() for w, _ in parts])
        qscale = torch.cat([w.q_per_channel_scales() for w, _ in parts]).double()
        bias = None if parts[0][1] is None else torch.cat([b for _, b in parts])
        return qweight, qscale, bias

    def fused(self, others: Sequence["Int8Linear"]) -> "Int8Linear":
        """This layer and `others` (reading the same input) as one, rows side by side: rebuilt from their stored int8
        weights, each row keeping its scale (`engine.fusing.RowFusable`)."""
        parts = [m.stored() for m in (self, *others)]
        biases = [b if b is not None else torch.zeros(w.shape[0]) for w, _, b in parts]
        return type(self)(torch.cat([w for w, _, _ in parts]), torch.cat([s for _, s, _ in parts]), torch.cat(biases))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, blocks={len(self._blocks)}, "
                f"input_bits={7 if self.reduce_range else 8}")


class RowInt8Linear(Int8Linear):
    """`Int8Linear` with each input row quantized to int8 on its own scale (per token), for a target model.

    `Int8Linear` quantizes its whole input on one scale, so a row's result depends on the other rows of the call: a
    verification pass over k tokens would not give each token what a one-token step gives. Here each row is scaled
    to whole numbers of at most `levels` (127, or 63 without VNNI) by its own largest magnitude; the products of whole
    numbers are summed in 32-bit integers, where order cannot change a sum; each output is then scaled back by its
    row's scale and its weight row's scale, and the bias added. Every step is per row or per element, so the layer is
    row-invariant: a row's output is the same, bit for bit, whatever rows share the call.

    fbgemm's dynamic linear takes a float input and chooses one scale for all of it from its minimum and maximum: a
    last row holding -(levels + 1) and levels (`_sentinel`) makes that scale exactly 1, so the whole numbers pass
    through unchanged.

    A target's output layer scores every id: its first block is not offered to drafts (`first_block` would skip the
    per-row scaling)."""

    OFFERS_FIRST_BLOCK = False

    def __init__(self, qweight: torch.Tensor, qscale: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__(qweight, qscale, None)
        self.has_bias = bias is not None
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous(), persistent=False)
        self.levels = 63.0 if self.reduce_range else 127.0
        self._sentinel = torch.zeros(self.in_features)
        self._sentinel[0], self._sentinel[1] = -self.levels - 1, self.levels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.detach().reshape(-1, self.in_features).float()   # inference only: fbgemm's products have no gradient
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min_(1e-30).div_(self.levels)
        whole = rows.new_empty(len(rows) + 1, self.in_features)
        torch.div(rows, scale, out=whole[:-1]).round_()
        whole[-1] = self._sentinel
        if len(self._blocks) == 1:
            out = torch.ops.quantized.linear_dynamic(whole, self._blocks[0], reduce_range=self.reduce_range)
        else:
            out = torch.cat([torch.ops.quantized.linear_dynamic(whole, block, reduce_range=self.reduce_range)
                             for block in self._blocks], dim=-1)
        out = out[:-1].mul_(scale)
        if self.bias is not None:
            out = out.add_(self.bias)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def stored(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        qweight, qscale, _ = super().stored()
        return qweight, qscale, self.bias

    def extra_repr(self) -> str:
        return super().extra_repr() + ", inputs=per row"


# Layers that read the same input, by the name of the module holding them: packed as one product at load
SIBLINGS = {"self_attn": ("q_proj", "k_proj", "v_proj"), "mlp": ("gate_proj", "up_proj")}


class _LastProduct:
    """The whole product of the input its parts last read: the first part to read an input computes it, the others
    take their columns of it, and the last lets it go."""

    def __init__(self, whole: Int8Linear, parts: int):
        self.whole, self.parts = whole, parts
        self._last: tuple[torch.Tensor, torch.Tensor, list[int]] | None = None   # (input, output, parts served)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        last = self._last
        if last is None or last[0] is not x:   # the input itself, not an equal one: it is held until served
            last = self._last = (x, self.whole(x), [0])
        last[2][0] += 1
        if last[2][0] >= self.parts and self._last is last:
            self._last = None
        return last[1]


class ProductPart(nn.Module):
    """One of several int8 layers reading the same input, packed as one product (`SIBLINGS`): its outputs are the
    columns `span` of the whole's (`engine.fusing.ProductPart`). Called one after another on one input, as a
    transformers module calls its query, key and value projections, the parts compute the whole product once."""

    def __init__(self, whole: Int8Linear, product: _LastProduct, span: tuple[int, int]):
        super().__init__()
        self.whole = whole
        self._product = product
        self.span = span
        self.in_features, self.out_features = whole.in_features, span[1] - span[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start, stop = self.span
        return self._product(x)[..., start:stop]

    def stored(self, whole: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Its own rows of the whole's int8 weight, scales and bias, copied out; `whole`: the whole's `stored()`,
        when the caller already unpacked it for another part."""
        qweight, qscale, bias = self.whole.stored() if whole is None else whole
        rows = slice(*self.span)
        return qweight[rows].clone(), qscale[rows].clone(), None if bias is None else bias[rows].clone()

    def extra_repr(self) -> str:
        return f"span={self.span}"


def _sibling_groups(names: list[str]) -> list[list[str]]:
    """The groups of `SIBLINGS` among the quantized layers' `names`, each in its order."""
    present, groups = set(names), []
    for name in names:
        parent, _, child = name.rpartition(".")
        siblings = SIBLINGS.get(parent.rpartition(".")[2])
        if siblings and child == siblings[0] and all(f"{parent}.{s}" in present for s in siblings):
            groups.append([f"{parent}.{s}" for s in siblings])
    return groups


def _packed_as_one(tensors: dict[str, torch.Tensor], group: list[str], layer: type[Int8Linear]) -> list[ProductPart]:
    """The layers of `group` (names in `tensors`) as the parts of one product."""
    weights = [tensors[f"{name}.qweight"] for name in group]
    biases = [tensors.get(f"{name}.bias") for name in group]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b if b is not None else torch.zeros(len(w)) for w, b in zip(weights, biases)])
    whole = layer(torch.cat(weights), torch.cat([tensors[f"{name}.qscale"] for name in group]), bias)
    product, parts, start = _LastProduct(whole, len(group)), [], 0
    for w in weights:
        parts.append(ProductPart(whole, product, (start, start + len(w))))
        start += len(w)
    return parts


# A quantization's layer class: torch's CPU int8 kinds in models.yaml.
LAYERS = {"dynamic_int8": Int8Linear, "w8a8": RowInt8Linear}


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with a scale per output row: (int8 weight, float64 scales)."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
    qweight = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return qweight, scale.double()


def tensors_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """A quantized model as plain tensors: int8 weight and row scales per Int8Linear (bias beside), the rest as is.
    On a float model, every ``nn.Linear`` is quantized on the way."""
    tensors: dict[str, torch.Tensor] = {}
    quantized = set()
    parts_left = Counter(id(m.whole) for m in model.modules() if isinstance(m, ProductPart))
    unpacked: dict[int, tuple] = {}   # each packed product unpacked once, and let go after its last part
    for name, module in model.named_modules():
        if id(module) in parts_left:   # stored as its parts, under their names
            continue
        if isinstance(module, ProductPart):
            key = id(module.whole)
            if key not in unpacked:
                unpacked[key] = module.whole.stored()
            qweight, qscale, bias = module.stored(unpacked[key])
            parts_left[key] -= 1
            if not parts_left[key]:
                del unpacked[key]   # its parts' rows are copied out
        elif isinstance(module, Int8Linear):
            qweight, qscale, bias = module.stored()
        elif isinstance(module, nn.Linear):
            (qweight, qscale), bias = quantize_weight(module.weight), module.bias
        else:
            continue
        tensors[f"{name}.qweight"], tensors[f"{name}.qscale"] = qweight.contiguous(), qscale.contiguous()
        if bias is not None:
            tensors[f"{name}.bias"] = bias.detach().float().contiguous()
        quantized.add(name)
    seen, persistent = set(), set(model.state_dict())
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if name.rsplit(".", 1)[0] in quantized or name not in persistent or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())  # a tied weight once
        tensors[name] = tensor.detach().contiguous()
    return tensors


def quantize(model: nn.Module, layer: type[Int8Linear] = Int8Linear) -> nn.Module:
    """Every ``nn.Linear`` of a float model as an int8 `layer`, in place."""
    return rebuild(model, tensors_of(model), layer)


def rebuild(model: nn.Module, tensors: dict[str, torch.Tensor], layer: type[Int8Linear] = Int8Linear) -> nn.Module:
    """Put `tensors_of`'s tensors into a freshly built float model of the same architecture, in place. The tensors
    are used as they are (not copied): pass tensors in process memory, not views of a memory map."""
    names = sorted({k[: -len(".qweight")] for k in tensors if k.endswith(".qweight")})
    quantized = set(names)
    rest = {k: v for k, v in tensors.items()
            if not k.endswith(_QUANTIZED) and not (k.endswith(".bias") and k[: -len(".bias")] in quantized)}
    missing, unexpected = model.load_state_dict(rest, strict=False, assign=True)
    untied = [k for k in missing if k.rsplit(".", 1)[0] not in quantized]  # only the layers rebuilt below
    if unexpected or untied:
        raise ValueError(f"int8 cache does not fit the model: missing {untied[:3]}, unexpected {unexpected[:3]}")

    groups = _sibling_groups(names)
    grouped = {name for group in groups for name in group}
    jobs = [[name] for name in names if name not in grouped] + groups

    def int8_layers(job: list[str]):
        if len(job) == 1:
            name = job[0]
            built = [layer(tensors[f"{name}.qweight"], tensors[f"{name}.qscale"], tensors.get(f"{name}.bias"))]
        else:
            built = _packed_as_one(tensors, job, layer)
        for name, q in zip(job, built):
            parent_name, _, child = name.rpartition(".")
            old = getattr(model.get_submodule(parent_name), child)
            if (q.in_features, q.out_features) != (old.in_features, old.out_features):
                raise ValueError(f"int8 cache does not fit the model at {name}")
        return zip(job, built)

    # fbgemm's packing is single-threaded: several layers are packed at a time. Quantized tensor creation is deprecated
    # in torch and works here; the filter is set once, around the pool: warnings' filters are process-wide, and a
    # catch_warnings in each worker could restore another's on exit.
    with warnings.catch_warnings(), ThreadPoolExecutor(max(1, min(4, torch.get_num_threads()))) as pool:
        warnings.simplefilter("ignore", UserWarning)
        for built in pool.map(int8_layers, jobs):
            for name, q in built:
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
    def write(tmp: Path) -> None:
        save_file(tensors_of(model), str(tmp / "model.safetensors"))
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(_marker(source)))
    return build_folder(Path(out_dir), lambda: is_stored(out_dir, source), write)


def load(out_dir: Path, model_class, layer: type[Int8Linear] = Int8Linear) -> nn.Module:
    """The stored int8 model (its linear layers as `layer`), its float layers built untouched and filled from the
    cache."""
    out_dir = Path(out_dir)
    config = AutoConfig.from_pretrained(out_dir)
    model = empty_model(model_class, config, torch.float32)
    rebuild(model, _read(out_dir / "model.safetensors"), layer)
    check_filled(model)
    model.generation_config = GenerationConfig.from_pretrained(out_dir)
    model.config._name_or_path = model.name_or_path = str(out_dir)
    return model


def _read(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file in its stored dtype, in process memory. safetensors hands out views of a
    memory map, which the page cache can evict mid-generation: each is copied, but for the int8 weights, which the
    packing copies anyway."""
    with safe_open(str(path), framework="pt") as f:
        return {name: f.get_tensor(name) if name.endswith(".qweight") else f.get_tensor(name).clone()
                for name in f.keys()}
