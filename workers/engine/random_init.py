"""Random initial weights that depend only on (seed, parameter name): each parameter is
drawn from a generator seeded by both, so every layout starts from the same weights.

How wide each parameter is drawn is its model family's rule (`ModelFamily.init_std`);
the model (`init_weights`) and the meta-device build (initialise.py) both draw from here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch

# (model name, full shape, device) -> the parameter's full fp32 value on that device.
ParameterSource = Callable[[str, torch.Size, torch.device], torch.Tensor]
# A parameter's model name -> the std of its normal draw, or None for one (norm gains).
InitStd = Callable[[str], float | None]


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed for one parameter of a job seeded `seed`."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def random_parameters(*, seed: int, init_std: InitStd) -> ParameterSource:
    """Random initial weights, the same for a name whatever the layout."""

    def draw(name: str, shape: torch.Size, device: torch.device) -> torch.Tensor:
        std = init_std(name)
        if std is None:
            return torch.ones(shape, device=device)
        generator = torch.Generator(device=device).manual_seed(parameter_seed(seed, name))
        return torch.empty(shape, device=device).normal_(std=std, generator=generator)

    return draw
