"""oneDNN's linear on a packed weight: the maths of ``nn.Linear``, and a row's result the same bit for bit whether it
is computed alone (a baseline step) or among the rows of a verification pass."""

import pytest
import torch
from torch import nn

from assistgen.models import cpu
from helpers import AVX512, host_has, needs_cpu_feature

pytestmark = needs_cpu_feature("oneDNN's packed linear", cpu.onednn_available, *AVX512)


@pytest.mark.skipif(not host_has(*AVX512), reason="the host's CPU has no AVX-512")
def test_an_avx512_host_has_onednn():
    assert cpu.onednn_available()


def _layer(seed=0, n_in=384, n_out=1024):
    torch.manual_seed(seed)
    linear = nn.Linear(n_in, n_out)
    return linear, cpu.OneDNNLinear(linear)


@pytest.mark.parametrize("shape", [(1, 384), (2, 384), (1, 1, 384), (1, 2, 384), (1, 3, 384), (2, 5, 384)])
def test_the_packed_linear_computes_what_nn_linear_does(shape):
    linear, packed = _layer()
    x = torch.randn(*shape)
    with torch.inference_mode():
        out = packed(x)
        assert out.shape == linear(x).shape
        torch.testing.assert_close(out, linear(x), rtol=1e-4, atol=1e-4)


def _row_alone_and_among_others(packed, rows):
    torch.manual_seed(1)
    x = torch.randn(1, 8, packed.in_features)
    with torch.inference_mode():
        among = packed(x[:, :rows])
        alone = torch.cat([packed(x[:, i:i + 1]) for i in range(rows)], dim=1)
    return alone, among


@pytest.mark.parametrize("rows", [2, 3, 4, 8])
def test_a_row_computed_alone_is_bitwise_the_row_computed_among_others(rows):
    _, packed = _layer(n_in=1536, n_out=2048)
    alone, among = _row_alone_and_among_others(packed, rows)
    assert torch.equal(alone, among)


@pytest.mark.parametrize("rows,computed", [(1, (4, 384)), (2, (4, 384)), (3, (1, 3, 384)), (5, (1, 5, 384))])
def test_one_and_two_rows_reach_onednn_padded_to_the_packed_four(monkeypatch, rows, computed):
    """What makes a row's result independent of its company: oneDNN's one-row kernel rounds otherwise on some CPUs
    (not on every one, so the bitwise test above may hold unpadded too); products under three rows run on the weight's
    packed shape of four rows, and the extra rows are dropped."""
    _, packed = _layer()
    shapes, linear_pointwise = [], torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise",
                        lambda x, *args: shapes.append(tuple(x.shape)) or linear_pointwise(x, *args))
    with torch.inference_mode():
        out = packed(torch.randn(1, rows, 384))
    assert shapes == [computed]
    assert out.shape == (1, rows, 1024)


def test_an_input_the_packed_path_cannot_take_goes_to_the_plain_layer_with_a_note():
    linear, packed = _layer(n_in=32, n_out=16)
    wide = torch.randn(3, 64)   # another model's width: nn.Linear's own error, not oneDNN's
    with pytest.raises(RuntimeError, match="cannot be multiplied") as plain:
        linear(wide)
    with pytest.warns(RuntimeWarning, match="computed by the plain layer"), pytest.raises(RuntimeError) as error:
        packed(wide)
    assert str(error.value) == str(plain.value)


def test_freed_blocks_are_kept_for_reuse_unless_turned_off(monkeypatch):
    """glibc unmaps a freed block over its threshold and maps it afresh, zeroed, for the next pass: the loader raises
    both thresholds so that a long prompt's activations reuse their memory."""
    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append((param, value.value))
            return 1
    monkeypatch.setattr(cpu.ctypes, "CDLL", lambda name: FakeLibc())
    cpu.keep_freed_memory.cache_clear()
    try:
        monkeypatch.setenv("ASSISTGEN_KEEP_FREED_MEMORY", "0")
        assert cpu.keep_freed_memory() is False and calls == []
        cpu.keep_freed_memory.cache_clear()
        monkeypatch.delenv("ASSISTGEN_KEEP_FREED_MEMORY")
        assert cpu.keep_freed_memory() is True
        assert sorted(calls) == [(-3, cpu.KEEP_FREED_BYTES), (-1, cpu.KEEP_FREED_BYTES)]   # mmap, then trim threshold
        trims = []
        FakeLibc.malloc_trim = lambda self, pad: trims.append(pad)
        cpu.release_freed_memory()   # what an eviction or a load then does: the heap's free memory handed back
        assert trims == [0]
    finally:
        cpu.keep_freed_memory.cache_clear()


def test_the_machine_names_its_cpu_and_the_vector_extensions_the_kernels_pick_by():
    from assistgen.models.machine import machine
    facts = machine()
    extensions = set(facts["vector_extensions"])
    assert facts["cpu"] and extensions <= {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8",
                                           "amx_bf16"}
    # what the JSON names is what torch's kernels find
    assert ("avx512_bf16" in extensions) == torch.cpu._is_avx512_bf16_supported()
    assert ("avx512_vnni" in extensions) == torch.cpu._is_vnni_supported()
    assert ("amx_tile" in extensions) == torch.cpu._is_amx_tile_supported()
