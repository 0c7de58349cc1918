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


def database_for(mode: str, db_dir: Path):
    """The profile's database under ``db_dir/hypothesis``: none, read only, or read and written."""
    path = Path(db_dir) / "hypothesis"
    if mode == "none" or (mode == "read" and not path.is_dir()):
        return None
    db = DirectoryBasedExampleDatabase(str(path))
    return ReadOnlyDatabase(db) if mode == "read" else db
