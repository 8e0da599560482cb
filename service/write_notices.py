"""PostgreSQL's notices of writes, for the read cache: migration 0008 makes every statement
that writes `users`, `api_tokens` or `jobs` notify `shardline_writes` as it commits, from
any process (another API server, the CLI, a script in psql). Each API server listens on a
connection of its own and moves the read cache's generation on at each notice, so what
another process wrote shows at the next read instead of after `read_cache_s`.

Being connected is not the same as hearing: a stalled path (keepalives answered, nothing
delivered), a pooler in transaction mode or a database without the triggers deliver
nothing and say nothing. So the listener also sends a notice of its own every third of
`read_cache_s`; PostgreSQL delivers notices in commit order, so when it comes back every
write committed before it was sent has been heard of, and the cache may keep answers
longer (`ReadCache.heard`). When they stop coming back, within `read_cache_s` the cache
keeps and gives answers for `read_cache_s` only. A database without the triggers is
never heard (a warning says to migrate it; it is looked at again each second).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import make_url

from shardline.service.read_cache import ReadCache, moved_on

log = logging.getLogger(__name__)

CHANNEL = "shardline_writes"  # migrations/versions/0008_write_notices.py
# The migration's triggers, one per table a cached read shows.
TRIGGERS = tuple(f"shardline_writes_{table}" for table in ("users", "api_tokens", "jobs"))
PING = "ping:"  # a listener's own notices start so; the triggers' are empty
APPLICATION_NAME = "shardline-write-notices"  # how it shows in pg_stat_activity
RETRY_S = 1.0  # between attempts to connect again
CONNECT_TIMEOUT_S = 3  # libpq's unit: whole seconds


class NotHeard(RuntimeError):
    """The database sends no notices of writes (migration 0008 not applied)."""


def libpq_url(url: str) -> str:
    """The SQLAlchemy URL as libpq takes it (no driver name)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _connect(conninfo: str) -> Any:
    import psycopg  # only where the database is PostgreSQL (the `postgres` extra)

    return psycopg.connect(
        conninfo,
        autocommit=True,
        connect_timeout=CONNECT_TIMEOUT_S,
        application_name=APPLICATION_NAME,
        keepalives=1,
        keepalives_idle=10,
        keepalives_interval=3,
        keepalives_count=3,
    )


class WriteListener:
    """A thread that holds one connection LISTENing on CHANNEL while the server runs."""

    def __init__(
        self,
        url: str,
        cache: ReadCache,
        *,
        retry_s: float = RETRY_S,
        connect: Callable[[str], Any] = _connect,
    ) -> None:
        self.conninfo = libpq_url(url)
        self.cache = cache
        self.retry_s = retry_s
        self.ping_s = cache.ttl_s / 3
        self.connect = connect
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_database(cls, url: str, cache: ReadCache) -> WriteListener | None:
        """A listener where there is something to listen to and a cache to tell."""
        if not cache.enabled or make_url(url).get_backend_name() != "postgresql":
            return None
        if importlib.util.find_spec("psycopg") is None:  # another driver (psycopg2)
            log.warning(
                "psycopg is not installed: other processes' writes show within read_cache_s"
            )
            return None
        return cls(url, cache)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="write-notices", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ping_s + CONNECT_TIMEOUT_S + 1)

    def run(self) -> None:
        said: str | None = None
        while not self._stop.is_set():
            try:
                self.listen()
                said = None
            except Exception as err:  # whatever it was, try again: the cache is safe meanwhile
                if str(err) != said:  # once per outage, not once a second
                    log.warning("not hearing of other processes' writes (%s); retrying", err)
                said = str(err)
            self._stop.wait(self.retry_s)

    def listen(self) -> None:
        """One connection's life: LISTEN, then hear notices until stopped or cut off."""
        ping = f"{PING}{uuid.uuid4().hex}"
        with self.connect(self.conninfo) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            found = conn.execute(
                "SELECT tgname FROM pg_trigger WHERE tgname = ANY(%s)", (list(TRIGGERS),)
            ).fetchall()
            if len(found) < len(TRIGGERS):
                raise NotHeard("the database has no write triggers: run `shardline migrate`")
            moved_on()  # written while nobody listened, before the first ping is heard
            log.info("hearing of every write to the database from now on")
            while not self._stop.is_set():
                sent = self.cache.clock()
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, ping))
                for notice in conn.notifies(timeout=self.ping_s):
                    if notice.payload == ping:
                        self.cache.heard(sent)
                    elif not notice.payload.startswith(PING):  # another server's: not a write
                        moved_on()
