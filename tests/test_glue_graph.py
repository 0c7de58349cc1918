"""SGLang's metadata glue graph, switched on for the target verify runner, judged by the graph properties.

The glue graph (``metadata_glue_graph.MetadataGlueGraph``, switched on by
``SGLANG_ENABLE_METADATA_GLUE_GRAPH``) captures the backend's per-replay metadata
prep after two warm-ups of a replay key and replays it from then on. A case
whose server switches it on (``graph_glue.glued``; ``VMFUZZ_GLUE_SHARE=1``: every
case) replays each batch of a captured bs after the lead-ins that make its own
replay a glued one. A bug planted in the glue path of a copy of SGLang must be
caught by the property meant for it, as that property's own failure; a rewrite
that keeps what the code does holds; the pristine copy holds, or, where the
server's verify input carries a mask tensor of its own each step (frozen-KV
MTP), ends in the known entries that say why.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import sglang_or_skip
from tests.sglang_copies import altered_copy, failed_check_origin, replay_steps_on_copy
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode

RUNNER = ["srt/model_executor/runner/decode_cuda_graph_runner.py"]
GLUE = ["srt/model_executor/runner/metadata_glue_graph.py"]
GLUE_REPLAY, GLUE_ROUTE = "metadata glue graph replay", "metadata glue graph route"

#: a server capturing bs 1, 2, 4: a padded batch (not routed), bs 1 and bs 4 each replayed exactly (after
#: their lead-ins), then a padded batch in bs 4's graph, whose glue graph is captured by then; its context
#: (34) one whose case is no window-pool server with every case glued (a window pool's write slots are
#: another defect: tests/test_glue_window_pool.py)
CONFIG = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 34, "num_draft_tokens": 4, "topk": 2,
          "spec_steps": 2, "is_read": True}
SEQ_LENS = [(5, 7, 3), (9,), (2, 3, 4, 5), (1, 2, 3)]

#: name -> (edits, the property meant to catch it, the buffers its origin may name)
ALTERATIONS = {
    # the glue key forgets the batch size: bs 4's replay runs the prep the glue graph captured for bs 1,
    # whose host batch size (and every per-request length it sliced) is frozen at 1
    "glue-key-without-bs": (
        [(RUNNER, r"key = \(bs, str\(self\.capture_forward_mode\), actual_mode\)",
          "key = (str(self.capture_forward_mode), actual_mode)")],
        "capture-replay-agreement", ("view.batch_size",)),
    # the glue route taken on a padded replay too: SGLang's glue contract holds a captured prep's host
    # branches constant only for padding-free replays (Triton's prep happens to read no padding: measured,
    # its real rows hold; the route is judged as the view's other fields are, read or not)
    "glue-route-on-padded-replay": (
        [(RUNNER, r"            and raw_bs == bs\n            and not self\.enable_two_batch_overlap",
          "            and not self.enable_two_batch_overlap")],
        "capture-replay-agreement", ("num_padding",)),
    # the capture step trusts its capture to have run the prep: on a device a capture records and runs
    # nothing, so that step's attention reads the previous step's metadata
    "glue-capture-not-replayed": (
        [(GLUE, r"\n        # Capture records without executing; replay once to do this step's prep\.\n"
                r"        graph\.replay\(\)", "\n")],
        "graph-replay-equivalence", ("logits", "hidden_states", "attention")),
}

#: the replay branch's re-install written through ``reinstall``, which does the same
REFACTOR = [(GLUE, r"            for backend, metadata in st\[\"meta\"\]:\n"
                   r"                backend\.forward_metadata = metadata\n",
             "            self.reinstall(key)\n")]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALTERATIONS))
def test_each_planted_glue_bug_is_caught_by_its_property(tmp_path, monkeypatch, name):
    sglang_or_skip()
    monkeypatch.setenv("VMFUZZ_GLUE_SHARE", "1")
    edits, prop, buffers = ALTERATIONS[name]
    proc, out = replay_steps_on_copy(altered_copy(tmp_path, edits, name), tmp_path, CONFIG, SEQ_LENS, prop)
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert origin["property"] == prop and origin["writer"] in (GLUE_REPLAY, GLUE_ROUTE), origin
    assert origin["buffer"] in buffers, origin


@pytest.mark.slow
@pytest.mark.parametrize("prop", ["capture-replay-agreement", "graph-replay-equivalence", "padding-inert"])
def test_a_glue_refactor_holds_and_so_does_the_pristine_copy(tmp_path, monkeypatch, prop):
    sglang_or_skip()
    monkeypatch.setenv("VMFUZZ_GLUE_SHARE", "1")
    edits = REFACTOR if prop != "padding-inert" else []
    site = altered_copy(tmp_path, edits, "refactor" if edits else None)
    proc, out = replay_steps_on_copy(site, tmp_path, CONFIG, SEQ_LENS, prop)
    assert proc.returncode == 0 and f"held {prop}" in out, out


# -- in-process, on the installed SGLang -----------------------------------------------------------------

def _config(site: str) -> Config:
    """The server of ``CONFIG``'s shape at ``site``, its context widened past any case that glues on a
    window pool (``graph_glue.window_pool``: its window layers' writes are another defect,
    tests/test_glue_window_pool.py)."""
    from vmfuzz.harness.properties.graph_glue import window_pool
    return next(c for c in (Config(TreeMaskMode.FULL_MASK, 4, n, 4, 2, 2, True, site) for n in range(34, 64))
                if not window_pool(c))


@pytest.mark.parametrize("site", ["eagle", "pp"])
def test_a_glued_replay_holds_where_the_mask_is_written_into_the_backends_buffer(sglang_target, monkeypatch,
                                                                                 site):
    """Measured on the installed SGLang: the Triton target-verify prep the glue graph captures reads, on
    the host, the verify input's mask tensor and its length (the copy into the backend's buffer). A call
    site that writes the mask into that buffer hands the same tensor every step, so a glued replay whose
    lengths moved since the capture still gives the eager run's rows and reads no moved host value."""
    from vmfuzz.harness.properties import PROPERTIES
    monkeypatch.setenv("VMFUZZ_GLUE_SHARE", "1")
    batches = [Batch(s) for s in SEQ_LENS]
    for name in ("graph-replay-equivalence", "capture-replay-agreement"):
        obs = PROPERTIES[name].check(sglang_target, _config(site), batches)
        assert {"metadata glue graph: captured and replayed", "metadata glue graph: captured, replayed at once",
                "metadata glue graph: warm-up (eager)",
                "metadata glue graph: not routed (a padded replay: SGLang prepares it eagerly by design)",
                } <= obs.classes, sorted(obs.classes)
        assert not [c for c in obs.classes if "known finding" in c], sorted(obs.classes)


