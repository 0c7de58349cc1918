"""Runs the checks, in rooms by workflow, each importing only the rooms below it.

``campaign`` (a run, a gate, a nightly, shards: plan to outcome) stands on
``regression`` (saved repros, known findings, replay, minimize, bisect), which
stands on ``search`` (a case's properties searched, enumerated or checked by
arithmetic), which stands on ``core`` (how any of them runs one check: the
forked worker, how a check's exception is named, how a run ends, what a
check's process records).
"""
