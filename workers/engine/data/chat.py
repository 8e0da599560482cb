"""Conversations rendered with the model's chat template, as transformers renders them
(`apply_chat_template`: a sandboxed Jinja2 environment with the same filters and globals,
the tokenizer's special tokens as variables, tokens without added special tokens), and
which of the rendered tokens the loss is taken on.

An assistant turn's text is what the template adds when the conversation grows by that
turn after a generation prompt: `render(messages[:i+1])` minus
`render(messages[:i], add_generation_prompt=True)`. So the reply and the template's own
end-of-turn marker are learned, and the role header the prompt already holds is not.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.engine.data.records import BadRecord
from shardline.workers.engine.data.tokenizers import Tokenizer

ROLES = ("system", "user", "assistant", "tool")
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


class ChatTemplateError(ValueError):
    """The chat template is missing or fails on a conversation."""


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    # The tokenizer's special tokens by name (bos_token, eos_token, ...): templates use them.
    special_tokens: tuple[tuple[str, str], ...] = ()

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        try:
            return str(
                _compiled(self.source).render(
                    messages=messages,
                    tools=None,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **dict(self.special_tokens),
                )
            )
        except jinja2.TemplateError as err:
            raise ChatTemplateError(f"the chat template failed: {err}") from None


@lru_cache(maxsize=4)
def _compiled(source: str) -> Any:
    """The environment transformers builds for chat templates (chat_template_utils.py)."""

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        # Jinja's own tojson escapes HTML characters; transformers' does not.
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as err:
        raise ChatTemplateError(f"the chat template is not valid Jinja: {err}") from None


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body, as in transformers when
    no assistant mask is asked for (this module finds turns by prefix)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def load_chat_template(given: str | None, tokenizer_path: str, access: DataAccess) -> ChatTemplate:
    """`data.chat_template` (a template's text, or a .jinja file), else the template beside
    the tokenizer: chat_template.jinja, or `chat_template` in tokenizer_config.json. The
    special tokens come from tokenizer_config.json beside the tokenizer where there is one."""
    folder = Path(tokenizer_path).parent if tokenizer_path != "byte" else None
    config: dict[str, Any] = {}
    if folder is not None and (folder / TOKENIZER_CONFIG).is_file():
        with access.open(folder / TOKENIZER_CONFIG, "data.tokenizer") as handle:
            try:
                config = json.loads(handle.read().decode("utf-8"))
            except ValueError:
                raise ChatTemplateError(
                    f"data.tokenizer: {folder / TOKENIZER_CONFIG} is not JSON"
                ) from None
    specials = tuple(
        (name, _token_text(config[name])) for name in _SPECIAL_TOKENS if config.get(name)
    )
    source = _template_source(given, folder, config, access)
    _compiled(source)  # a syntax error is the spec's, said now
    return ChatTemplate(source, specials)


def given_template(given: str, access: DataAccess) -> str:
    """`data.chat_template`'s text: itself, or the .jinja file it names."""
    if given.endswith(".jinja") and "{" not in given:
        with access.open(Path(given), "data.chat_template") as handle:
            return handle.read().decode("utf-8")
    return given


def _template_source(
    given: str | None, folder: Path | None, config: dict[str, Any], access: DataAccess
) -> str:
    if given is not None:
        return given_template(given, access)
    if folder is not None and (folder / TEMPLATE_FILE).is_file():
        with access.open(folder / TEMPLATE_FILE, "data.tokenizer") as handle:
            return handle.read().decode("utf-8")
    found = config.get("chat_template")
    if isinstance(found, list):  # named templates: transformers takes "default"
        found = next((t.get("template") for t in found if t.get("name") == "default"), None)
    if isinstance(found, str) and found:
        return found
    raise ChatTemplateError(
        "data.chat_template: the tokenizer has no chat template (no chat_template.jinja or "
        "chat_template in tokenizer_config.json beside it); give data.chat_template"
    )


def _token_text(value: Any) -> str:
    # tokenizer_config.json writes a special token as a string or as an AddedToken dict.
    return str(value["content"]) if isinstance(value, dict) else str(value)


def check_messages(messages: Any, where: str, field: str) -> list[dict[str, Any]]:
    """The conversation of one record, or BadRecord naming the record and the field."""
    spec_field = "data.messages_field"
    if not isinstance(messages, list) or not messages:
        raise BadRecord(f"data: {where}: {field} must be a non-empty list of messages", spec_field)
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise BadRecord(
                f"data: {where}: {field}[{i}] must be an object with a role", spec_field
            )
        if message["role"] not in ROLES:
            raise BadRecord(
                f"data: {where}: {field}[{i}].role {message['role']!r} is not one of "
                f"{', '.join(ROLES)}",
                spec_field,
            )
        if not isinstance(message.get("content"), str | None):
            raise BadRecord(f"data: {where}: {field}[{i}].content must be text", spec_field)
    return list(messages)


def assistant_spans(
    template: ChatTemplate, messages: Sequence[dict[str, Any]]
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns."""
    messages = list(messages)
    text = template.render(messages)
    spans: list[tuple[int, int]] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = template.render(messages[:i], add_generation_prompt=True)
        through = template.render(messages[: i + 1])
        if not (through.startswith(prompt) and text.startswith(through)):
            raise ChatTemplateError(
                f"the chat template renders turn {i} differently once later turns follow, so "
                "its assistant text cannot be found; give data.chat_template, or "
                "train_on_prompt: true"
            )
        spans.append((len(prompt), len(through)))
    return text, spans


def render_conversation(
    template: ChatTemplate,
    tokenizer: Tokenizer,
    messages: Sequence[dict[str, Any]],
    train_on_prompt: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of the rendered conversation and, for each, whether the loss learns it:
    tokens that start inside an assistant turn (every token with `train_on_prompt`)."""
    if train_on_prompt:
        ids, _ = tokenizer.encode_offsets(template.render(list(messages)))
        return ids, np.ones(len(ids), dtype=bool)
    text, spans = assistant_spans(template, messages)
    ids, starts = tokenizer.encode_offsets(text)
    # Token starts are in order: each span's tokens are one slice of them.
    learned = np.zeros(len(ids), dtype=bool)
    for a, b in spans:
        learned[np.searchsorted(starts, a) : np.searchsorted(starts, b)] = True
    return ids, learned
