"""Turning logits into tokens: greedy choice, temperature/top-p sampling and the speculative acceptance rule."""
from __future__ import annotations

import torch


class Sampler:
    """Temperature and nucleus (top-p) sampling with its own seeded generator.

    All probability tensors are float32 of shape ``(rows, vocab_size)``.
    """

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                 device: torch.device | str = "cpu"):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed if seed is not None else int(torch.seed() % 2**63))

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """softmax(logits / T), restricted to the smallest set of tokens whose mass reaches top_p."""
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p >= 1.0:
            return probs
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Drop a token when the mass of the tokens ranked above it already reaches top_p (the top token always stays).
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= self.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        return probs / probs.sum(dim=-1, keepdim=True)

    def sample(self, probs: torch.Tensor) -> int:
        """One token drawn from a 1-D distribution."""
        return int(torch.multinomial(probs, 1, generator=self.generator).item())

    def uniform(self) -> float:
        return float(torch.rand(1, generator=self.generator, device=self.generator.device).item())


def accept_greedy(candidates: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """Greedy verification.

    target_logits: ``(len(candidates) + 1, vocab)``; row i scores the position of candidates[i], the last row the
    position after them. Returns (number of candidates accepted, the target's own next token).
    """
    predicted = target_logits.argmax(dim=-1).tolist()
    n = 0
    while n < len(candidates) and candidates[n] == predicted[n]:
        n += 1
    return n, predicted[n]


def accept_sampled(candidates: list[int], candidate_probs: torch.Tensor | None, target_probs: torch.Tensor,
                   sampler: Sampler) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): the emitted tokens follow p exactly.

    p = target_probs ``(k + 1, vocab)``, q = candidate_probs ``(k, vocab)``, the distribution each candidate was drawn
    from; ``None`` means the candidates are deterministic (prompt lookup), i.e. q is one-hot on each candidate.
    """
    for i, x in enumerate(candidates):
        p_x = float(target_probs[i, x])
        q_x = 1.0 if candidate_probs is None else float(candidate_probs[i, x])
        # Accept with probability min(1, p(x)/q(x)): q(x) <= p(x) always accepts.
        if sampler.uniform() * q_x < p_x:
            continue
        # Rejected: draw from the residual norm(max(0, p - q)), which restores exactly the mass q over-proposed.
        if candidate_probs is None:
            residual = target_probs[i].clone()
            residual[x] = 0.0
        else:
            residual = (target_probs[i] - candidate_probs[i]).clamp_min(0.0)
        total = float(residual.sum())
        if total <= 0.0:  # p == q up to rounding: any rejection is then a rounding artefact
            residual, total = target_probs[i], 1.0
        return i, sampler.sample(residual / total)
    # Every candidate accepted: the bonus token comes straight from p.
    return len(candidates), sampler.sample(target_probs[len(candidates)])
