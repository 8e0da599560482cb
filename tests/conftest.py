"""Shared test settings: one thread per process on small CI machines, and a Ray token.

Ray reads its authentication settings when first imported, which collecting the tests
does; the local Ray heads the tests start use the token named here (service/local_ray.py),
so this process and every process it starts can talk to them.
"""

import atexit
import os
import secrets
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

if not os.environ.get("RAY_AUTH_TOKEN_PATH"):
    _folder = Path(tempfile.mkdtemp(prefix="shardline-test-ray-auth-"))
    atexit.register(shutil.rmtree, _folder, ignore_errors=True)
    _token = _folder / "auth_token"
    _token.write_text(secrets.token_hex(32))
    _token.chmod(0o600)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(_token)})
