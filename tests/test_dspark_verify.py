"""DSpark's target verify wiring of SGLang's runner (its own glue switch, early verify metadata), judged.

A glued case drawn as a DSpark server's (``graph_glue.dspark``; ``VMFUZZ_GLUE_SHARE=1`` glues every
case) builds the target verify runner with DSpark's three switches on
(``targets/sglang/dspark_verify``), stages each step early before its planned
load, from the step before's tensors after a step that took its stage. A bug planted in the
runner's DSpark lines of a copy of SGLang must be caught by the property meant
for it, as its own failure; a rewrite that keeps what the code does holds; the
pristine copy holds; and coverage shows the DSpark lines ran.
"""

from __future__ import annotations

import pytest

from tests.helpers import sglang_or_skip
from tests.sglang_copies import altered_copy, failed_check_origin, replay_steps_on_copy
from tests.surface_ran import assert_texts_ran, surface_never_ran
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode

RUNNER = ["srt/model_executor/runner/decode_cuda_graph_runner.py"]
AGREEMENT = "capture-replay-agreement"
#: a server capturing bs 1, 2, 4 whose context (35) draws a DSpark server among glued cases; at context 28
#: one that also replays its captured glue graphs with no view (SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW)
CONFIG = {"mode": "FULL_MASK", "max_bs": 4, "max_context_len": 35, "num_draft_tokens": 4, "topk": 2,
          "spec_steps": 2, "is_read": True}
SKIP_VIEW_CONTEXT = 28
#: at context 23 a DSpark server serving DeepSeek V4 (no candidate variants: no stage has an early variant)
V4_CONTEXT = 23
#: at context 52 one whose KV pool keeps a request window (its backend declines the glue)
WINDOW_CONTEXT = 52
#: bs 1 after its lead-ins (glue warm-ups, capture), staged from its own tensors (taken), then from the
#: step before's (rejected), and so on; bs 4 likewise; a padded batch (bs 3: its stage is discarded)
SEQ_LENS = [(9,), (10,), (11,), (12,), (1, 2, 3), (6, 7, 8, 9)]
EARLY_STAGE = "early verify metadata stage"

