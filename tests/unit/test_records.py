"""Records as users keep them: the three containers read alike, chats rendered as
transformers renders them with the loss on assistant turns, packing that keeps
documents apart, and bad data named, not crashed on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.sections import DataSpec
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.chat import (
    ChatTemplate,
    ChatTemplateError,
    load_chat_template,
    render_conversation,
)
from shardline.workers.engine.data.documents import Documents, record_documents
from shardline.workers.engine.data.loader import build_loader
from shardline.workers.engine.data.packing import pack
from shardline.workers.engine.data.records import BadRecord
from shardline.workers.engine.data.tokenizers import ByteTokenizer, HFTokenizer
from tests.support.records import (
    CHATML,
    CHATML_GENERATION,
    PLAIN_CHAT,
    chatml_tokenizer_folder,
    noise_chats,
    write_datasets_folder,
    write_jsonl,
    write_parquet,
)

TEXTS: list[dict[str, Any]] = [
    {"text": f"document {i}: " + "xyz" * (i % 7), "id": i} for i in range(40)
]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDLINE_CACHE_DIR", str(tmp_path / "cache"))


def records_spec(path: Path | str, **data: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "records",
            "model": {"preset": "tiny", "seq_len": 32},
            "data": {"source": "records", "path": str(path), **data},
            "train": {"steps": 4, "global_batch_size": 4, "micro_batch_size": 2},
        }
    )


def docs_of(path: Path | str, **data: Any) -> Documents:
    return record_documents(
        DataSpec.model_validate({"source": "records", "path": str(path), **data}), 32, 256
    )


def test_the_three_containers_give_the_same_documents_and_batches(tmp_path: Path) -> None:
    paths = [
        write_jsonl(TEXTS, tmp_path / "a.jsonl"),
        write_jsonl(TEXTS, tmp_path / "a.jsonl.gz", gz=True),
        write_parquet(TEXTS, tmp_path / "a.parquet"),
        write_datasets_folder(TEXTS, tmp_path / "dataset"),
    ]
    assert len(list((tmp_path / "dataset").glob("*.arrow"))) > 1  # several shards, in order
    first = docs_of(paths[0])
    assert first.counts["records"] == len(TEXTS)
    want = [ByteTokenizer().encode(r["text"]) for r in TEXTS]
    got = [
        first.tokens[a:b].tolist() for a, b in zip(first.starts[:-1], first.starts[1:], strict=True)
    ]
    assert got == want
    batches = [build_loader(records_spec(p), 0, 1).train_batch(3) for p in paths]
    for path in paths[1:]:
        other = docs_of(path)
        assert np.array_equal(other.tokens, first.tokens), path
        assert np.array_equal(other.starts, first.starts), path
    for batch in batches[1:]:
        assert torch.equal(batch.tokens, batches[0].tokens)
        assert batch.documents is not None and batches[0].documents is not None
        assert torch.equal(batch.documents, batches[0].documents)


def test_a_folder_or_glob_reads_its_files_in_name_order(tmp_path: Path) -> None:
    folder = tmp_path / "parts"
    folder.mkdir()
    write_jsonl(TEXTS[20:], folder / "b.jsonl")
    write_parquet(TEXTS[:20], folder / "a.parquet")
    (folder / "README.md").write_text("not records")
    whole = docs_of(write_jsonl(TEXTS, tmp_path / "all.jsonl"))
    for given in (folder, f"{folder}/*"):
        docs = docs_of(given)
        assert np.array_equal(docs.tokens, whole.tokens), given


def test_shuffle_is_seeded_and_false_keeps_file_order(tmp_path: Path) -> None:
    path = write_jsonl(TEXTS, tmp_path / "a.jsonl")
    ordered = build_loader(records_spec(path, shuffle=False, packing=False), 0, 1)
    rows = ordered.train_batch(1).tokens
    first_doc = ByteTokenizer().encode(TEXTS[0]["text"])
    assert rows[0, : len(first_doc)].tolist() == first_doc
    a = build_loader(records_spec(path), 0, 1).train_batch(2).tokens
    b = build_loader(records_spec(path), 0, 1).train_batch(2).tokens
    assert torch.equal(a, b)
    assert not torch.equal(a, ordered.train_batch(2).tokens)


def test_packing_fills_windows_with_whole_documents_and_pads_the_end(tmp_path: Path) -> None:
    path = write_jsonl(TEXTS, tmp_path / "a.jsonl")
    docs = docs_of(path)
    packed = pack(docs, np.arange(len(docs)), 33, packing=True)
    single = pack(docs, np.arange(len(docs)), 33, packing=False)
    assert len(single) == len(docs) > len(packed)
    rows = packed.rows(np.arange(len(packed)))
    seen = []
    for r in range(len(packed)):
        numbers = rows.documents[r]
        used = int((numbers >= 0).sum())
        assert (numbers[:used] >= 0).all() and (numbers[used:] == -1).all()  # pad at the end
        for n in range(int(numbers.max()) + 1):
            seen.append(rows.tokens[r][numbers == n].tolist())
    assert seen == [
        docs.tokens[a:b].tolist() for a, b in zip(docs.starts[:-1], docs.starts[1:], strict=True)
    ]
    mask = rows.loss_mask()
    # A target counts only inside one document: never a document's first token, never padding.
    assert int(mask.sum()) == int(packed.loss_tokens.sum()) == int(docs.loss_tokens().sum())


def test_a_long_text_is_cut_into_windows(tmp_path: Path) -> None:
    path = write_jsonl([{"text": "a" * 100}], tmp_path / "a.jsonl")
    docs = docs_of(path, val_fraction=0.0)
    assert docs.lengths.tolist() == [33, 33, 33, 1]


def test_packed_rows_attend_within_documents_and_restart_positions() -> None:
    """The model on a packed row gives each document the logits it gives that document
    alone."""
    from shardline.workers.engine.models.llama.config import ModelArgs
    from shardline.workers.engine.models.llama.model import Transformer

    torch.manual_seed(0)
    model = Transformer(
        ModelArgs(
            dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=50, seq_len=24, ffn_dim=64
        )
    )
    a, b, c = torch.randint(0, 50, (7,)), torch.randint(0, 50, (9,)), torch.randint(0, 50, (5,))
    row = torch.cat([a, b, c, torch.zeros(3, dtype=torch.long)])[None]
    documents = torch.tensor([[0] * 7 + [1] * 9 + [2] * 5 + [-1] * 3], dtype=torch.int32)
    packed = model(row, documents=documents)[0]
    alone = [model(doc[None])[0] for doc in (a, b, c)]
    torch.testing.assert_close(packed[:21], torch.cat(alone), rtol=1e-5, atol=1e-5)
    # Without the documents the later ones would see the earlier: the check has teeth.
    assert not torch.allclose(model(row)[0][7:16], alone[1], atol=1e-3)


def test_chat_renders_as_transformers_and_learns_the_assistant_turns(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    folder = chatml_tokenizer_folder(tmp_path / "tok", CHATML_GENERATION)
    hf = PreTrainedTokenizerFast.from_pretrained(folder)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi — ça va?"},
        {"role": "assistant", "content": "Oui."},
        {"role": "user", "content": "And then?"},
        {"role": "assistant", "content": "Done."},
    ]
    access = DataAccess()
    tokenizer = HFTokenizer(folder / "tokenizer.json", access)
    template = load_chat_template(None, str(folder / "tokenizer.json"), access)
    assert template.render(messages) == hf.apply_chat_template(messages, tokenize=False)
    ids, learned = render_conversation(template, tokenizer, messages, train_on_prompt=False)
    want = hf.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assert ids.tolist() == list(want["input_ids"])
    assert learned.astype(int).tolist() == list(want["assistant_masks"])
    assert hf.decode(ids[learned].tolist()) == "Oui.<|im_end|>\nDone.<|im_end|>\n"
    every_id, every_learned = render_conversation(template, tokenizer, messages, True)
    assert every_id.tolist() == ids.tolist() and every_learned.all()


def test_the_template_comes_from_the_spec_or_beside_the_tokenizer(tmp_path: Path) -> None:
    folder = chatml_tokenizer_folder(tmp_path / "tok", CHATML)
    access = DataAccess()
    assert load_chat_template(None, str(folder / "tokenizer.json"), access).source == CHATML
    (folder / "chat_template.jinja").write_text(PLAIN_CHAT)
    assert load_chat_template(None, str(folder / "tokenizer.json"), access).source == PLAIN_CHAT
    assert (
        load_chat_template("{{ 'x' }}", str(folder / "tokenizer.json"), access).source
        == "{{ 'x' }}"
    )
    with pytest.raises(ChatTemplateError, match=r"data\.chat_template"):
        load_chat_template(None, "byte", access)
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        load_chat_template("{% for %}", "byte", access)


def test_templates_run_sandboxed() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user", "content": "x"}])


def test_long_conversations_are_truncated_or_dropped_and_counted(tmp_path: Path) -> None:
    chats = [
        *noise_chats(10),
        {
            "messages": [
                {"role": "user", "content": "q" * 60},
                {"role": "assistant", "content": "r" * 20},
            ]
        },
    ]
    path = write_jsonl(chats, tmp_path / "c.jsonl")
    truncated = docs_of(path, format="chat", chat_template=PLAIN_CHAT)
    assert (truncated.counts["truncated"], truncated.counts["dropped"]) == (0, 1)  # no reply left
    longer = [
        {
            "messages": [
                {"role": "user", "content": "q" * 10},
                {"role": "assistant", "content": "r" * 40},
            ]
        }
    ]
    path = write_jsonl(noise_chats(10) + longer, tmp_path / "d.jsonl")
    kept = docs_of(path, format="chat", chat_template=PLAIN_CHAT)
    assert (kept.counts["truncated"], kept.counts["documents"]) == (1, 11)
    assert kept.lengths.max() == 33
    dropped = docs_of(path, format="chat", chat_template=PLAIN_CHAT, overflow="drop")
    assert (dropped.counts["dropped"], dropped.counts["documents"]) == (1, 10)


@pytest.mark.parametrize(
    ("content", "data", "message"),
    [
        (b'{"text": "fine"}\nnot json\n', {}, "b.jsonl line 2 is not JSON"),
        (b'{"text": "fine"}\n[1, 2]\n', {}, "b.jsonl line 2 is not a JSON object"),
        (b'{"text": "fine"}\n{"body": "x"}\n', {}, "b.jsonl line 2 has no field 'text'"),
        (b'{"text": 3}\n', {}, "b.jsonl line 1 has a non-text field 'text'"),
        (b"PAR1\x00\x00", {}, "is a Parquet file, not JSON Lines"),
        (b"\xff\xfe\x00binary", {}, "line 1 is not UTF-8"),
        (
            b'{"messages": [{"role": "robot", "content": "x"}]}\n',
            {"format": "chat", "chat_template": PLAIN_CHAT},
            "b.jsonl line 1: messages[0].role 'robot' is not one of",
        ),
        (
            b'{"messages": "hello"}\n',
            {"format": "chat", "chat_template": PLAIN_CHAT},
            "messages must be a non-empty list",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}]}\n',
            {"format": "chat", "chat_template": "{{ raise_exception('no system turn') }}"},
            "b.jsonl line 1: the chat template failed: no system turn",
        ),
    ],
)
def test_bad_records_are_named(
    tmp_path: Path, content: bytes, data: dict[str, Any], message: str
) -> None:
    path = tmp_path / "b.jsonl"
    path.write_bytes(content)
    with pytest.raises(BadRecord) as err:
        docs_of(path, **data)
    assert message in str(err.value)


def test_a_parquet_file_that_is_not_one_is_named(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    path.write_text('{"text": "json, not parquet"}\n')
    with pytest.raises(BadRecord, match=r"x\.parquet is not a Parquet file"):
        docs_of(path)


def test_skip_bad_records_skips_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text('{"text": "one"}\nnot json\n{"body": 1}\n{"text": "two"}\n')
    docs = docs_of(path, skip_bad_records=True)
    assert (docs.counts["records"], docs.counts["skipped"], docs.counts["documents"]) == (4, 2, 2)


def test_the_documents_are_cached_by_what_made_them(tmp_path: Path) -> None:
    path = write_jsonl(TEXTS, tmp_path / "a.jsonl")
    docs_of(path)
    cached = list((tmp_path / "cache" / "records").iterdir())
    assert len(cached) == 1
    docs_of(path)
    assert len(list((tmp_path / "cache" / "records").iterdir())) == 1
    docs_of(path, text_field="text", skip_bad_records=True)  # another recipe
    write_jsonl(TEXTS[:-1], path)  # an edit
    docs_of(path)
    assert len(list((tmp_path / "cache" / "records").iterdir())) == 3


def test_records_fields_belong_to_records() -> None:
    with pytest.raises(ValueError, match=r"data\.packing applies to data\.source='records' only"):
        DataSpec.model_validate({"source": "text", "path": "x", "packing": False})
    with pytest.raises(ValueError, match=r"data\.chat_template applies to data\.format='chat'"):
        DataSpec.model_validate({"source": "records", "path": "x", "chat_template": "{{ x }}"})
    stored = json.loads(DataSpec().model_dump_json())
    assert DataSpec.model_validate(stored).source == "synthetic"  # every field given back


def test_the_byte_tokenizer_says_which_character_each_byte_starts() -> None:
    ids, starts = ByteTokenizer().encode_offsets("aé—b")
    assert ids.tolist() == list("aé—b".encode())
    assert starts.tolist() == [0, 1, 1, 2, 2, 2, 3]
