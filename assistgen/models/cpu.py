"""CPU speed-ups that keep the maths: oneDNN for the linear layers of fp32 models.

On this kind of CPU, MKL's fp32 GEMM is slow for the few-row products that verification needs: scoring 6 tokens
took ~4x one token through ``nn.Linear``, although both read the same weights once. oneDNN's packed-weight linear
stays close to memory bandwidth (6 rows cost ~1.5x one row), so verifying a window of drafts becomes cheap, and
one-token steps get a little faster too.
"""
from __future__ import annotations

import torch
from torch import nn


class OneDNNLinear(nn.Module):
    """``nn.Linear`` with its weight in oneDNN's blocked layout (fp32, CPU, inference only)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", linear.weight.detach().to_mkldnn(), persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch._C._nn.mkldnn_linear(x.contiguous().to_mkldnn(), self.weight, self.bias).to_dense()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available()


def use_onednn_linears(model: nn.Module) -> int:
    """Swap every fp32 CPU ``nn.Linear`` for OneDNNLinear, in place; returns how many were swapped.

    Weights tied to another module (e.g. lm_head to the embeddings) are left alone, so nothing is stored twice.
    """
    if not onednn_available():
        return 0
    shared = {id(p) for name, module in model.named_modules() if not isinstance(module, nn.Linear)
              for p in module.parameters(recurse=False)}
    swapped = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if (type(child) is nn.Linear and child.weight.device.type == "cpu"
                    and child.weight.dtype == torch.float32 and id(child.weight) not in shared):
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