_STAGE_KEY = r"key = self\._glue_key\(bs, str\(ForwardMode\.TARGET_VERIFY\), variant\)"
#: name -> (edits, the cell its origin names): each caught by capture-replay-agreement
ALTERATIONS = {
    # the load takes whatever was staged: a stage of the step before's tensors, whose slots and metadata
    # are that step's, is replayed as this one's
    "take-ignores-its-answer": (
        [(RUNNER, r"return early\.take\(key=key, forward_batch=forward_batch\)",
          "early.take(key=key, forward_batch=forward_batch)\n        return True")], "capture-replay"),
    # the stage keyed at the largest bs: its glue graph (not captured, or another bs's) never matches the
    # load's key, so every stage is thrown away
    "stage-keyed-at-max-bs": (
        [(RUNNER, _STAGE_KEY, "key = self._glue_key(self.max_bs, str(ForwardMode.TARGET_VERIFY), variant)")],
        "not taken"),
    # the stage's token width from the draft steps, not the captured width: no step's positions fit
    "stage-width-from-steps": (
        [(RUNNER, r"num_tokens = bs \* self\.captured_req_width\n        variant",
          "num_tokens = bs * self.speculative_num_steps\n        variant")], "not taken"),
    # the early variant picked as if the length were unknown: always the filtered fallback, never early
    "early-variant-unknown-length": (
        [(RUNNER, r"return variants\.select_for_max_seq_len\(max_seq_len\)",
          "return variants.select_for_max_seq_len(None)")], "not taken"),
}
#: name -> (edits, context, property, the cell its origin names): bugs of the runner's other DSpark wirings
OTHER_WIRINGS = {
    # a load with nothing staged says it took a stage: it skips refilling the staged slots and reinstalls
    # the glue graph's last metadata (another step's) instead of preparing its own (a V4 server's loads)
    "take-with-nothing-staged-says-taken": (
        [(["srt/model_executor/runner/early_verify_metadata.py"],
          r"staged = self\._staged\n        if staged is None:\n            return False",
          "staged = self._staged\n        if staged is None:\n            return True")],
        V4_CONTEXT, AGREEMENT, "capture-replay"),
    # a glued load with no view that skips its glue graph's replay: the graph reads the metadata the last
    # prep left (a rejected stage's, of the step before's lengths)
    "skip-view-replay-dropped": (
        [(RUNNER, r"            self\._metadata_glue\.replay\(glue_key\)\n        else:",
          "            pass\n        else:")], SKIP_VIEW_CONTEXT, "graph-replay-equivalence", None),
}
DSV4 = ["srt/layers/attention/deepseek_v4_backend.py"]
DECLINED = "target verify glue policy"
#: name -> (edits, writer, cell): bugs in DeepSeek V4's hooks the runner asks, each caught by capture-replay-agreement
HOOK_ALTERATIONS = {
    # the draft-runner test turned round: a target is declined, so a DSpark target never glues its prep
    "dsv4-glue-declines-a-target": (
        [(DSV4, r"\(self\.is_draft_runner, \"a draft runner\"\),", '(not self.is_draft_runner, "a draft runner"),')],
        DECLINED, "declined"),
    # the host-lengths test turned round: a DSpark target (device lengths) is declined
    "dsv4-glue-declines-device-lengths": (
        [(DSV4, r"\(self\.needs_cpu_seq_lens, \"host sequence lengths\"\),",
          '(not self.needs_cpu_seq_lens, "host sequence lengths"),')], DECLINED, "declined"),
    # the early switch acknowledged but not kept: the backend builds the in-graph metadata the replays skip
    "dsv4-early-flag-not-kept": (
        [(DSV4, r"self\.builds_verify_metadata_early = True", "self.builds_verify_metadata_early = False")],
        EARLY_STAGE, "backend not told"),
    # the runner stages early without telling its backend
    "runner-never-tells-the-backend": (
        [(RUNNER, r"            self\.attn_backend\.enable_early_verify_metadata\(\)\n", "            pass\n")],
        EARLY_STAGE, "backend not told"),
}
#: name -> (edits, writer, cell): bugs on a server whose pool keeps a request window, caught by agreement
WINDOW_ALTERATIONS = {
    # the request-window test dropped: the backend accepts a glue whose prep reads the window's host layout
    "dsv4-glue-accepts-a-request-window": (
        [(DSV4, r"\(self\.token_to_kv_pool\.request_window is not None, \"a request window\"\),",
          '(False, "a request window"),')], DECLINED, "accepted"),
    # the runner logs its backend's refusal, then glues anyway
    "runner-glues-what-its-backend-declined": (
        [(RUNNER, r'(logger\.info\("Target verify metadata glue graph off: %s\.", why\)\n            )return False',
          r"\1return True")], DECLINED, "glued when declined"),
    # a runner with no early metadata says it staged
    "runner-stages-without-early-metadata": (
        [(RUNNER, r'(cannot be staged\."""\n        early = self\._early_verify_metadata\n        if early is None:\n'
                  r"            )return False", r"\1return True")],
        EARLY_STAGE, "staged when declined"),
}
#: DeepSeek V4's glue hook with its loop's test turned into an early continue, which does the same
HOOK_REFACTOR = [(DSV4, r"            if bad:\n                return why\n        return \"\"",
                  "            if not bad:\n                continue\n            return why\n        return \"\"")]
#: the early variant's pick written with its test the other way round, which does the same
REFACTOR = [(RUNNER, r"if not isinstance\(variants, Dsv41CandidateGraphVariants\):\n            return None\n"
                     r"        return variants\.select_for_max_seq_len\(max_seq_len\)",
             "if isinstance(variants, Dsv41CandidateGraphVariants):\n"
             "            return variants.select_for_max_seq_len(max_seq_len)\n        return None")]


def _config(context: int = 35, skip_view: bool = False, want=None) -> Config:
    from vmfuzz.harness.properties.graph_glue import session_options
    config = Config(TreeMaskMode.FULL_MASK, 4, context, 4, 2, 2, True, "eagle")
    want = want or ("skip view" if skip_view else True)
    assert session_options(config).get("dspark") == want, "the case no longer draws its server: pick another context"
    return config


def _run(site, tmp_path, prop: str, context: int = 35):
    return replay_steps_on_copy(site, tmp_path, {**CONFIG, "max_context_len": context}, SEQ_LENS, prop)


