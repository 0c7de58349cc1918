"""The example database a search reads (pr) and writes (nightly), one slice per property."""

from __future__ import annotations

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
        client = redis.Redis.from_url(url)
        client.ping()
    except (redis.RedisError, ValueError) as exc:
        raise SharedDatabaseError(f"--db {url}: cannot use the Redis server: {exc}") from None
    return RedisExampleDatabase(client)


class SharedDatabaseError(Exception):
    pass


def database_for(mode: str, db_dir: Path, url: str | None = None):
    """The profile's database: none, read only, or read and written; under ``db_dir/hypothesis``,
    or on the Redis server at ``url``."""
    if mode == "none":
        return None
    if url:
        db = redis_database(url)
    else:
        path = Path(db_dir) / "hypothesis"
        if mode == "read" and not path.is_dir():
            return None
        db = DirectoryBasedExampleDatabase(str(path))
    return ReadOnlyDatabase(db) if mode == "read" else db
