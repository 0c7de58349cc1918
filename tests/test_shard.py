"""A run split over machines: ``--shard K/N``, a Redis example database, ``vmfuzz merge``.

The Redis test starts a real ``redis-server`` on a free port and stops it; .ci/run
installs redis-server, so in CI the test never skips.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from vmfuzz.harness.engine.campaign.shard import parse_shard, shard_properties
from vmfuzz.harness.properties import PROPERTIES
from tests.helpers import vmfuzz

# a variant that fails some properties and not others: the merged verdicts must match the
# single run's on both sides. Split 3 ways, shard 1 (chain-writer) holds, 2 and 3 fail. (None of
# them is judged on the shared run, whose members' verdicts depend on which of them run together.)
TARGET = "reference+fits-off-by-one"
PROPS = ("--property", "chain-writer", "--property", "trivial-path", "--property", "reader-agreement")
RUN = ("run", "--profile", "nightly", "--seed", "5", "--max-examples", "15", "--time-budget", "6", *PROPS)


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
    (("run", "--shard", "1/99"), f"only {len(PROPERTIES)} properties"),
    (("run", "--profile", "nightly", "--db", "redis://127.0.0.1:1/0"), "cannot use the Redis server"),
    (("merge", "no-such-folder"), "no summary.json"),
])
@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    proc = vmfuzz(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_server(tmp_path):
    """A real redis-server on a free port: (its URL, its process)."""
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
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def redis_url(redis_server):
    return redis_server[0]


def _verdicts(folder: Path) -> dict[str, str]:
    s = json.loads((folder / "summary.json").read_text())
    return {p["name"]: p["status"] for p in s["properties"]}


def _redis_repr(key: bytes) -> str:
    """``key`` as MONITOR prints it (redis' sdscatrepr)."""
    named = {ord("\\"): "\\\\", ord('"'): '\\"', 10: "\\n", 13: "\\r", 9: "\\t", 7: "\\a", 8: "\\b"}
    return "".join(named.get(c) or (chr(c) if 32 <= c < 127 else f"\\x{c:02x}") for c in key)


class _Monitor(threading.Thread):
    """Every command the server runs while it watches (MONITOR), until it sees ``MARK``."""

    MARK = "vmfuzz-test-monitor-done"

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.lines, self.watching = url, [], threading.Event()

    def run(self):
        import redis
        with redis.Redis.from_url(self.url, socket_timeout=None).monitor() as m:  # quiet for a while: no timeout
            self.watching.set()
            while not self.lines or self.MARK not in self.lines[-1]:
                r = m.connection.read_response()
                self.lines.append(r.decode("utf-8", "replace") if isinstance(r, bytes) else str(r))

    def stop(self) -> list[str]:
        import redis
        redis.Redis.from_url(self.url).echo(self.MARK)
        self.join(timeout=60)
        return self.lines


@pytest.mark.slow
def test_shards_share_one_redis_database_and_merge_to_the_single_runs_verdicts(tmp_path, redis_url):
    import redis
    # each shard in its own folder, as on its own machine: only Redis is shared
    shards, codes = [], []
    for k in (1, 2, 3):
        machine = tmp_path / f"machine{k}"
        machine.mkdir()
        proc = vmfuzz(*RUN, "--target", TARGET, "--shard", f"{k}/3", "--db", redis_url, "--report-dir", "report",
                      cwd=machine)
        codes.append(proc.returncode)
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        shards.append(machine / "report")
    assert codes == [0, 1, 1]  # chain-writer holds; trivial-path and reader-agreement fail
    single = vmfuzz(*RUN, "--target", TARGET, "--db", str(tmp_path / "local-db"), "--report-dir",
                    str(tmp_path / "single"))
    assert single.returncode == 1, single.stdout + single.stderr  # the variant is caught

    merged = vmfuzz("merge", *map(str, shards), "--report-dir", str(tmp_path / "merged"))
    assert merged.returncode == single.returncode, merged.stdout + merged.stderr
    assert _verdicts(tmp_path / "merged") == _verdicts(tmp_path / "single")
    for name in ("summary.md", "junit.xml", "report.html"):
        assert (tmp_path / "merged" / name).is_file()
    summary = json.loads((tmp_path / "merged" / "summary.json").read_text())
    assert summary["shards"] == ["1/3", "2/3", "3/3"]
    # shards 2 and 3's causes, none lost: one merged group per distinct origin key across the shards
    keys = {g["key"] for f in shards for g in json.loads((f / "summary.json").read_text())["groups"]}
    assert {g["key"] for g in summary["groups"]} == keys and summary["counts"]["groups"] == len(keys) > 0
    counts = sum(g["count"] for f in shards for g in json.loads((f / "summary.json").read_text())["groups"])
    assert sum(g["count"] for g in summary["groups"]) == counts

    # The next night splits the run 2 ways, on another machine: its shard 1/2 (chain-writer,
    # reader-agreement) reads from Redis the examples that last night's shards wrote. (A failure
    # found by a boundary case is not saved, being no search's; a held search's examples are.)
    client = redis.Redis.from_url(redis_url)
    written = {k for k in client.scan_iter("hypothesis-example:*") if client.type(k) == b"set" and client.scard(k)}
    assert any(b"chain-writer" in k for k in written), sorted(written)
    monitor = _Monitor(redis_url)
    monitor.start()
    assert monitor.watching.wait(timeout=60)
    (tmp_path / "machine4").mkdir()
    night2 = vmfuzz(*RUN, "--target", TARGET, "--seed", "6", "--shard", "1/2", "--db", redis_url, "--report-dir",
                    "report", cwd=tmp_path / "machine4")
    assert night2.returncode == 1, night2.stdout + night2.stderr  # reader-agreement fails again
    read = [line for line in monitor.stop() if '"smembers"' in line.lower()]
    reread = {k for k in written if any(f'"{_redis_repr(k)}"' in line for line in read)}
    assert any(b"chain-writer" in k for k in reread), (sorted(written), read[:20])


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.slow
def test_a_redis_server_that_dies_mid_night_loses_nothing(tmp_path, redis_server, workers):
    url, server = redis_server
    # the target kills the server at its first buffer: the run started with it, the search goes on without
    r = vmfuzz(*RUN, "--target", "tests.plugins:KillsRedisMidRun+fits-off-by-one", "--isolate", "off",
               "--workers", workers, "--db", url, "--report-dir", str(tmp_path / "r"),
               env={"VMFUZZ_TEST_REDIS_PID": str(server.pid)}, cwd=tmp_path)
    assert server.poll() is not None, "the server outlived the run: nothing was tested"
    assert r.returncode == 1, r.stdout + r.stderr  # trivial-path and reader-agreement fail, as with a live server
    assert r.stderr.count("stopped answering") == 1 and "Traceback" not in r.stderr, r.stderr
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert _verdicts(tmp_path / "r") == {"chain-writer": "held", "trivial-path": "failed",
                                         "reader-agreement": "failed"}
    assert [w for w in s["warnings"] if "stopped answering" in w]
    for name in ("summary.md", "junit.xml", "report.html"):
        assert (tmp_path / "r" / name).is_file()
    assert s["findings"] and all((tmp_path / "r" / f["repro"]).is_file() for f in s["findings"])
    assert list((tmp_path / ".vmfuzz-db" / "hypothesis").iterdir())  # the search went on with a local database
