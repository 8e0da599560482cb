"""The control plane never imports torch: the API image and host need no GPU stack."""

from __future__ import annotations

import subprocess
import sys

CONTROL_PLANE = [
    "shardline.api.app",
    "shardline.api.cli",
    "shardline.api.cli.serve",
    "shardline.api.local_service",
    "shardline.service.local_ray",
    "shardline.service.ray_runtime",
    "shardline.service.reconciler",
    "shardline.service.scheduler",
]


def test_control_plane_modules_do_not_import_torch() -> None:
    probe = (
        "import importlib, sys\n"
        f"for name in {CONTROL_PLANE!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
