"""PostgreSQL's notices of writes, for the read cache: migration 0008 makes every statement
that writes `users`, `api_tokens` or `jobs` notify `shardline_writes` as it commits, from
any process (another API server, the CLI, a script in psql). Each API server listens on a
connection of its own and moves the read cache's generation on at each notice, so what
another process wrote shows at the next read instead of after `read_cache_s`.

While the listener is connected the cache keeps answers longer (`notified_ttl_s`). When it
is not (the server restarted, the connection cut), the cache keeps them for `ttl_s` only;
going either way moves the generation on, since a write may have landed unseen.
A half-open connection (a peer gone without a word) is found by TCP keepalives.
"""

from __future__ import annotations

import importlib.util
import logging
import threading

from sqlalchemy.engine import make_url

from service.read_cache import ReadCache, moved_on

log = logging.getLogger(__name__)

CHANNEL = "shardline_writes"  # migrations/versions/0008_write_notices.py
APPLICATION_NAME = "shardline-write-notices"  # how it shows in pg_stat_activity
POLL_S = 0.5  # how often the listening thread looks up to see whether it should stop
RETRY_S = 1.0  # between attempts to connect again


def libpq_url(url: str) -> str:
    """The SQLAlchemy URL as libpq takes it (no driver name)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class WriteListener:
    """A thread that holds one connection LISTENing on CHANNEL while the server runs."""

    def __init__(self, url: str, cache: ReadCache, retry_s: float = RETRY_S) -> None:
        self.conninfo = libpq_url(url)
        self.cache = cache
        self.retry_s = retry_s
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
        self._thread = threading.Thread(target=self._run, name="write-notices", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=POLL_S + 5)

    def _run(self) -> None:
        import psycopg  # only where the database is PostgreSQL (the `postgres` extra)

        said_down = False
        while not self._stop.is_set():
            try:
                self._listen()
                said_down = False
            except psycopg.Error as err:
                if not said_down:  # once per outage, not once a second
                    log.warning("not told of other processes' writes (%s); retrying", err)
                said_down = True
            finally:
                self.cache.listening = False
                moved_on()  # unseen writes may land from now on
            self._stop.wait(self.retry_s)

    def _listen(self) -> None:
        import psycopg

        with psycopg.connect(
            self.conninfo,
            autocommit=True,
            connect_timeout=5,
            application_name=APPLICATION_NAME,
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=3,
            keepalives_count=3,
        ) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            self.cache.listening = True
            moved_on()  # what was written while nobody listened
            log.info("told of every write to the database from now on")
            while not self._stop.is_set():
                for _ in conn.notifies(timeout=POLL_S):
                    moved_on()