def _caught(tmp_path, monkeypatch, edits, name: str, prop: str = AGREEMENT, context: int = 35) -> dict:
    """The origin of ``prop``'s own failure on a copy altered by ``edits`` (exit 1, never a raise)."""
    sglang_or_skip()
    monkeypatch.setenv("VMFUZZ_GLUE_SHARE", "1")
    proc, out = _run(altered_copy(tmp_path, edits, name), tmp_path, prop, context)
    assert proc.returncode == 1, out
    origin = failed_check_origin(tmp_path / "report", out)
    assert origin["property"] == prop, origin
    return origin


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALTERATIONS))
def test_each_planted_dspark_bug_is_caught_by_capture_replay_agreement(tmp_path, monkeypatch, name):
    edits, cell = ALTERATIONS[name]
    origin = _caught(tmp_path, monkeypatch, edits, name)
    assert (origin["writer"], origin["cell"]) == (EARLY_STAGE, cell), origin


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HOOK_ALTERATIONS) + sorted(WINDOW_ALTERATIONS))
def test_each_planted_bug_of_the_backend_hooks_is_caught_by_capture_replay_agreement(tmp_path, monkeypatch, name):
    """DeepSeek V4's hooks and the runner's use of them, on a plain DSpark server and on one whose pool keeps a
    request window (``WINDOW_ALTERATIONS``)."""
    edits, writer, cell = HOOK_ALTERATIONS.get(name) or WINDOW_ALTERATIONS[name]
    origin = _caught(tmp_path, monkeypatch, edits, name, context=WINDOW_CONTEXT if name in WINDOW_ALTERATIONS else 35)
    assert (origin["writer"], origin["cell"]) == (writer, cell), origin


@pytest.mark.slow
def test_the_glue_hook_rewritten_holds(tmp_path, monkeypatch):
    sglang_or_skip()
    monkeypatch.setenv("VMFUZZ_GLUE_SHARE", "1")
    proc, out = _run(altered_copy(tmp_path, HOOK_REFACTOR, "hook-refactor"), tmp_path, AGREEMENT)
    assert proc.returncode == 0 and f"held {AGREEMENT}" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OTHER_WIRINGS))
def test_each_planted_bug_of_another_dspark_wiring_is_caught(tmp_path, monkeypatch, name):
    edits, context, prop, cell = OTHER_WIRINGS[name]
    origin = _caught(tmp_path, monkeypatch, edits, name, prop, context)
    assert cell is None or origin["cell"] == cell, origin


@pytest.mark.slow
@pytest.mark.parametrize("context", [35, SKIP_VIEW_CONTEXT, V4_CONTEXT, WINDOW_CONTEXT],
                         ids=["view", "skip-view", "deepseek-v4", "request-window"])
@pytest.mark.parametrize("prop", [AGREEMENT, "graph-replay-equivalence", "padding-inert"])
def test_the_pristine_copy_holds_and_so_does_the_rewrite(tmp_path, monkeypatch, prop, context):
    sglang_or_skip()
    monkeypatch.setenv("VMFUZZ_GLUE_SHARE", "1")
    edits = (REFACTOR if context in (35, V4_CONTEXT) else HOOK_REFACTOR if context == WINDOW_CONTEXT else []
             ) if prop == AGREEMENT else []
    proc, out = _run(altered_copy(tmp_path, edits, "refactor" if edits else None), tmp_path, prop, context)
    assert proc.returncode == 0 and f"held {prop}" in out, out


def test_the_dspark_lines_ran_under_the_properties(sglang_target, monkeypatch):
    """coverage.py, as the gate measures: every function ``dspark_verify`` declares driven ran a line under
    the graph properties, and so did the lines that switch DSpark's wiring on and take, reject and
    discard a stage; the staged step was taken and judged; on a DeepSeek V4 server, the early variant's
    pick that finds no candidate variants and the take that finds nothing staged ran too."""
    import importlib.util
    from pathlib import Path

    import coverage

    from vmfuzz.harness.properties import PROPERTIES
    from vmfuzz.harness.properties.graph_shared import one_build_per_case
    from vmfuzz.harness.targets.sglang.dspark_verify import SURFACE
    monkeypatch.setenv("VMFUZZ_GLUE_SHARE", "1")
    root = Path(importlib.util.find_spec("sglang").origin).parent
    cov = coverage.Coverage(include=sorted({str(root / rel) for rel, _, _ in SURFACE}), data_file=None)
    obs = {}
    cov.start()
    try:
        for config in (_config(), _config(SKIP_VIEW_CONTEXT, skip_view=True), _config(V4_CONTEXT, want="DeepSeek V4")):
            with one_build_per_case():
                for prop in ("graph-replay-equivalence", AGREEMENT) if config.max_context_len != V4_CONTEXT else (
                        "padding-inert",):
                    obs[prop, config.max_context_len] = PROPERTIES[prop].check(
                        sglang_target, config, [Batch(s) for s in SEQ_LENS])
    finally:
        cov.stop()
    data = cov.get_data()
    unrun = surface_never_ran(root, SURFACE, data)
    assert not unrun, f"driven functions whose lines never ran: {unrun}"
    runner, early = RUNNER[0], "srt/model_executor/runner/early_verify_metadata.py"
    assert_texts_ran(root, (
        (runner, "            self._metadata_glue = MetadataGlueGraph(self.device)"),
        (runner, "self.attn_backend.enable_early_verify_metadata()"),
        (runner, 'logger.info("Target verify metadata prep through the glue graph, one per key.")'),
        (runner, "self._metadata_glue.reinstall(glue_key)"),
        (runner, "            self._metadata_glue.replay(glue_key)"),
        (runner, "self._prefilled_inputs = (forward_batch.input_ids, forward_batch.positions)"),
        (runner, "self._early_verify_metadata.count_variant("),
        (runner, "return early.take(key=key, forward_batch=forward_batch)"),
        (early, "self.taken_ct += 1"),
        (early, "self.rejected_ct += 1"),
        (early, "torch.cuda.current_stream().wait_event(self._done)"),
    ), data)
    for where, before in ((runner, "        return variants.select_for_max_seq_len(max_seq_len)"),
                          (early, "        self.discard()\n        src = staged.sources")):
        # the line before ``before``: the early variant's ``return None``, the take's ``return False``
        text = (root / where).read_text()
        line = text[:text.index(before)].count("\n")
        assert line in set(data.lines(str(root / where)) or ()), f"{where}:{line} never ran"
    for (prop, context), o in obs.items():
        taken = "metadata glue graph: staged early (its glue graph replayed before the load, which took it)"
        assert (taken in o.classes) == (context != V4_CONTEXT), (prop, sorted(o.classes))


