"""A Llama-style decoder (Llama, Qwen2) on a GPU: one-token steps and verification passes from a static KV cache,
each captured once as a CUDA graph and replayed.

On a GPU a pass over one row, or a few, is bound by kernel launches, not by memory: through transformers' eager
modules Qwen2.5 0.5B's one-token step took 15 ms on an H200 against the 7B target's 18 ms, so an assistant cost nearly
what it saves. Replayed as a CUDA graph, a pass launches as one and costs about what reading its weights costs
(gpt-fast's design: a static cache, `torch.cuda.CUDAGraph`, not `torch.compile`, which ZeroGPU does not run).

A graph replays fixed shapes at fixed addresses, so here:

- each layer's keys and values live in one buffer of `capacity` positions allocated up front, plus a trash slot at
  position `capacity`;
- a pass of n new tokens is padded to the next row count of `ROWS`, one graph each. A padding row is read at
  position `capacity`: it writes only the trash slot, which every real row masks, and its logits are dropped, so it
  never changes a real row's;
- every pass attends over the whole buffer, each row to the slots up to its own position. Slots past it hold rejected
  drafts, another sequence's tokens or nothing, and are masked, so a rollback only moves where the next pass starts;
- a pass longer than the largest row count (a prompt) runs eagerly, unpadded, over the slots up to its end;
- a sequence longer than the buffers doubles them (the graphs are then captured again, once).

The pass itself (`StaticDecoder.forward`) is a plain function of tensors; the graphs are a thin layer over it
(`CapturedPasses`), captured at the pair's warm-up (`prepare_graphs`) or on a row count's first use. Off a GPU the same padded passes run
eagerly, which is how the tests hold them to transformers' logits on the CPU. The products are the model's own
modules, unfused: under a graph fusing buys little, and a 7B target's fused MLP would be 7.6 GB more.

One `StaticDecoder` per model (`shared`), kept while the model lives, so a process captures its graphs once, not
once per generation. Each `kv.CachedDecoder` reads through its own `StaticCacheStep`, which reads its prefix again
when another decoder of the same model (the speed probe's, an earlier run's) wrote the buffers since.

Encoder-decoder models (Whisper) are not covered yet: they keep transformers' modules on a GPU.
"""
from __future__ import annotations

import weakref
from typing import Callable, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from . import attention, llama_decoder
from .llama_decoder import _rms_norm, _rotate

ROWS = (1, 2, 4, 8, 16, 32)   # the row counts captured: an assistant's step (1, 2), a target's verification (2-32)
CAPACITY = 4096               # positions the buffers hold at first: a 2048-token prompt and its answer
WARM_UP_PASSES = 2            # eager passes on a side stream before a capture, as torch's CUDA graph notes ask


STATIC_ROPE = ("default", "linear", "llama3", "yarn")   # rotary embeddings whose frequencies never change in a pass


def supports(model) -> bool:
    """Whether `model` runs here: a Llama-style decoder (`llama_decoder.supports`) of plain `nn.Linear` products (no
    int8 layer, whose CPU kernels a graph cannot hold), transformers' own attention (not the row-invariant one) and
    a rotary embedding that a graph can hold (not a dynamic one, which recomputes its frequencies by length)."""
    if not llama_decoder.supports(model) or attention.separate_prompt_pass(model):
        return False
    if getattr(model.model.rotary_emb, "rope_type", "default") not in STATIC_ROPE:
        return False
    products = [model.lm_head]
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        products += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    return all(type(p) is nn.Linear for p in products)


def use_static_steps(model) -> bool:
    """Whether `kv.CachedDecoder` runs `model` through graph-captured static-cache steps: on a CUDA device, when the
    model runs here. Everywhere else it keeps its decoder (transformers' modules, or `llama_decoder`'s)."""
    return torch.device(model.device).type == "cuda" and supports(model)


class _Layer(NamedTuple):
    q: nn.Module
    k: nn.Module
    v: nn.Module
    o: nn.Module
    gate: nn.Module
    up: nn.Module
    down: nn.Module
    input_norm: object
    post_norm: object
    scaling: float


class _Captured(NamedTuple):
    graph: "torch.cuda.CUDAGraph"
    inputs: torch.Tensor   # (2, rows): token ids, then positions; copied into before each replay
    logits: torch.Tensor   # (rows, vocab) in the model's dtype, written by each replay


