"""The base of every spec section: unknown fields, coercion and unstorable text refused."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from shardline.workers.contract.scalars import field_kinds, refuse_coercion


class _Strict(BaseModel):
    # allow_inf_nan=False: JSON has no Infinity or NaN, and a spec must survive the
    # database and every reader of it (one unreadable spec once stopped all scheduling).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_coercion(cls, value: Any, info: ValidationInfo) -> Any:
        """A quoted number is no number, and true is not 1 (workers/contract/scalars.py)."""
        if info.field_name is None:
            return value
        return refuse_coercion(field_kinds(cls, info.field_name), value)

    @field_validator("*", mode="after")
    @classmethod
    def _text_is_storable(cls, value: Any) -> Any:
        """Strings must encode as UTF-8 and hold no NUL: the database, JSON responses and
        file paths all need that, so such a value is refused here and never stored."""
        if isinstance(value, str):
            if "\x00" in value:
                raise ValueError("contains a NUL character; remove it")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ValueError(
                    f"is not valid Unicode text (a lone surrogate at position {err.start}); "
                    "remove that character"
                ) from None
        return value
