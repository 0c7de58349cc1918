"""One run from plan to outcome, and what a CI campaign adds: the gate's trigger and coverage, shards, nightly."""