class CapturedPasses:
    """The thin layer over a pass: `run` (inputs ``(2, rows)``, token ids then positions, to logits ``(rows,
    vocab)``) captured once per row count as a CUDA graph over static tensors, then replayed with new inputs copied
    in. A capture reads `padding(rows)`, inputs that write nothing a real row reads; the graphs share one memory
    pool."""

    def __init__(self, run: Callable[[torch.Tensor], torch.Tensor], padding: Callable[[int], torch.Tensor],
                 device: torch.device):
        self.run, self.padding, self.device = run, padding, device
        self.captured: dict[int, _Captured] = {}
        self._pool = None

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """The graph's output for `inputs` ``(2, rows)``: valid until its next replay."""
        rows = inputs.shape[1]
        captured = self.captured.get(rows) or self.capture(rows)
        captured.inputs.copy_(inputs)
        captured.graph.replay()
        return captured.logits

    def capture(self, rows: int) -> _Captured:
        """Capture the pass of `rows` rows, warmed up first on a side stream (as torch's CUDA graph notes ask)."""
        inputs = self.padding(rows).to(self.device)
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARM_UP_PASSES):
                self.run(inputs)
        current.wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self.run(inputs)
        self.captured[rows] = _Captured(graph, inputs, logits)
        return self.captured[rows]


