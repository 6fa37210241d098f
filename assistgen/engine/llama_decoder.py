"""A Llama-style decoder (Llama, Qwen2: SmolLM2 and the Qwen2.5 assistants) for an assistant's drafts: the same
arithmetic as transformers' modules, op for op, as a plain loop over the layers.

A small assistant's one-token step through `model(...)` spends much of its time in transformers' cache object, masks
and module calls rather than in its products; this loop gives the same logits, bit for bit, without them. Here:

- the self-attention's query, key and value projections are one product (`fusing.fused_qkv`), and so are the MLP's
  gate and up projections (`fusing.fused_gate_up`);
- the keys and values live in one buffer per layer, grown by doubling (each feed says where it starts, so rejected
  drafts are simply written over);
- no mask for one new token; an explicit causal mask when several are fed at once.

It runs every assistant of these families, and one kind of target: a row-invariant one (w8a8,
`attention.separate_prompt_pass`), with `row_invariant=True`. Then each row of a pass that continues the buffers
attends exactly as a one-token step does (`attention` says why), so a verification pass gives each draft's position
the baseline's logits, bit for bit, and the baseline runs through this same loop. A float target stays with
transformers' modules, whose greedy output the tests compare with transformers' own. Tests hold its logits to
transformers' on tiny random Llama and Qwen2 models, and its verification passes to its one-token steps.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .fusing import fused_gate_up, fused_qkv

FAMILIES = ("llama", "qwen2")
FIRST_CAPACITY = 256   # positions each layer's key and value buffers hold at first


def supports(model) -> bool:
    """Whether `model` is a Llama-style decoder this module runs: full causal attention in every layer, SiLU MLPs."""
    config = model.config
    inner = getattr(model, "model", None)
    return (getattr(config, "model_type", None) in FAMILIES and not config.is_encoder_decoder
            and getattr(config, "hidden_act", None) == "silu" and not getattr(config, "use_sliding_window", False)
            and all(t == "full_attention" for t in (getattr(config, "layer_types", None) or []))
            and inner is not None and hasattr(inner, "rotary_emb") and hasattr(model, "lm_head"))


def _rms_norm(norm: nn.Module):
    """transformers' RMSNorm as a plain function (its arithmetic, in its order)."""
    weight, eps = norm.weight, norm.variance_epsilon

    def apply(x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    return apply


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (transformers' `apply_rotary_pos_emb` for one tensor)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class _Layer:
    """One decoder layer's products (each module's own forward), its norms and its key and value buffers."""

    def __init__(self, layer, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        attention, mlp = layer.self_attn, layer.mlp
        self.qkv = fused_qkv(attention).forward
        self.o_proj = attention.o_proj.forward
        self.gate_up, self.down = fused_gate_up(mlp).forward, mlp.down_proj.forward
        self.intermediate = mlp.gate_proj.out_features
        self.input_norm = _rms_norm(layer.input_layernorm)
        self.post_norm = _rms_norm(layer.post_attention_layernorm)
        self.scaling = attention.scaling
        self.keys = torch.empty(1, kv_heads, FIRST_CAPACITY, head_dim, dtype=dtype, device=device)
        self.values = torch.empty_like(self.keys)

    def reserve(self, end: int) -> None:
        """Room for `end` positions, keeping what the buffers hold."""
        capacity = self.keys.shape[2]
        if end <= capacity:
            return
        while capacity < end:
            capacity *= 2
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:2], capacity, old.shape[3])
            new[:, :, :old.shape[2]] = old
            setattr(self, name, new)


class LlamaDecoderStep:
    """Logits for new tokens of one Llama-style model, with its own key and value buffers.

    `logits(new, start, keep)`: `new` (a list of token ids) continues the first `start` tokens already fed (anything
    the buffers held beyond `start` is dropped); returns the logits ``(keep, vocab)`` after each of the last `keep`.
    """

    @torch.inference_mode()
    def __init__(self, model, *, row_invariant: bool = False):
        config = model.config
        self.row_invariant = row_invariant
        self.device = model.device
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.max_length = getattr(config, "max_position_embeddings", None)
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.final_norm = _rms_norm(inner.norm)
        self.lm_head = model.lm_head.forward
        # an int8 output layer packed in row blocks: its first block, and rows of the later ones, for drafts
        # (`logits(..., extra_ids=...)`)
        head = model.lm_head
        first_rows = getattr(head, "first_rows", None)
        self.common_vocab = (first_rows if not row_invariant and first_rows is not None
                             and first_rows < head.out_features else None)
        self._head = head
        self._extra: tuple[tuple[int, ...], torch.Tensor, torch.Tensor | None] | None = None   # the last extra ids
        self.layers = [_Layer(layer, self.kv_heads, self.head_dim, model.dtype, self.device) for layer in inner.layers]

    @torch.inference_mode()
    def logits(self, new: list[int], start: int, keep: int = 1, *, prompt: bool = False,
               extra_ids: tuple[int, ...] | None = None) -> torch.Tensor:
        """`prompt`: the new tokens are the rest of a prompt whose kept beginning fills the buffers
        (`prefix_cache`), read as one pass of the fused kernel, as a prompt is, even in a row-invariant model (the
        baseline and the assisted run both read it so). `extra_ids` (where `common_vocab` is set): the logits of the
        first `common_vocab` ids only, from the output layer's first block, then of `extra_ids` (each above them),
        in that order, instead of every id's."""
        n = len(new)
        end = start + n
        if self.max_length is not None and end > self.max_length:
            raise ValueError(f"the model reads at most {self.max_length} tokens, got {end}")
        hidden = self.embed(torch.tensor([new], dtype=torch.long, device=self.device))
        positions = torch.arange(start, end, device=self.device).unsqueeze(0)
        cos, sin = self.rotary(hidden, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)   # (1, 1, tokens, head_dim): broadcast over the heads
        mask = None
        if n > 1:   # row i sees the buffers and the new tokens up to its own
            mask = torch.ones(n, end, dtype=torch.bool, device=self.device).tril(diagonal=start)
        for layer in self.layers:
            layer.reserve(end)
            hidden = hidden + self._attention(layer, layer.input_norm(hidden), start, end, cos, sin, mask, prompt)
            x = layer.post_norm(hidden)
            gate, up = layer.gate_up(x).split(layer.intermediate, dim=-1)
            hidden = hidden + layer.down(F.silu(gate) * up)
        hidden = self.final_norm(hidden[:, n - keep:])
        if extra_ids is None or not self.common_vocab:
            return self.lm_head(hidden)[0].float()
        logits = self._head.first_block(hidden)
        if extra_ids:
            logits = torch.cat([logits, self._extra_logits(hidden, extra_ids)], dim=-1)
        return logits[0].float()

    def _extra_logits(self, hidden: torch.Tensor, ids: tuple[int, ...]) -> torch.Tensor:
        """The logits of the output layer's rows `ids` (past its first block), from their int8 weights dequantized
        (a few rows: a float product costs microseconds where fbgemm's call costs milliseconds)."""
        if self._extra is None or self._extra[0] != ids:
            weight, scale, bias = self._head.later_rows
            index = torch.tensor(ids, dtype=torch.long) - self.common_vocab
            rows = (weight[index].float() * scale[index, None]).t().contiguous()
            self._extra = (ids, rows, None if bias is None else bias[index].float())
        _, rows, bias = self._extra
        out = hidden.float() @ rows
        return (out if bias is None else out + bias).to(hidden.dtype)

    def key_values(self, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of every layer's keys and values for the first `end` positions (for `prefix_cache`)."""
        return [(layer.keys[:, :, :end].clone(), layer.values[:, :, :end].clone()) for layer in self.layers]

    def load(self, key_values: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Fill the buffers' first positions with `key_values` (from `key_values`), as though those tokens had been
        fed."""
        for layer, (keys, values) in zip(self.layers, key_values, strict=True):
            end = keys.shape[2]
            layer.reserve(end)
            layer.keys[:, :, :end] = keys
            layer.values[:, :, :end] = values

    def _attention(self, layer: _Layer, x, start: int, end: int, cos, sin, mask, prompt: bool) -> torch.Tensor:
        n = x.shape[1]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = layer.qkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = _rotate(q.view(1, n, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        layer.keys[:, :, start:end] = _rotate(k.view(1, n, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        layer.values[:, :, start:end] = v.view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.row_invariant and start > 0 and n > 1 and not prompt:   # each row as its one-token step computes it
            out = torch.cat([self._sdpa(layer, q[:, :, i:i + 1], start + i + 1, None) for i in range(n)], dim=2)
        else:
            out = self._sdpa(layer, q, end, mask)
        return layer.o_proj(out.transpose(1, 2).reshape(1, n, q_size))

    def _sdpa(self, layer: _Layer, q: torch.Tensor, end: int, mask) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, layer.keys[:, :, :end], layer.values[:, :, :end], attn_mask=mask,
                                              scale=layer.scaling, enable_gqa=self.heads != self.kv_heads)
