"""What "identical" promises for each kind of target, said where the result is shown."""
from types import SimpleNamespace

import pytest
import torch

from assistgen.comparison.compare import rounding_caveat, target_numerics


def pair(dtype, quantization="none"):
    model = SimpleNamespace(dtype=dtype)
    return SimpleNamespace(target=SimpleNamespace(model=model, spec=SimpleNamespace(quantization=quantization)))


@pytest.mark.parametrize("dtype,quantization,numerics,caveat", [
    (torch.float32, "none", "float32", None),
    (torch.float16, "none", "float16", "in float16, verifying several tokens at once rounds differently"),
    (torch.bfloat16, "none", "bfloat16", "in bfloat16, verifying several tokens at once rounds differently"),
    (torch.float32, "int8", "float32, bitsandbytes int8", "bitsandbytes quantizes activations as each pass runs"),
    (torch.float32, "w8a8", "w8a8: int8 weights, int8 inputs per token", None),   # row-invariant: exact
    (torch.float32, "dynamic_int8", "dynamic_int8: int8 weights, int8 inputs per pass", "one scale for the whole pass"),
])
def test_the_note_says_what_identical_means_for_the_targets_numerics(dtype, quantization, numerics, caveat):
    assert target_numerics(pair(dtype, quantization)) == numerics
    note = rounding_caveat(pair(dtype, quantization))
    assert note is None if caveat is None else caveat in note
