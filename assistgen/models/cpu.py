"""CPU speed-ups that keep the maths: oneDNN for the linear layers of fp32 models.

On this kind of CPU, MKL's fp32 GEMM is slow for the few-row products that verification needs: scoring 6 tokens
took ~4x one token through ``nn.Linear``, although both read the same weights once. oneDNN's linear, on a weight
packed once in its blocked layout, stays close to memory bandwidth, so verifying a window of drafts becomes cheap.
"""
from __future__ import annotations

import torch
from torch import nn

# The weight is packed for products of this many rows, and serves every other count too. Packed for one row (what
# ``Tensor.to_mkldnn`` gives), a product over 2 to 4 rows took 1.8x one row (8960 x 1536, as in the 1.5B's MLP);
# packed for 4, it took the time of one row, and the one-row product no longer. README, "A cheaper verification
# pass", has the curves.
PACKED_FOR_ROWS = 4


class OneDNNLinear(nn.Module):
    """``nn.Linear`` with its weight packed once in oneDNN's blocked layout, applied to dense activations (fp32, CPU,
    inference only): no conversion of the activations in or out at each call."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACKED_FOR_ROWS)
        self.register_buffer("weight", packed, persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available()


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


# Below this many rows MKL's matrix-vector path is as fast as oneDNN's on weights it has not packed (one-row passes of
# the offloaded 1.5B: 0.84 s against 0.95 s); from 3 rows on MKL's fp32 GEMM is slow and uneven (12 rows 2.0 s, 16
# rows 1.4 s) where oneDNN's grows smoothly (12 rows 1.3 s, 32 rows 1.6 s).
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


def materialize(model: nn.Module, *, onednn: bool) -> None:
    """Move memory-mapped weights into process memory, once: linear layers into oneDNN's layout when `onednn`,
    every other parameter by a plain copy."""
    if onednn:
        use_onednn_linears(model)
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            param.data = param.data.clone()
