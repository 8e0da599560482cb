"""What a rank's process needs around its training: its log file, its node's address,
and the device memory a failed world leaves behind."""

from __future__ import annotations

import logging
from pathlib import Path


def log_to_file(path: Path) -> logging.Handler:
    """Every logger of the process writes to the rank's log file too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def empty_device_cache() -> None:
    """Give the failed world's freed GPU memory back before the new world allocates."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def node_address() -> str:
    """The address Ray gave this actor's node: the rank's sockets listen there only."""
    import ray

    return str(ray.util.get_node_ip_address())
