"""Whether a storage URL (`s3://bucket/prefix`) can be used here, said before any job
writes to it: a missing package or an unknown protocol would otherwise surface as one
rank's traceback at the first checkpoint. No torch, no Ray."""

from __future__ import annotations

import fsspec
import fsspec.core


def storage_url_problem(url: str) -> str | None:
    """Why this process cannot open `url`'s filesystem, or None if it can."""
    protocol = url.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        return (
            f"{protocol}:// is not a storage protocol this server knows; give a folder or a "
            "URL such as s3://bucket/prefix"
        )
    except ImportError as err:
        extra = " (pip install 'shardline[s3]')" if protocol in ("s3", "s3a") else ""
        return f"{protocol}:// needs a package that is not installed{extra}: {err}"
    return None


def missing_bucket(url: str) -> str | None:
    """The bucket of an object store's `url` where the store says it does not exist (the
    operator makes buckets: a save never creates one); None where it does, where `url`
    is a folder, or where the store does not answer (that is said when it is read)."""
    if "://" not in url or url.startswith("file://"):
        return None
    try:
        fs, root = fsspec.core.url_to_fs(url)
        bucket = root.split("/", 1)[0]
        return None if fs.exists(bucket) else bucket
    except Exception:  # no answer, or no credentials yet: not a refusal at start
        return None
