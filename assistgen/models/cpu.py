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


def materialize(model: nn.Module, *, onednn: bool) -> None:
    """Move memory-mapped weights into process memory, once: linear layers into oneDNN's layout when `onednn`,
    every other parameter by a plain copy."""
    if onednn:
        use_onednn_linears(model)
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            param.data = param.data.clone()
