"""Who a request acts for, read on every request without the ORM."""

from __future__ import annotations

from dataclasses import dataclass

from shardline.service.models import User


@dataclass(frozen=True, slots=True)
class Principal:
    """The user a live token belongs to: what permission checks and messages need."""

    id: int
    name: str
    is_admin: bool


# The store's permission checks take either: a request's Principal, or a User row (tests
# and commands that made the user themselves).
Viewer = Principal | User
