"""Random initial weights that depend only on (seed, parameter name): each parameter is
drawn from a generator seeded by both, so every layout starts from the same weights.

The model (`Transformer.init_weights`) and the meta-device build (initialise.py) both
draw from here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch

# (model name, full shape, device) -> the parameter's full fp32 value on that device.
ParameterSource = Callable[[str, torch.Size, torch.device], torch.Tensor]


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed for one parameter of a job seeded `seed`."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def init_std(name: str, n_layers: int) -> float | None:
    """GPT-2 style: N(0, 0.02), residual outputs scaled down by depth; None for norm
    gains, which start at one."""
    if name.endswith(("wo.weight", "w2.weight")):
        return 0.02 / (2 * n_layers) ** 0.5
    if name.endswith("norm.weight"):
        return None
    return 0.02


def random_parameters(*, seed: int, n_layers: int) -> ParameterSource:
    """Random initial weights, the same for a name whatever the layout."""

    def draw(name: str, shape: torch.Size, device: torch.device) -> torch.Tensor:
        std = init_std(name, n_layers)
        if std is None:
            return torch.ones(shape, device=device)
        generator = torch.Generator(device=device).manual_seed(parameter_seed(seed, name))
        return torch.empty(shape, device=device).normal_(std=std, generator=generator)

    return draw
