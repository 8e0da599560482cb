"""The words a new user reads for a mistake in a spec: the line and column of a YAML
error, the nearest field for a misspelt key, the characters a name allows, and a GPU job
on a cluster without GPUs said as such."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from shardline.workers.contract.demand import cluster_refusal
from shardline.workers.contract.spec import JobSpec, describe_errors, load_spec
from shardline.workers.contract.spec_errors import SpecFileError


def errors_of(body: dict[str, object]) -> list[str]:
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(body)
    return describe_errors(err.value)


def test_a_yaml_syntax_error_names_its_line_and_column(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\ntrain:\n  steps: 10\n  lr: [1, 2\nmodel: {}\n")
    with pytest.raises(SpecFileError) as err:
        load_spec(spec)
    assert str(err.value).startswith(f"{spec}: YAML syntax error at line 5, column 6:")
    spec.write_text("name: x\n\tsteps: 3\n")  # a tab where YAML wants spaces
    with pytest.raises(SpecFileError, match=r"line 2, column 1: found character '\\t'"):
        load_spec(spec)


def test_a_spec_that_is_not_a_mapping_says_what_it_got(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("- name: x\n")
    with pytest.raises(SpecFileError, match=r"a job spec is a mapping of fields .* got list"):
        load_spec(spec)


@pytest.mark.parametrize(
    ("body", "line"),
    [
        ({"train": {"step": 5}}, "train.step: unknown field; did you mean `train.steps`?"),
        ({"modle": {}}, "modle: unknown field; did you mean `model`?"),
        (
            {"resume_from": {"job_id": "a", "stpe": 3}},
            "resume_from.stpe: unknown field; did you mean `resume_from.step`?",
        ),
        (
            {"fault_tolerance": {"elastic": {"min_pd": 1}}},
            "fault_tolerance.elastic.min_pd: unknown field; did you mean "
            "`fault_tolerance.elastic.min_dp`?",
        ),
    ],
)
def test_an_unknown_key_names_the_nearest_field(body: dict[str, object], line: str) -> None:
    assert line in errors_of({"name": "x", **body})


def test_an_unknown_key_with_no_near_name_lists_the_fields_there() -> None:
    (line,) = errors_of({"name": "x", "checkpoint": {"zzzzzz": 1}})
    assert line.startswith("checkpoint.zzzzzz: unknown field; the fields here are: ")
    assert "every_steps" in line and "keep_last" in line


def test_a_name_with_a_space_says_which_characters_are_allowed() -> None:
    (line,) = errors_of({"name": "my job"})
    assert line == (
        "name: use only letters, digits, '_', '.' and '-', starting with a letter or "
        "digit (no spaces)"
    )
    assert "^" not in line


def test_a_gpu_job_on_a_cluster_without_gpus_is_told_there_are_none() -> None:
    spec = JobSpec.model_validate(
        {"name": "g", "parallel": {"dp": 2}, "resources": {"gpus_per_worker": 1}}
    )
    refusal = cluster_refusal(spec, {"CPU": 8.0, "GPU": 0.0})
    assert refusal is not None and "this cluster has no GPUs" in refusal
    assert "resources.gpus_per_worker=1 x 2 ranks" in refusal
    assert cluster_refusal(spec, {"CPU": 8.0, "GPU": 2.0}) is None
    short = cluster_refusal(spec, {"CPU": 8.0, "GPU": 1.0})
    assert short is not None and "the whole cluster has 8 CPU, 1 GPU" in short


def test_the_gpu_example_asks_for_a_gpu() -> None:
    spec = load_spec(Path(__file__).parents[2] / "examples" / "bench-1b.yaml")
    assert spec.resources.gpus_per_worker == 1


def test_learning_rates_written_as_people_write_them_are_numbers(tmp_path: Path) -> None:
    """YAML 1.2's floats: `3e-4` is a number (PyYAML's YAML 1.1 would give a string,
    refused as a learning rate); a quoted one stays a string."""
    path = tmp_path / "spec.yaml"
    path.write_text("name: lr\ntrain: {lr: 3e-4, min_lr: 1E-5, weight_decay: .5e-1}\n")
    spec = load_spec(path)
    assert (spec.train.lr, spec.train.min_lr, spec.train.weight_decay) == (3e-4, 1e-5, 0.05)
    path.write_text('name: lr\ntrain: {lr: "3e-4"}\n')
    with pytest.raises(ValidationError):
        load_spec(path)


def test_relative_paths_are_read_from_the_spec_file_s_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "spec.yaml").write_text(
        "name: rel\n"
        "model: {init_from: ../models/m}\n"
        "data: {source: records, path: data/chats.jsonl, tokenizer: init_from, format: chat,\n"
        "       chat_template: templates/chat.jinja}\n"
    )
    monkeypatch.chdir(tmp_path)  # the command runs elsewhere
    spec = load_spec("project/spec.yaml")
    assert spec.data.path == str(folder / "data" / "chats.jsonl")
    assert spec.model.init_from == str(tmp_path / "models" / "m")
    assert spec.data.chat_template == str(folder / "templates" / "chat.jinja")
    assert spec.data.tokenizer == "init_from"
    (folder / "abs.yaml").write_text(
        "name: abs\ndata: {source: text, path: /srv/corpus, tokenizer: byte}\n"
    )
    spec = load_spec(folder / "abs.yaml")
    assert (spec.data.path, spec.data.tokenizer) == ("/srv/corpus", "byte")
    (folder / "inline.yaml").write_text(
        "name: t\ndata: {source: records, path: s3://bucket/x, format: chat,\n"
        "       chat_template: '{{ messages }}'}\n"
    )
    spec = load_spec(folder / "inline.yaml")
    assert (spec.data.path, spec.data.chat_template) == ("s3://bucket/x", "{{ messages }}")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (True, "is true or false, but must be a number or 'auto'"),
        (False, "is true or false, but must be a number or 'auto'"),
        ("2", "must be a number or 'auto', not other text"),
    ],
)
def test_a_count_that_may_also_be_a_word_takes_no_switch_or_quoted_number(
    value: object, said: str
) -> None:
    errors = errors_of({"name": "x", "checkpoint": {"memory_every_steps": value}})
    assert any(e.startswith("checkpoint.memory_every_steps:") and said in e for e in errors), errors


def test_a_count_that_may_also_be_a_word_takes_either() -> None:
    for value in (0, 3, "auto"):
        spec = JobSpec.model_validate({"name": "x", "checkpoint": {"memory_every_steps": value}})
        assert spec.checkpoint.memory_every_steps == value
