"""The example database a search reads (pr) and writes (nightly), one slice per property."""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase, ReadOnlyDatabase


class KeyedDatabase(ExampleDatabase):
    """One property's slice of a shared example database.

    Every property's search is the same inner function, so Hypothesis would give
    them one database key; the prefix keeps their examples apart.
    """

    def __init__(self, inner: ExampleDatabase, prefix: str):
        super().__init__()
        self.inner, self.prefix = inner, prefix.encode() + b"/"

    def save(self, key, value):
        self.inner.save(self.prefix + key, value)

    def fetch(self, key):
        yield from self.inner.fetch(self.prefix + key)

    def delete(self, key, value):
        self.inner.delete(self.prefix + key, value)

    def move(self, src, dest, value):
        self.inner.move(self.prefix + src, self.prefix + dest, value)


class RegularFilesDatabase(DirectoryBasedExampleDatabase):
    """Hypothesis's folder database, reading regular files only.

    A FIFO among the examples (left by a tool, or planted) would block the search on
    its open forever, past every time cap, and a device file could be endless: each
    entry is opened without blocking and without following a link, and anything but
    a regular file is skipped, said once per entry on stderr, never read.
    """

    def fetch(self, key):
        folder = self._key_path(key)
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            path = folder / name
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            except OSError as exc:
                if os.path.islink(path):
                    _skipped(path, "a symbolic link")
                elif exc.errno != errno.ENOENT:  # gone meanwhile: nothing to say
                    _skipped(path, exc.strerror or str(exc))
                continue
            try:
                mode = os.fstat(fd).st_mode
                if not stat.S_ISREG(mode):
                    _skipped(path, "not a regular file")
                    continue
                with os.fdopen(fd, "rb", closefd=False) as fh:
                    yield fh.read()
            except OSError:
                continue
            finally:
                os.close(fd)


_said: set[str] = set()


def _skipped(path: Path, why: str) -> None:
    if str(path) not in _said:
        _said.add(str(path))
        print(f"vmfuzz: warning: example database entry {path} skipped ({why}): never read", file=sys.stderr,
              flush=True)


#: ``--db`` values naming a Redis server instead of a folder
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def shared_url(value: str) -> str | None:
    """The Redis URL ``--db`` names, or None when it names a folder."""
    return value if str(value).startswith(REDIS_SCHEMES) else None


def redis_database(url: str) -> ExampleDatabase:
    """Hypothesis's own Redis-backed database: shards on several machines read and write one
    example database. Raises ``SharedDatabaseError`` (one line) when it cannot be used."""
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise SharedDatabaseError(f"--db {url}: a Redis database needs the redis package "
                                  "(pip install 'vmfuzz[shared-db]')") from None
    try:
        # a server that stops answering mid-night is an error (then a local database), never a hang
        client = redis.Redis.from_url(url, socket_connect_timeout=10, socket_timeout=60)
        client.ping()
    except (redis.RedisError, ValueError) as exc:
        raise SharedDatabaseError(f"--db {url}: cannot use the Redis server: {exc}") from None
    return RedisExampleDatabase(client)


class SharedDatabaseError(Exception):
    pass


#: this process's shared database that went local: why (said once; the summary carries it)
_lost: list[str] = []
#: a worker process says nothing itself: its result carries the warning to its parent (``note_lost`` there)
_quiet: list[bool] = [False]


def lost_shared_database() -> str | None:
    """Why this process's shared database went local, or None while it answers."""
    return _lost[0] if _lost else None


def start_afresh(quiet: bool = False) -> None:
    """A new run (or a worker, ``quiet``) in this process: nothing lost yet."""
    _lost.clear()
    _quiet[0] = quiet


def note_lost(warning: str) -> None:
    """The shared database went local (here, or in a worker that said nothing): said once per run."""
    if not _lost:
        _lost.append(warning)
        if not _quiet[0]:
            print(f"vmfuzz: warning: {warning}", file=sys.stderr, flush=True)


class FallbackDatabase(ExampleDatabase):
    """The Redis database while it answers; a local folder from its first failure on.

    A server that dies mid-night must not take the night with it: the search goes
    on with ``local`` (the examples saved before stay on the server for the next
    night), and the switch is said once on stderr and kept for the summary. The
    server was checked before the run (``check_shared_db``: exit 2 when it cannot
    be used), so one gone by the time a worker opens it has died meanwhile.
    """

    def __init__(self, url: str, local: Path):
        super().__init__()
        self.url, self.local, self.went_local = url, Path(local), False
        try:
            self.active = redis_database(url)
        except SharedDatabaseError as exc:
            self._go_local(exc)

    def _call(self, op: str, *args) -> list:
        import redis
        try:
            return list(getattr(self.active, op)(*args) or ())
        except redis.RedisError as exc:
            if self.went_local:
                raise
            self._go_local(exc)
        return list(getattr(self.active, op)(*args) or ())

    def _go_local(self, exc: Exception) -> None:
        self.active, self.went_local = RegularFilesDatabase(str(self.local)), True
        why = " ".join(str(exc).split()) or type(exc).__name__
        note_lost(f"the Redis example database {self.url} stopped answering ({why[:200]}); the run went on "
                  f"with a local one in {self.local}")

    def save(self, key, value):
        self._call("save", key, value)

    def fetch(self, key):
        yield from self._call("fetch", key)

    def delete(self, key, value):
        self._call("delete", key, value)

    def move(self, src, dest, value):
        self._call("move", src, dest, value)


def database_for(mode: str, db_dir: Path, url: str | None = None):
    """The profile's database: none, read only, or read and written; under ``db_dir/hypothesis``,
    or on the Redis server at ``url`` (falling back to ``db_dir/hypothesis`` if it stops answering)."""
    if mode == "none":
        return None
    if url:
        db = FallbackDatabase(url, Path(db_dir) / "hypothesis")
    else:
        path = Path(db_dir) / "hypothesis"
        if not path.is_dir() and (mode == "read" or os.path.lexists(path)):
            return None  # a FIFO or a file there is skipped, never opened (the plan warned of it)
        db = RegularFilesDatabase(str(path))
    return ReadOnlyDatabase(db) if mode == "read" else db
