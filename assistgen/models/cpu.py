"""CPU speed-ups that keep the maths: oneDNN for the linear layers of fp32 models.

On this kind of CPU, MKL's fp32 GEMM is slow for the few-row products that verification needs: scoring a few tokens
costs several times one token through ``nn.Linear``, although both read the same weights once. oneDNN's linear, on a
weight packed once in its blocked layout, stays close to memory bandwidth, so verifying a window of drafts is cheap.
"""
from __future__ import annotations

import ctypes
import functools
import os
import warnings
from typing import Callable

import torch
from torch import nn

from ..config import from_env

# The weight is packed for products of this many rows, and serves every other count too. Packed for one row (what
# ``Tensor.to_mkldnn`` gives), a product over 2 to 4 rows costs nearly twice one row; packed for 4, about one row's
# time, and the one-row product no more. docs/results.md, "verify(k)", has the curves.
PACKED_FOR_ROWS = 4

# Products of fewer rows than this are padded with zero rows to `PACKED_FOR_ROWS`. On the packed weight, oneDNN runs
# a one-row product through another kernel than two rows or more, with other rounding, and slower
# (`bench/scripts/linear_packing.py --model-rows`, `bench/results/row-padding`). Padded, a row's result is the same,
# bit for bit, whether it is computed alone (the baseline's step) or among the rows of a verification pass, and no
# slower. From three rows on the product runs about as fast as four.
PAD_BELOW_ROWS = 3


class OneDNNLinear(nn.Module):
    """``nn.Linear`` with its weight packed once in oneDNN's blocked layout, applied to dense activations (fp32, CPU,
    inference only): no conversion of the activations in or out at each call."""

    def __init__(self, linear: nn.Linear, packed: torch.Tensor | None = None, backing: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if packed is None:
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACKED_FOR_ROWS)
        self.register_buffer("weight", packed, persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone(), persistent=False)
        self._backing = backing   # the memory `packed` lives in (`mkldnn_tensor_from_blob`), kept alive with it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self._packed(x)
        except RuntimeError:   # oneDNN refuses the input (its dtype, width or device): do what nn.Linear does
            return self._plain(x)

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows >= PAD_BELOW_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.weight, self.bias, "none", [], "")
        padded = nn.functional.pad(x.reshape(rows, x.shape[-1]), (0, 0, 0, PACKED_FOR_ROWS - rows))
        out = torch.ops.mkldnn._linear_pointwise(padded, self.weight, self.bias, "none", [], "")
        return out[:rows].reshape(*x.shape[:-1], self.out_features)

    def _plain(self, x: torch.Tensor) -> torch.Tensor:
        """The plain linear layer on the unpacked weight, with a note: a right input gets its right result, a wrong
        one nn.Linear's own error, never oneDNN's."""
        warnings.warn(f"a packed linear layer ({self.in_features} -> {self.out_features}) cannot take an input of "
                      f"shape {tuple(x.shape)}, {x.dtype}, on {x.device}: computed by the plain layer instead",
                      RuntimeWarning, stacklevel=2)
        return nn.functional.linear(x, self.weight.to_dense(), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


# glibc's malloc maps each block over its threshold (at most 32 MB by default) afresh from the kernel and unmaps it
# when freed, so every such allocation page-faults and is zeroed anew. A pass over a long prompt allocates many: a
# 1,283-token prompt's MLP activations are 46 MB a layer in the 1.5B target. Kept in the heap instead (mmap threshold
# and trim threshold at 1 GB), that prompt pass took 3.6-3.7 s against 5.9-6.1 s (one-token steps alike), measured
# in alternate processes. The price: a process keeps the memory of its largest pass.
KEEP_FREED_BYTES = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # mallopt's parameters (malloc.h)


@functools.lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Have glibc keep freed blocks of up to `KEEP_FREED_BYTES` for reuse instead of returning them to the kernel;
    whether it took. Off with ASSISTGEN_KEEP_FREED_MEMORY=0 (to compare), and where the C library is not glibc."""
    if not from_env().keep_freed_memory:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, ctypes.c_int(KEEP_FREED_BYTES)) == 1 for param in (_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD))


def release_freed_memory() -> None:
    """Hand the heap's free memory back to the kernel (glibc's ``malloc_trim``), where freed blocks are kept for
    reuse: after a model is evicted or loaded, its freed weights and load-time copies would otherwise stay in the
    process. A pass's activations are freed and reused within the pass, so this costs the next pass nothing."""
    if keep_freed_memory():   # glibc's, then: it took the thresholds
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def onednn_enabled() -> bool:
    """Whether CPU fp32 models run oneDNN's linear layers: on unless ASSISTGEN_ONEDNN=0 (to compare with MKL's)."""
    return from_env().onednn


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available()


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX tiles), where oneDNN's bfloat16 products
    run at twice its float32 rate; without it they are emulated, and slower."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):
        return False