def test_a_per_step_mask_is_replayed_frozen_and_ends_in_the_known_entries(sglang_target, monkeypatch):
    """Frozen-KV MTP's verify input carries a mask tensor of its own each step: the glue graph copies the
    capture step's (known/metadata-glue-per-step-mask-*.json); each property meets it as its known entry."""
    from vmfuzz.harness.properties import PROPERTIES
    monkeypatch.setenv("VMFUZZ_GLUE_SHARE", "1")
    batches = [Batch(s) for s in SEQ_LENS]
    for name, entry in (("capture-replay-agreement", "agreement"), ("graph-replay-equivalence", "equivalence"),
                        ("padding-inert", "padding-inert")):
        obs = PROPERTIES[name].check(sglang_target, _config("frozen_kv_mtp"), batches)
        assert f"metadata glue graph: known finding metadata-glue-per-step-mask-{entry}" in obs.classes, \
            sorted(obs.classes)


def test_the_altered_copies_case_is_no_window_pool_server(monkeypatch):
    from vmfuzz.harness.model.repro_file import decode, to_case
    from vmfuzz.harness.properties.graph_glue import glued, window_pool
    monkeypatch.setenv("VMFUZZ_GLUE_SHARE", "1")
    repro = json.dumps({"config": CONFIG, "batches": [{"seq_lens": list(s)} for s in SEQ_LENS]}).encode()
    config, _ = to_case(decode(repro))
    assert glued(config) and not window_pool(config)


def test_a_case_off_the_share_says_so(sglang_target):
    from vmfuzz.harness.properties import PROPERTIES
    from vmfuzz.harness.properties.graph_glue import glued
    config = next(c for c in (Config(TreeMaskMode.FULL_MASK, 1, n, 2, 1, 1) for n in range(2, 40)) if not glued(c))
    obs = PROPERTIES["capture-replay-agreement"].check(sglang_target, config, [Batch((1,))])
    assert "metadata glue graph: off (not among the one case in 4 whose server switches it on)" in obs.classes
