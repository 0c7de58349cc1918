"""FA3's chain (topk 1) cuda-graph replay on an installed 0.5.22, judged by reader-agreement on its own code.

0.5.22 refills the chain's replay metadata as 0.5.23 does (``_apply_cuda_graph_metadata``'s non-ragged
arm, then SGLang's decode-metadata Triton kernel). Each of tests/test_fa3_chain.py's replay alterations
is planted in a copy of that release's SGLang (``VMFUZZ_RELEASES_DIR``, as
tests/test_graph_older_releases.py finds it) and must be caught by reader-agreement's own check at the
replay; the refactor and the pristine copy hold.
"""

from __future__ import annotations

import json

import pytest

from tests.sglang_copies import altered_copy, run_on_copy
from tests.test_fa3_chain import REPLAY_ALTERATIONS, REPLAY_CASE, assert_replay_verdict
from tests.test_kv_locations_older import _release

RELEASE = "0.5.22"


def _replay_on_release(tmp_path, edits, name: str):
    python, package = _release(RELEASE)
    site = altered_copy(tmp_path, edits, name, package=package)
    repro = tmp_path / "case.json"
    repro.write_text(json.dumps({"config": REPLAY_CASE, "batches": [{"seq_lens": [3, 5]}]}))
    return run_on_copy(site, tmp_path, "replay", str(repro), "--target", "sglang", "--property", "reader-agreement",
                       "--isolate", "off", "--report-dir", str(tmp_path / "report"), python=python)


@pytest.mark.slow
@pytest.mark.release
@pytest.mark.parametrize("alteration", [None, *REPLAY_ALTERATIONS], ids=["pristine", *REPLAY_ALTERATIONS])
def test_the_chain_replay_of_an_older_release_is_judged_on_its_own_code(tmp_path, alteration):
    edits, buffer = REPLAY_ALTERATIONS[alteration] if alteration else ([], None)
    proc, out = _replay_on_release(tmp_path, edits, alteration or "pristine")
    assert_replay_verdict(tmp_path, proc, out, buffer)  # the planted bugs' catches show the arm ran
