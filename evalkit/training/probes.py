"""Attention statistics of the built-in ViT family, read with forward hooks from outside the
model file (effect-table row 1; docs/protocols.md, "Stability"): per layer, the largest
attention logit q·k/√d (after the QK norm when it is on) and the mean entropy of the
attention distributions. Without QK-norm, high learning rates make the logits grow until
attention is one-hot (entropy near zero) and the loss diverges.
"""

from __future__ import annotations

import math

import torch


class AttentionStats:
    """Hooks on every block's ``attn.q_norm`` and ``attn.k_norm`` (identities when the norm is
    off, so the hooks see the queries and keys the attention uses). ``read()`` returns and
    clears the statistics of the last forward pass."""

    def __init__(self, model: torch.nn.Module):
        self.layers: dict[int, dict] = {}
        self.handles = []
        for index, block in enumerate(model.blocks):
            self.handles.append(block.attn.q_norm.register_forward_hook(self._keep(index, "q")))
            self.handles.append(block.attn.k_norm.register_forward_hook(self._keep(index, "k")))

    def _keep(self, index: int, which: str):
        def hook(module, inputs, output):
            self.layers.setdefault(index, {})[which] = output.detach()

        return hook

    def read(self) -> dict[str, list[float]]:
        max_logit, entropy = [], []
        for index in sorted(self.layers):
            q, k = self.layers[index]["q"].float(), self.layers[index]["k"].float()
            logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            probs = logits.softmax(-1)
            max_logit.append(logits.max().item())
            entropy.append(-(probs * probs.clamp_min(1e-30).log()).sum(-1).mean().item())
        self.layers.clear()
        return {"max_attention_logit": max_logit, "attention_entropy": entropy}

    def close(self):
        for handle in self.handles:
            handle.remove()
