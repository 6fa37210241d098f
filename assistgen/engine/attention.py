"""Row-invariant attention: each new token of a pass attends exactly as it would in a one-token step.

Exact assisted generation needs a verification pass over k tokens to give each of them what the baseline's one-token
steps give. A target whose matrix products are row-invariant (`models.quantized.RowInt8Linear`) still differs in its
attention: torch's fused attention blocks its query rows by their number, so a row among k is computed in another
order than alone. The differences are tiny in float32 (about 1e-6), but a model that quantizes its activations
rounds some of them the other way, and a logit moves by up to 1.

Here a pass that continues a cache computes its rows one at a time, each exactly the call a one-token step makes:
one query row against the keys and values up to its own position, no mask. A pass with no cache (a prompt) is left
to the fused kernel: the baseline and the assisted run make that very pass, as long as the assisted run does not
append its first drafts to it (`kv.CachedDecoder` verifies them in a pass of their own, `separate_prompt_pass`).
Each row costs a call per layer: for a window of drafts, a few milliseconds a pass.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ROW_INVARIANT = "assistgen_row_invariant"


def row_invariant_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention as transformers' interface calls it, ``(batch, heads, rows, head_dim)`` in, ``(batch, rows, heads,
    head_dim)`` out: a pass with no cache as one call to torch's fused attention, any other row by row."""
    rows, total = query.shape[2], key.shape[2]
    if rows == total or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    past = total - rows
    outs = [sdpa_attention_forward(module, query[:, :, i:i + 1], key[:, :, :past + i + 1], value[:, :, :past + i + 1],
                                   None, scaling=scaling, dropout=dropout, **kwargs)[0]
            for i in range(rows)]
    return (outs[0] if rows == 1 else torch.cat(outs, dim=1)), None


AttentionInterface.register(ROW_INVARIANT, row_invariant_attention)


def use_row_invariant_attention(model) -> None:
    """Point a decoder-only transformers model's attention at `row_invariant_attention` (its modules read the
    config's choice at every call)."""
    model.config._attn_implementation = ROW_INVARIANT


def separate_prompt_pass(model) -> bool:
    """Whether `model`'s prompt must be read in a pass of its own, drafts never appended to it."""
    return getattr(model.config, "_attn_implementation", None) == ROW_INVARIANT
