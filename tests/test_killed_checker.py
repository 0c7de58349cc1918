"""A checker SIGKILLed from outside is not the code under test crashing.

SIGKILL is what the OOM killer and a CI runner's cancel send; a kernel's own fault
is SIGSEGV, SIGABRT or SIGBUS. The watched worker reruns the case once in a fresh
process: a case that then holds is held, one killed again is the target's crash.
"""

from __future__ import annotations

import pytest

from vmfuzz.harness.engine.core.isolation import CRASH, IsolatedChecker, TargetFault
from vmfuzz.harness.model.config import Batch, Config, TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.targets import resolve

CONFIG = Config(mode=TreeMaskMode.FULL_MASK, max_bs=2, max_context_len=8, num_draft_tokens=3, topk=1, spec_steps=2,
                is_read=True)


def test_a_checker_killed_once_from_outside_reruns_the_case_and_it_holds(tmp_path, monkeypatch):
    monkeypatch.setenv("VMFUZZ_TEST_KILLED_ONCE", str(tmp_path / "killed"))
    with IsolatedChecker(resolve("tests.plugins:KilledOnceTarget"), 60) as check:
        check(PROPERTIES["no-oob-write"], CONFIG, [Batch(seq_lens=(3, 4))])
    assert (tmp_path / "killed").exists()  # the kill happened, and the rerun judged the case


def test_a_checker_killed_every_time_is_the_targets_crash():
    with IsolatedChecker(resolve("tests.plugins:KillingTarget"), 60) as check:
        with pytest.raises(TargetFault) as caught:
            check(PROPERTIES["no-oob-write"], CONFIG, [Batch(seq_lens=(3, 4, 5))])
    assert caught.value.kind == CRASH and "SIGKILL, twice" in str(caught.value)
