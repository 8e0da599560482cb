"""Whether a rank's error is the job's own (retrying cannot help) or the infrastructure's."""

from __future__ import annotations

# Errors a rank raises while building its training (model, data, tokenizer) because of
# what the job asked for: they would happen again on every retry.
JOB_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    FileNotFoundError,
    IsADirectoryError,
    PermissionError,
    UnicodeDecodeError,
    NotImplementedError,
)


def is_deterministic(err: BaseException, *, while_building: bool) -> bool:
    """Whether `err` is the job's own (retrying cannot help) rather than infrastructure's
    (a dead peer, a lost node, a collective timeout)."""
    import torch.distributed as dist

    if isinstance(err, dist.DistError):
        return False
    return while_building and isinstance(err, JOB_ERRORS)
