"""`shardline serve`: migrate the database, make sure an admin exists, attach to Ray, serve."""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from shardline.api.cli.common import console, fail, load_settings
from shardline.api.credentials import server_url

log = logging.getLogger(__name__)


def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind (SHARDLINE_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (SHARDLINE_PORT).")] = None,
) -> None:
    """Run the control plane on this machine's embedded defaults or SHARDLINE_* settings.

    Without SHARDLINE_RAY_ADDRESS it starts a local Ray head (logical CPUs:
    SHARDLINE_RAY_NUM_CPUS) that outlives restarts of this command while jobs run.
    """
    import uvicorn

    # SIGTERM (docker stop, systemd, Kubernetes) and SIGINT end `serve` like a normal
    # return: uvicorn drains requests with its own handlers, then re-raises the signal to
    # the handler it found, which is this one, so the clean-up below still runs.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    signal.signal(signal.SIGINT, _exit_cleanly)

    from shardline.api.app import create_app
    from shardline.api.listening import server_config
    from shardline.service.db import Database
    from shardline.service.local_ray import LocalRay, credentials_withheld, start_local_ray
    from shardline.service.migrate import upgrade_to_head
    from shardline.service.store import JobStore
    from shardline.service.users import UserDirectory, bootstrap_admin
    from shardline.workers.contract.lifecycle import SUPERVISED
    from shardline.workers.storage.urls import missing_bucket

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = load_settings(**overrides)
    # The port first: a port taken is said in one line before anything is started.
    listener = listen_on(settings.host, settings.port)
    settings.storage_limits.install()  # a store that does not answer is said in seconds
    if settings.checkpoint_root and (bucket := missing_bucket(settings.checkpoint_root)):
        raise fail(
            [
                f"the bucket {bucket} of SHARDLINE_CHECKPOINT_ROOT does not exist; create it "
                "(Shardline never creates one) or set SHARDLINE_CHECKPOINT_ROOT to another"
            ],
            code=1,
        )
    bound_port = listener.getsockname()[1]
    private_state(settings.state_dir)
    url = settings.resolved_database_url
    upgrade_to_head(url)
    db = Database(url)
    token_file = settings.resolved_admin_token_file
    token = bootstrap_admin(UserDirectory(db), token_file)
    login_url = server_url(settings.host, bound_port)
    if token is not None:
        console.print(
            f"Created user 'admin'. Its API token is shown once:\n  {token}\n"
            f"(saved with mode 0600 to {token_file}, where "
            "the CLI finds it when run from this folder). To use the CLI from any folder:\n"
            f"  shardline login --url {login_url} --token {token}",
            soft_wrap=True,
        )
    elif token_file.is_file():
        # Every start says where the token is and how to log in, never the token itself.
        console.print(
            f"The admin token is in {token_file} (the CLI finds it when run from this "
            f"folder). To use the CLI from any folder:\n"
            f'  shardline login --url {login_url} --token "$(cat {token_file.absolute()})"',
            soft_wrap=True,
        )
    local: LocalRay | None = None
    address = settings.ray_address
    if not address:
        local = start_local_ray(settings.state_dir, settings.ray_num_cpus)
        if withheld := credentials_withheld():
            console.print(
                f"The local Ray head's jobs do not get this process's {', '.join(withheld)}: "
                "their ranks read the node's own credentials (a profile, an instance role); "
                "set SHARDLINE_PASS_STORAGE_CREDENTIALS=1 to pass these on.",
                soft_wrap=True,
            )
        local.use_auth()  # before ray is imported: it reads its auth settings then
        address = local.address
    from shardline.service.ray_runtime import RayRuntime

    store = JobStore(db)
    runtime = RayRuntime(settings, store, address)
    console.print(
        f"Shardline on http://{settings.host}:{bound_port} (status page at /, API docs "
        f"at /docs); Ray at {address}",
        soft_wrap=True,
    )
    try:
        server = uvicorn.Server(server_config(create_app(settings, runtime), settings))
        server.run(sockets=[listener])
    finally:
        # QUEUED and PAUSED jobs hold nothing on Ray: only supervised ones keep the head.
        active = [j for j in store.active_jobs() if j.state in SUPERVISED]
        if local is not None and not active:
            local.stop()
        elif local is not None:
            console.print(
                f"Leaving the local Ray head running for {len(active)} active "
                "job(s); `shardline serve` re-attaches to it."
            )
        db.dispose()


def private_state(state_dir: Path) -> None:
    """Everything the service writes from here on is its user's alone (the database, the
    admin token, logs, checkpoints, the local Ray head's files): folders 0700, files 0600.
    A state folder an older version made readable to others is made private too."""
    os.umask(0o077)
    state_dir.mkdir(parents=True, exist_ok=True)
    if state_dir.stat().st_uid == os.getuid():
        state_dir.chmod(0o700)


def listen_on(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (as uvicorn binds one), or one line naming the
    setting to change and exit 1."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        why = "is in use" if err.errno == errno.EADDRINUSE else f"cannot be used ({err.strerror})"
        raise fail(
            [
                f"{host}:{port} {why}; choose another with --port or SHARDLINE_PORT "
                "(and --host or SHARDLINE_HOST)"
            ],
            code=1,
        ) from None
    return sock  # not inheritable: the local Ray head it starts must not hold the port


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    log.info("stopping on signal %d", signum)
    raise SystemExit(0)
