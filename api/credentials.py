"""Where the CLI and the SDK find the server and the token, from any folder.

In order: what the caller passed, SHARDLINE_URL / SHARDLINE_TOKEN, the file `shardline
login` saved in the user's config folder, then the admin token `shardline serve` saved in
./.shardline of the current folder. Each found token says where it came from, so an
authentication error can name the file or variable to fix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

URL_ENV = "SHARDLINE_URL"
TOKEN_ENV = "SHARDLINE_TOKEN"
# The server's own defaults (service/config.py), read here from the environment as the
# server reads them, so that the SDK loads no control-plane code.
HOST_ENV, DEFAULT_HOST = "SHARDLINE_HOST", "127.0.0.1"
PORT_ENV, DEFAULT_PORT = "SHARDLINE_PORT", "8000"
STATE_DIR_ENV, DEFAULT_STATE_DIR = "SHARDLINE_STATE_DIR", ".shardline"
ADMIN_TOKEN_FILE_ENV = "SHARDLINE_ADMIN_TOKEN_FILE"


class NoCredentials(Exception):
    """No token anywhere the CLI and the SDK look; the message says where they looked."""


class BadSetting(ValueError):
    """A SHARDLINE_* variable the address is made from that cannot be one; the message
    names it."""


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str
    # Where the token came from, as a person would look for it ("SHARDLINE_TOKEN", a path).
    source: str


def config_file(environ: Mapping[str, str] = os.environ) -> Path:
    """The user's saved login: $XDG_CONFIG_HOME/shardline/credentials.json (default
    ~/.config)."""
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "shardline" / "credentials.json"


def default_url(environ: Mapping[str, str] = os.environ) -> str:
    """The address a server on this machine's defaults (SHARDLINE_HOST/PORT) answers on."""
    port = (environ.get(PORT_ENV) or DEFAULT_PORT).strip()
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadSetting(f"{PORT_ENV}: {port!r} is not a port number (0-65535)")
    return server_url(environ.get(HOST_ENV) or DEFAULT_HOST, int(port))


def server_url(host: str, port: int | str) -> str:
    """The address a server listening on `host`:`port` answers on, from this machine."""
    host = DEFAULT_HOST if host in ("0.0.0.0", "::") else host
    return f"http://{host}:{port}"


def local_admin_token_file(environ: Mapping[str, str] = os.environ) -> Path:
    """Where a server started in this folder wrote its admin token."""
    given = environ.get(ADMIN_TOKEN_FILE_ENV)
    if given:
        return Path(given)
    return Path(environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR) / "admin-token"


def find_credentials(
    url: str | None = None, token: str | None = None, environ: Mapping[str, str] = os.environ
) -> Credentials:
    """The server and token to use; raises NoCredentials naming every place it looked."""
    saved_file = config_file(environ)
    saved = read_saved(saved_file)
    url = url or environ.get(URL_ENV) or saved.get("url") or default_url(environ)
    if token:
        return Credentials(url, token, "--token")
    if environ.get(TOKEN_ENV):
        return Credentials(url, environ[TOKEN_ENV], TOKEN_ENV)
    if saved.get("token"):
        return Credentials(url, saved["token"], str(saved_file))
    admin_file = local_admin_token_file(environ)
    if admin_file.is_file():
        return Credentials(url, admin_file.read_text().strip(), str(admin_file))
    raise NoCredentials(
        f"no API token: pass --token, set {TOKEN_ENV}, run `shardline login --url URL`, or "
        f"run from the folder where `shardline serve` runs (looked in {saved_file} and "
        f"{admin_file})"
    )


def read_saved(path: Path) -> dict[str, str]:
    """The saved login's fields ({} where there is none or it is unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if k in ("url", "token") and isinstance(v, str)}


def save_credentials(url: str, token: str, path: Path) -> None:
    """Write the login for this user only: folder 0700, file 0600, replaced atomically.
    A folder that already exists open to others (mkdir leaves it as it was) is closed."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.parent.stat().st_uid == os.getuid():
        path.parent.chmod(0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump({"url": url, "token": token}, out)
    os.replace(tmp, path)


def forget_credentials(path: Path) -> bool:
    """Remove the saved login; False where there was none."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