@pytest.mark.parametrize("name", ["graph-replay-equivalence", "padding-inert", "capture-replay-agreement"])
def test_the_graph_corpus_stages_a_dspark_targets_early_metadata_to_be_taken(monkeypatch, name):
    """A gate meets a taken early stage first: its search draws a DSpark server for one glued EAGLE case in
    four and almost never replays one bs's captured glue graph again on it (a gate on the runner at 7005ab4's
    successor ran ``stage_verify_metadata_early`` to its discard only, never ``EarlyVerifyMetadata.take``).
    Each property's server is wired as ``_DSPARK_WIRING`` says: a gate of the release diff 0.5.22 to 0.5.23
    left the glued replay with no view and a load with nothing staged unrun where all three were plain."""
    from vmfuzz.harness.engine.search.deep_corpus import deep_cases
    from vmfuzz.harness.model.bounds import Bounds
    from vmfuzz.harness.model.shapes import model_constants
    from vmfuzz.harness.properties import PROPERTIES
    from vmfuzz.harness.properties.graph_glue import session_options
    from vmfuzz.harness.targets.sglang.graph_session import captured_sizes
    monkeypatch.delenv("VMFUZZ_GLUE_SHARE", raising=False)  # the gate's own share
    cases = [(c, s) for label, c, s in deep_cases(PROPERTIES[name], Bounds(), model_constants())
             if label.startswith("DSpark target")]
    want = {"graph-replay-equivalence": ["skip view"], "padding-inert": ["DeepSeek V4"]}.get(
        name, [True, "request window"])
    assert [session_options(c).get("dspark") for c, _ in cases] == want
    config, batches = cases[0]
    first = batches[0].bs
    # the same captured bs, early variant, step after step: warm-ups, the glue's capture, then a stage taken
    assert first in captured_sizes(config.max_bs) and [b.bs for b in batches[:4]] == [first] * 4
    assert all(max(b.seq_lens) + config.num_draft_tokens <= config.max_context_len for b in batches)


def test_a_shared_graph_run_gets_a_dspark_case_of_each_wiring(monkeypatch):
    """A gate judges the three graph properties together on one run of each case (``shared_group``): its corpus
    holds a DSpark case of each member's wiring (a gate of the release diff 0.5.22 to 0.5.23 whose shared run
    had only the plain one left the no-view replay and the load that finds nothing staged unrun)."""
    from vmfuzz.harness.engine.search.deep_corpus import deep_cases
    from vmfuzz.harness.model.bounds import Bounds
    from vmfuzz.harness.model.shapes import model_constants
    from vmfuzz.harness.properties import shared_group
    from vmfuzz.harness.properties.graph_glue import session_options
    monkeypatch.delenv("VMFUZZ_GLUE_SHARE", raising=False)
    group = shared_group(["graph-replay-equivalence", "padding-inert", AGREEMENT])
    wirings = [session_options(c)["dspark"] for label, c, _ in deep_cases(group, Bounds(), model_constants())
               if label.startswith("DSpark target")]
    assert sorted(map(str, wirings)) == ["DeepSeek V4", "True", "request window", "skip view"]
