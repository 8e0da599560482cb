"""Validation errors as a person reads them: the field, what is wrong, and the fix.

Pydantic's own words are kept where they already say that; the ones a new user trips on
are rewritten here: an unknown key names the field it is nearest to, and a pattern names
the characters allowed instead of printing a regular expression."""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

# What each pattern-checked field allows, in words.
_PATTERN_WORDS = {
    "name": "letters, digits, '_', '.' and '-', starting with a letter or digit (no spaces)",
    "resume_from.job_id": "the letters and digits of a job id, as `shardline jobs` lists it",
}


class SpecFileError(ValueError):
    """A spec file that is not a readable mapping (YAML syntax, wrong top-level type)."""


class SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: `3e-4` and `1e5` are numbers, as
    people write learning rates (YAML 1.1, which PyYAML follows, wants `3.0e-4` and reads
    `3e-4` as a string)."""


SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def parse_spec_text(text: str, source: str | Path) -> dict[str, Any]:
    """The mapping in a YAML or JSON spec; a syntax error names its line and column."""
    try:
        data = yaml.load(text, Loader=SpecLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = err.problem or err.context or "invalid YAML"
        raise SpecFileError(f"{source}: YAML syntax error at {where}: {problem}") from None
    except yaml.YAMLError as err:
        raise SpecFileError(f"{source}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise SpecFileError(
            f"{source}: a job spec is a mapping of fields (name: ..., model: ...), "
            f"got {type(data).__name__}"
        )
    return data


def explain(error: dict[str, Any], loc: Sequence[str | int], root: type[BaseModel] | None) -> str:
    """One error's message, with the fix where pydantic's words do not give it."""
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    kind = error.get("type")
    path = ".".join(str(part) for part in loc)
    if kind == "extra_forbidden" and loc:
        fields = _fields_at(root, loc[:-1])
        near = difflib.get_close_matches(str(loc[-1]), fields, n=1, cutoff=0.6)
        prefix = ".".join(str(part) for part in loc[:-1])
        if near:
            return f"unknown field; did you mean `{prefix + '.' if prefix else ''}{near[0]}`?"
        if fields:
            return f"unknown field; the fields here are: {', '.join(sorted(fields))}"
        return "unknown field"
    if kind == "string_pattern_mismatch" and path in _PATTERN_WORDS:
        return f"use only {_PATTERN_WORDS[path]}"
    return message


def _fields_at(root: type[BaseModel] | None, loc: Sequence[str | int]) -> list[str]:
    """The field names of the model reached by following `loc` from `root` ([] if none)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return []
        model = _model_of(model.model_fields[part].annotation)
    return list(model.model_fields) if model is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (`X`, `X | None`, `Optional[X]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None
