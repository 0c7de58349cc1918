"""``vmfuzz merge DIR...``: one report from the report folders of a sharded run.

Exit codes as a single run's: 1 when any shard found something, 3 when a check
could not be made, 0 when every property held; 2 (one line) when the folders
are not every shard of one finished run.
"""

from __future__ import annotations

import sys

from vmfuzz.harness.commands.common import claimed_report_dir
from vmfuzz.harness.commands.request import MergeRequest
from vmfuzz.harness.model.errors import EXIT_FINDING, EXIT_OK, EXIT_OUT_OF_STEP, UsageError


def run(request: MergeRequest) -> int:
    from vmfuzz.harness.report.merge import (MergeError, check_shards, merge_summaries, read_summary, relocate,
                                             selection_unconfirmed, write_merged)
    try:
        shards = [(d, read_summary(d)) for d in request.dirs]
        split = check_shards(shards)
    except MergeError as exc:
        raise UsageError(f"vmfuzz merge: {exc}") from None
    report_dir = claimed_report_dir(request.report_dir)
    merged = merge_summaries(relocate(shards, split, report_dir))
    unconfirmed = selection_unconfirmed(shards)
    if unconfirmed:
        print(f"vmfuzz merge: warning: {unconfirmed}", file=sys.stderr)
        merged["warnings"].append(unconfirmed)
    write_merged(merged, report_dir)
    c = merged["counts"]
    print(f"vmfuzz merge: {len(request.dirs)} shard(s) ({', '.join(merged['shards'])}): {c['properties']} properties, "
          f"{c['held']} held, {c['failed']} failed, {c['findings']} finding(s) in {c['groups']} group(s)")
    print(f"reports: {report_dir}/ (summary.json, summary.md, junit.xml, report.html; findings/)")
    from vmfuzz.harness.report.decide import verdict_of
    # the joined summary's verdict, decided by a single run's rule (a known finding never fails it)
    v = verdict_of(merged)
    if v.exit_code == EXIT_OUT_OF_STEP:
        print(f"vmfuzz merge: could not check: {v.why} (see summary.md)", file=sys.stderr)
    print(f"vmfuzz merge: {v.headline}")
    if v.exit_code == EXIT_OK and c["replays_failed"]:
        return EXIT_FINDING  # a summary from before replays' failures were finding groups
    return v.exit_code
