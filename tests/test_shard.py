"""A run split over machines: ``--shard K/N``, a Redis example database, ``vmfuzz merge``.

The Redis test starts a real ``redis-server`` on a free port and stops it; .ci/run
installs redis-server, so in CI the test never skips.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from harness.engine.shard import parse_shard, shard_properties
from tests.helpers import vmfuzz

# a variant that fails some properties and not others: the merged verdicts must
# match the single run's on both sides
TARGET = "reference+fits-off-by-one"
RUN = ("run", "--target", TARGET, "--profile", "nightly", "--seed", "5", "--max-examples", "15",
       "--time-budget", "60")


def test_the_split_is_by_property_and_covers_each_once():
    props = [f"p{i}" for i in range(12)]
    shards = [shard_properties(props, k, 5) for k in range(1, 6)]
    assert sorted(p for s in shards for p in s) == sorted(props)
    assert shards[0] == ["p0", "p5", "p10"]
    assert parse_shard(" 2/3 ", 12) == (2, 3)
    for bad in ("0/3", "4/3", "1/13", "1", "a/b", ""):
        with pytest.raises(ValueError):
            parse_shard(bad, 12)


@pytest.mark.parametrize("args, says", [
    (("run", "--shard", "3/2"), "--shard '3/2'"),
    (("run", "--shard", "1/99"), "only 12 properties"),
    (("run", "--profile", "nightly", "--db", "redis://127.0.0.1:1/0"), "cannot use the Redis server"),
    (("merge", "no-such-folder"), "no summary.json"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    proc = vmfuzz(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (.ci/run installs it)")
    port = _free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis
        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _verdicts(folder: Path) -> dict[str, str]:
    s = json.loads((folder / "summary.json").read_text())
    return {p["name"]: p["status"] for p in s["properties"]}


def test_two_shards_share_one_redis_database_and_merge_to_the_single_runs_verdicts(tmp_path, redis_url):
    import redis
    # each shard in its own folder, as on its own machine: only Redis is shared
    shards = []
    for k in (1, 2):
        machine = tmp_path / f"machine{k}"
        machine.mkdir()
        proc = vmfuzz(*RUN, "--shard", f"{k}/2", "--db", redis_url, "--report-dir", "report", cwd=machine)
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        shards.append(machine / "report")
    single = vmfuzz(*RUN, "--db", str(tmp_path / "local-db"), "--report-dir", str(tmp_path / "single"))
    assert single.returncode == 1, single.stdout + single.stderr  # the variant is caught

    merged = vmfuzz("merge", *map(str, shards), "--report-dir", str(tmp_path / "merged"))
    assert merged.returncode == single.returncode, merged.stdout + merged.stderr
    assert _verdicts(tmp_path / "merged") == _verdicts(tmp_path / "single")
    assert "failed" in _verdicts(tmp_path / "single").values() and "held" in _verdicts(tmp_path / "single").values()
    for name in ("summary.md", "junit.xml", "report.html"):
        assert (tmp_path / "merged" / name).is_file()
    summary = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert summary["shards"] == ["1/2", "2/2"]

    # what each shard found is in the one database, under its properties' keys: a later
    # shard (another night, another machine) reads both. (Findings themselves travel as
    # repro files and the local last-failures folder, not through the example database.)
    keys = [k.decode(errors="replace") for k in redis.Redis.from_url(redis_url).scan_iter("hypothesis-example:*")]
    stored = {part for k in keys for part in k.split(":", 1)[1].split("/", 1)[0].removeprefix("shared:").split(",")}
    for folder in shards:
        assert set(_verdicts(folder)) & stored, (folder, sorted(stored))
