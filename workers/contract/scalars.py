"""No guessing at types: a number or a switch must be given as one, not as text.

Pydantic's lax mode turns "10" into 10 and true into 1 (and "yes" into True), so a quoted
number or a boolean in a count slips through and means something the sender may not have
meant. Pydantic's strict mode would also refuse what JSON cannot say otherwise (a string
for an enum or a path), so this refuses only those two coercions, field by field.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Set
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel


def scalar_kinds(annotation: Any) -> set[Any]:
    """The scalar types a field's annotation accepts; `object` stands for anything else."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return set().union(*(scalar_kinds(arg) for arg in get_args(annotation)))
    if origin is Annotated:
        return scalar_kinds(get_args(annotation)[0])
    if origin is Literal and all(isinstance(v, str) for v in get_args(annotation)):
        return set(get_args(annotation))  # the words themselves ("auto"), checked by value
    if annotation is type(None):
        return set()
    if annotation in (int, float, bool):
        return {annotation}
    return {object}  # enums, Literals, paths, models: pydantic's own checks apply


@functools.cache
def field_kinds(model: type[BaseModel], field: str) -> frozenset[Any]:
    """scalar_kinds of a model's field, worked out once (specs are validated often)."""
    return frozenset(scalar_kinds(model.model_fields[field].annotation))


def refuse_coercion(kinds: Set[Any], value: Any) -> Any:
    """`value` unchanged, or ValueError where only a coercion would make it fit a field
    of these scalar_kinds."""
    words = {k for k in kinds if isinstance(k, str)}
    types = set(kinds) - words
    if not types or object in types:
        return value
    if isinstance(value, str) and value in words:
        return value
    also = "".join(f" or {w!r}" for w in sorted(words))
    if isinstance(value, bool):
        if bool in types:
            return value
        raise ValueError(f"is true or false, but must be a number{also}")
    if isinstance(value, str):
        wanted = "true or false" if types == {bool} else "a number"
        other = " other" if words else ""
        raise ValueError(f"must be {wanted}{also}, not{other} text; write it without quotes")
    if isinstance(value, int | float) and types == {bool}:
        raise ValueError("must be true or false")
    return value
