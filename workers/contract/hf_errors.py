"""The error of an `init_from` folder a job cannot start from (no torch, no imports of
ours: the model families' config adapters raise it too)."""

from __future__ import annotations


class InitFromError(ValueError):
    """An `init_from` folder this model cannot start from; `field` names the spec field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message