class StaticDecoder:
    """One model's static KV cache and its passes.

    `logits(new, start, keep)`: `new` (token ids) continues the first `start` positions of the buffers; returns the
    logits ``(keep, vocab)`` (float32) after each of the last `keep` of them. `graphs`: replay CUDA graphs (default:
    when the model is on a CUDA device); without, the same padded passes run eagerly.
    """

    @torch.inference_mode()
    def __init__(self, model, *, capacity: int = CAPACITY, rows: tuple[int, ...] = ROWS, graphs: bool | None = None):
        config = model.config
        self.device = torch.device(model.device)
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.limit = getattr(config, "max_position_embeddings", None)
        self.rows = tuple(sorted(rows))
        self.pad_token = 0
        self.owner: object | None = None   # the `StaticCacheStep` whose sequence the buffers hold
        self.weights: tuple[int, ...] = ()  # where the model's weights were when this was made (`shared`)
        inner = model.model
        self.embed, self.rotary, self.lm_head = inner.embed_tokens, inner.rotary_emb, model.lm_head
        self.final_norm = _rms_norm(inner.norm)
        self.layers = [_Layer(l.self_attn.q_proj, l.self_attn.k_proj, l.self_attn.v_proj, l.self_attn.o_proj,
                              l.mlp.gate_proj, l.mlp.up_proj, l.mlp.down_proj, _rms_norm(l.input_layernorm),
                              _rms_norm(l.post_attention_layernorm), l.self_attn.scaling)
                       for l in inner.layers]
        self._dtype = model.dtype
        graphs = self.device.type == "cuda" if graphs is None else graphs
        self.graphs = CapturedPasses(self._padded, self._padding, self.device) if graphs else None
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.capacity = 0
        self._allocate(capacity if self.limit is None else min(capacity, self.limit))

    def _allocate(self, capacity: int) -> None:
        """Buffers of `capacity` positions and the trash slot, keeping the positions the old ones held; the graphs,
        which read the old ones, are dropped."""
        shape = (1, self.kv_heads, capacity + 1, self.head_dim)
        for buffers in (self.keys, self.values):
            for i in range(len(self.layers)):
                new = torch.zeros(shape, dtype=self._dtype, device=self.device)
                if i < len(buffers):
                    new[:, :, :self.capacity] = buffers[i][:, :, :self.capacity]
                    buffers[i] = new
                else:
                    buffers.append(new)
        self.capacity = capacity
        self._slots = torch.arange(capacity + 1, device=self.device)
        if self.graphs is not None:
            self.graphs.captured.clear()

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: int) -> torch.Tensor:
        """Logits ``(rows, vocab)`` in the model's dtype for `tokens` ``(1, rows)`` at `positions` ``(1, rows)``,
        each row attending to the first `slots` slots of the buffers up to its own position. Writes each row's key
        and value at its position. `slots` 0: a prompt at positions 0 to rows - 1, attended causally, no mask (so
        that fused attention kernels take it)."""
        hidden = self.embed(tokens)
        cos, sin = self.rotary(hidden, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)   # (1, 1, rows, head_dim): broadcast over the heads
        index = positions[0]
        mask = None
        if slots:   # (rows, slots): a row sees the slots up to its own position; once per query head sharing a key head
            mask = (self._slots[:slots] <= index[:, None]).repeat(self.heads // self.kv_heads, 1)
        for layer, keys, values in zip(self.layers, self.keys, self.values):
            hidden = hidden + self._attention(layer, keys, values, layer.input_norm(hidden), cos, sin, index, mask)
            x = layer.post_norm(hidden)
            hidden = hidden + layer.down(F.silu(layer.gate(x)) * layer.up(x))
        return self.lm_head(self.final_norm(hidden))[0]

    def _attention(self, layer: _Layer, keys, values, x, cos, sin, index, mask) -> torch.Tensor:
        rows = x.shape[1]
        q = _rotate(layer.q(x).view(1, rows, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        k = _rotate(layer.k(x).view(1, rows, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        keys.index_copy_(2, index, k)
        values.index_copy_(2, index, layer.v(x).view(1, rows, self.kv_heads, self.head_dim).transpose(1, 2))
        if mask is None:   # a prompt from position 0: causal, left to the fused kernels
            out = F.scaled_dot_product_attention(q, keys[:, :, :rows], values[:, :, :rows], is_causal=True,
                                                 scale=layer.scaling, enable_gqa=self.heads != self.kv_heads)
        else:   # the query heads that share a key head as rows of one query: each key head read once, not copied
            slots = mask.shape[1]
            grouped = q.reshape(1, self.kv_heads, mask.shape[0], self.head_dim)
            out = F.scaled_dot_product_attention(grouped, keys[:, :, :slots], values[:, :, :slots], attn_mask=mask,
                                                 scale=layer.scaling).reshape(1, self.heads, rows, self.head_dim)
        return layer.o(out.transpose(1, 2).reshape(1, rows, self.heads * self.head_dim))

    def _padded(self, inputs: torch.Tensor) -> torch.Tensor:
        """A padded pass: `inputs` ``(2, rows)``, token ids then positions, over the whole buffers."""
        return self.forward(inputs[:1], inputs[1:], self.capacity + 1)

    def _padding(self, rows: int) -> torch.Tensor:
        """Inputs of `rows` padding rows: they write only the trash slot."""
        return torch.tensor([[self.pad_token] * rows, [self.capacity] * rows], dtype=torch.long)

    @torch.inference_mode()
    def logits(self, new: list[int], start: int, keep: int = 1) -> torch.Tensor:
        n = len(new)
        end = start + n
        if self.limit is not None and end > self.limit:
            raise ValueError(f"the model reads at most {self.limit} tokens, got {end}")
        if end > self.capacity:
            capacity = self.capacity
            while capacity < end:
                capacity *= 2
            self._allocate(capacity if self.limit is None else min(capacity, self.limit))
        rows = next((r for r in self.rows if r >= n), None)
        if rows is None:   # longer than any captured pass: eagerly, unpadded, over the slots up to its end
            out = self.forward(torch.tensor([new], device=self.device),
                               torch.arange(start, end, device=self.device).unsqueeze(0), end if start else 0)
        else:
            inputs = torch.cat([torch.tensor([list(new), list(range(start, end))]), self._padding(rows - n)], dim=1)
            out = self.graphs.logits(inputs) if self.graphs is not None else self._padded(inputs.to(self.device))
        return out[n - keep:n].to(torch.float32, copy=True)   # a copy: the next replay writes over the graph's output

    @torch.inference_mode()
    def capture(self) -> list[int]:
        """Capture every row count's pass not yet captured, the largest first (the smaller ones then reuse its
        memory); the row counts captured. Nothing without graphs."""
        if self.graphs is None:
            return []
        done = [rows for rows in reversed(self.rows) if rows not in self.graphs.captured]
        for rows in done:
            self.graphs.capture(rows)
        torch.cuda.synchronize(self.device)
        return done


_shared: "weakref.WeakKeyDictionary[nn.Module, StaticDecoder]" = weakref.WeakKeyDictionary()


def _weights_at(model) -> tuple[int, ...]:
    return tuple(p.data_ptr() for p in model.parameters())


def shared(model) -> StaticDecoder:
    """`model`'s one `StaticDecoder`, made on first use and kept while the model lives, or made again when the
    model's weights have moved since (`model.to`, ZeroGPU moving them onto its GPU): a graph reads them where they
    were when it was captured."""
    decoder = _shared.get(model)
    weights = _weights_at(model)
    if decoder is None or decoder.weights != weights:
        decoder = _shared[model] = StaticDecoder(model)
        decoder.weights = weights
    return decoder


def prepare_graphs(model) -> list[int]:
    """Capture `model`'s passes now, outside any timed run (a pair's warm-up): the row counts captured, [] where the
    model does not run through graphs (`use_static_steps`) or they were captured already."""
    return shared(model).capture() if use_static_steps(model) else []


class StaticCacheStep:
    """`kv.CachedDecoder`'s step through its model's shared `StaticDecoder` (the interface of
    `llama_decoder.LlamaDecoderStep`): `logits(new, start, keep)`, `new` continuing the first `start` tokens fed.

    It remembers the tokens it fed, so that when another decoder of the same model has written the buffers since,
    it reads its first `start` tokens again in the same pass."""

    def __init__(self, model, decoder: StaticDecoder | None = None):
        self.decoder = shared(model) if decoder is None else decoder
        self.device = self.decoder.device
        self._fed: list[int] = []
        self._key = object()

    def logits(self, new: list[int], start: int, keep: int = 1) -> torch.Tensor:
        if self.decoder.owner is not self._key and start > 0:
            new, start = self._fed[:start] + list(new), 0
        self.decoder.owner = self._key
        del self._fed[start:]
        self._fed += new
        return self.decoder.logits(new, start, keep)
