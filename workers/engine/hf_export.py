"""A committed checkpoint -> a Hugging Face model folder, in one process.

Reads only the `model.*` tensors of the torch.distributed.checkpoint folder (whatever
layout wrote it: DCP assembles whole tensors from every rank's shards), converts them with
the model family's adapter (names and layout: workers/engine/hf_weights.py) and writes
`config.json` (the family's),
`model.safetensors` (or numbered shards with `model.safetensors.index.json` above
`max_shard_bytes`) and the job's tokenizer files (for a byte-level job, a tokenizer.json
that encodes as the engine's byte codec does), so that
`transformers.AutoModelForCausalLM.from_pretrained(folder)` and
`transformers.AutoTokenizer.from_pretrained(folder)` load it with no custom code.

Run as `python -m shardline.workers.engine.hf_export CHECKPOINT OUT_DIR` by the API, which must not
import torch itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.hf_config import CONFIG, SAFETENSORS_INDEX, TOKENIZER, read_config
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.checkpoint.reader import (
    UnreadableCheckpoint,
    open_checkpoint,
    read_model_state,
)
from shardline.workers.engine.data.tokenizer_files import byte_codec, write_tokenizer
from shardline.workers.engine.hf_weights import to_hf_state
from shardline.workers.engine.models.family import load_family
from shardline.workers.engine.models.registry import family_of

log = logging.getLogger(__name__)

# transformers' own default shard size for save_pretrained.
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


class ExportError(ValueError):
    """A checkpoint that cannot be exported; the message says which and why."""


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Tensors in save order, cut into groups of at most `max_bytes` (a bigger tensor
    gets a group of its own)."""
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > max_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = tensor
        size += nbytes
    return groups


def write_safetensors(tensors: dict[str, torch.Tensor], out: Path, max_bytes: int) -> list[str]:
    """`model.safetensors`, or numbered shards and an index; returns the files written."""
    groups = _shards(tensors, max_bytes)
    if len(groups) == 1:
        save_file(groups[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    weight_map: dict[str, str] = {}
    for name, group in zip(names, groups, strict=True):
        save_file(group, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2), encoding="utf-8")
    return [*names, SAFETENSORS_INDEX]


def _special_tokens(spec: JobSpec, access: DataAccess) -> tuple[int | None, int | None]:
    """bos and eos ids from the config.json the job started from, where it had one; none
    for the byte codec (it has no special tokens: an id there is a byte of the text)."""
    if spec.model.init_from is None or byte_codec(spec):
        return None, None
    try:
        config = read_config(Path(spec.model.init_from), access)
    except (ValueError, OSError):
        log.warning("cannot read %s/%s; exporting without bos/eos", spec.model.init_from, CONFIG)
        return None, None
    bos, eos = config.get("bos_token_id"), config.get("eos_token_id")
    return (bos if isinstance(bos, int) else None), (eos if isinstance(eos, int) else None)


GENERATION_CONFIG = "generation_config.json"


def _copy_generation_config(spec: JobSpec, out: Path, access: DataAccess) -> list[str]:
    """The generation settings of the model the job started from (eos ids, sampling
    defaults), so the export generates as it did; none for the byte codec, whose ids
    name no special tokens."""
    if spec.model.init_from is None or byte_codec(spec):
        return []
    source = Path(spec.model.init_from) / GENERATION_CONFIG
    if not source.is_file():
        return []
    try:
        with access.open(source, "model.init_from") as handle:
            (out / GENERATION_CONFIG).write_bytes(handle.read())
    except (PermissionError, OSError) as err:
        log.warning("cannot copy %s (%s); exporting without it", source, err)
        return []
    return [GENERATION_CONFIG]


def export_checkpoint(
    path: str,
    out: Path,
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    access: DataAccess | None = None,
) -> dict[str, Any]:
    """Write the Hugging Face folder of the checkpoint at `path` into `out`; returns a
    summary (step, files, bytes)."""
    access = access or DataAccess.from_env()
    try:
        ckpt = open_checkpoint(path)
    except UnreadableCheckpoint as err:
        raise ExportError(str(err)) from None
    if "spec" not in ckpt.manifest:
        raise ExportError(f"checkpoint {path} has no job spec in its manifest")
    spec = JobSpec.model_validate(ckpt.manifest["spec"])
    resolved = spec.model.resolved()
    family = load_family(family_of(spec.model))
    adapter = family.state_dict_adapter(family.args(resolved))
    tensors = to_hf_state(read_model_state(ckpt), adapter)
    out.mkdir(parents=True, exist_ok=True)
    bos, eos = _special_tokens(spec, access)
    config = family.config.hf_config(resolved, bos_token_id=bos, eos_token_id=eos)
    # Read by `shardline generate`; transformers keeps unknown keys as plain attributes.
    config["shardline"] = {
        # "byte": the engine's byte codec (tokenizer.json beside it encodes the same).
        "tokenizer": "byte" if spec.data.tokenizer == "byte" else TOKENIZER,
        "job": spec.name,
        "step": ckpt.step,
    }
    (out / CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
    files = [CONFIG, *write_safetensors(tensors, out, max_shard_bytes)]
    files += write_tokenizer(spec, out, access)
    files += _copy_generation_config(spec, out, access)
    total = sum((out / f).stat().st_size for f in files)
    log.info("exported checkpoint step %d to %s (%d files)", ckpt.step, out, len(files))
    return {"step": ckpt.step, "files": files, "bytes": total}


def zip_folder(folder: Path, archive: Path) -> None:
    """The folder's files, stored (safetensors do not compress), flat in `archive`."""
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for path in sorted(folder.iterdir()):
            zf.write(path, arcname=path.name)


def main(argv: list[str] | None = None) -> int:
    """`python -m shardline.workers.engine.hf_export CHECKPOINT OUT_DIR [--zip ARCHIVE]`: prints the
    summary as JSON; exit 2 with the reason on stderr for a checkpoint that cannot be
    exported. `--zip` also stores the folder's files in ARCHIVE and removes the folder
    (the API's export: the whole conversion stays out of the server's process)."""
    parser = argparse.ArgumentParser(prog="python -m shardline.workers.engine.hf_export")
    parser.add_argument("checkpoint")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--max-shard-bytes", type=int, default=DEFAULT_MAX_SHARD_BYTES)
    parser.add_argument("--zip", type=Path, default=None, dest="archive")
    ns = parser.parse_args(argv)
    try:
        summary = export_checkpoint(ns.checkpoint, ns.out_dir, max_shard_bytes=ns.max_shard_bytes)
    except (ExportError, PermissionError, FileNotFoundError) as err:
        sys.stderr.write(f"{err}\n")
        return 2
    if ns.archive is not None:
        zip_folder(ns.out_dir, ns.archive)
        shutil.rmtree(ns.out_dir)
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