@functools.lru_cache(maxsize=1)
def _libtorch():
    """libtorch_cpu's C functions that wrap memory as a oneDNN tensor (the ones AOTInductor's compiled models use
    for their packed constants); None where this torch build lacks them."""
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        create = lib.aoti_torch_create_tensor_from_blob_v2
        for name in ("aoti_torch_dtype_float32", "aoti_torch_device_type_cpu", "aoti_torch_layout__mkldnn"):
            getattr(lib, name).restype = ctypes.c_int32
        create.restype = ctypes.c_int32
        create.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                           ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p),
                           ctypes.c_int32, ctypes.c_char_p, ctypes.c_int64]
        ctypes.pythonapi.PyCapsule_New.restype = ctypes.py_object
        ctypes.pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr  # noqa: B018 (present?)
        return lib
    except (OSError, AttributeError):
        return None


def blob_tensors_available() -> bool:
    return _libtorch() is not None


def mkldnn_tensor_from_blob(backing: torch.Tensor, shape: list[int], metadata: bytes) -> torch.Tensor:
    """A fp32 oneDNN tensor of `shape` whose packed bytes are `backing`'s (not copied: keep `backing` alive as long
    as the tensor), laid out as `metadata` (``torch.ops.mkldnn._get_mkldnn_serialized_md`` of the packed tensor the
    bytes came from) says."""
    lib = _libtorch()
    if lib is None:
        raise RuntimeError("this torch build cannot wrap packed oneDNN weights")
    if backing.dtype != torch.uint8 or not backing.is_contiguous() or backing.device.type != "cpu":
        raise ValueError("the packed bytes must be a contiguous uint8 CPU tensor")
    sizes = (ctypes.c_int64 * len(shape))(*shape)
    strides = (ctypes.c_int64 * len(shape))(*[1] * len(shape))
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    handle = ctypes.c_void_p()
    rc = lib.aoti_torch_create_tensor_from_blob_v2(
        backing.data_ptr(), len(shape), sizes, strides, 0, lib.aoti_torch_dtype_float32(),
        lib.aoti_torch_device_type_cpu(), 0, ctypes.byref(handle), lib.aoti_torch_layout__mkldnn(), metadata,
        len(metadata))
    if rc != 0 or not handle.value:
        raise RuntimeError("wrapping packed oneDNN weights failed")
    tensor = torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr(
        ctypes.pythonapi.PyCapsule_New(handle.value, None, None))
    if torch.ops.mkldnn._nbytes(tensor) != backing.numel():
        raise ValueError(f"the packed bytes ({backing.numel()}) do not match the layout "
                         f"({torch.ops.mkldnn._nbytes(tensor)})")
    return tensor


# A weight tied to another module (an output layer sharing the embeddings) is packed as a second copy up to this
# size, the embedding keeping its own: Whisper base's 106 MB output layer, read in every pass, verified 4 rows for
# the price of 2.3 through MKL. Larger ones stay shared and unpacked.
TIED_COPY_MAX_BYTES = 512 * 2**20


def use_onednn_linears(model: nn.Module) -> int:
    """Swap every fp32 CPU ``nn.Linear`` for OneDNNLinear, in place; returns how many were swapped.

    A weight tied to another module (e.g. lm_head to the embeddings) is packed as a copy only up to
    `TIED_COPY_MAX_BYTES`, and otherwise left alone.
    """
    if not onednn_available():
        return 0
    shared = {id(p) for name, module in model.named_modules() if not isinstance(module, nn.Linear)
              for p in module.parameters(recurse=False)}
    swapped = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is not nn.Linear or child.weight.device.type != "cpu" or child.weight.dtype != torch.float32:
                continue
            if id(child.weight) not in shared or child.weight.numel() * 4 <= TIED_COPY_MAX_BYTES:
                setattr(module, child_name, OneDNNLinear(child))
                swapped += 1
    return swapped


# Below this many rows MKL's matrix-vector path is as fast as oneDNN's on weights it has not packed; from 3 rows on
# MKL's fp32 GEMM is slow and uneven where oneDNN's grows smoothly.
DENSE_ONEDNN_FROM_ROWS = 3


def _dense_linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.numel() // x.shape[-1] < DENSE_ONEDNN_FROM_ROWS:
        return nn.functional.linear(x, module.weight, module.bias)
    return torch.ops.mkldnn._linear_pointwise(x, module.weight, module.bias, "none", [], "")


def onednn_for_offloaded(model: nn.Module) -> int:
    """oneDNN's linear for the layers accelerate reads back from disk at every pass, on the weight as it was read
    (nothing to pack: the weight is new at every pass); returns how many layers it took over.

    accelerate wraps each offloaded layer's forward, which it keeps as ``_old_forward``, in a hook that loads the
    weight first; the hook stays and calls this instead.
    """
    if not onednn_available():
        return 0
    swapped = 0
    for module in model.modules():
        if (type(module) is nn.Linear and hasattr(module, "_hf_hook") and hasattr(module, "_old_forward")
                and getattr(module._hf_hook, "offload", False)):
            module._old_forward = lambda x, module=module: _dense_linear(module, x)
            swapped += 1
    return swapped


def materialize(model: nn.Module, *, onednn: bool, packed: Callable[[nn.Module], int] | None = None) -> None:
    """Move memory-mapped weights into process memory, once: linear layers into oneDNN's layout when `onednn`
    (those `packed` puts in from the cache's store stay mapped, locked where allowed), every other parameter by a
    plain copy."""
    if onednn:
        if packed is not None:
            packed(model)
        use_onednn_linears(model)
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            param.data = param.data.clone()
