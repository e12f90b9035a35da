"""Oracles for the engine tests: what a plain transformers forward says the engine must return."""

from __future__ import annotations

from typing import Any

import torch

CONTEXT = 1024  # context length of the shared test engine
MAX_BODY = 1 << 20  # its request-body limit


def full_forward_logprobs(
    model: Any, prompt: list[int], output: list[int], temperature: float = 1.0
) -> list[float]:
    """log_softmax(logits / T) of each output token, from one fresh forward over everything."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    n = len(prompt)
    return [float(logp[n - 1 + i, tok]) for i, tok in enumerate(output)]


def greedy_reference(model: Any, prompt: list[int], steps: int) -> list[int]:
    """Greedy continuation by full forwards (no KV cache): the oracle for greedy decoding."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids]), logits_to_keep=1).logits
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]
