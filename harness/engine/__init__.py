"""Runs the checks: plans, Hypothesis searches, isolation, replays, shrinking, enumeration, bisect."""
