"""The third call site (the pp rebuild) and the second writer (``build_chain_tree``) of real SGLang.

In-process tests check that the case's ``call_site`` picks SGLang's function,
that the decision and the branch taken are SGLang's, and that every module
attribute bound for a call is put back. The altered-copy tests edit the
installed package the way a bad PR would and run the properties on the copy in
a subprocess: each edit must be caught, the pristine copy must pass.
"""

from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis.errors import InvalidArgument

from vmfuzz.harness.engine.search.cases import boundary_cases
from vmfuzz.harness.model.bounds import Bounds
from vmfuzz.harness.model.config import CALL_SITES, Batch, Config, ConfigError
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.properties import PROPERTIES
from vmfuzz.harness.model.repro_file import ReproError, dump, from_case, load, to_case
from vmfuzz.harness.guard.shadow import ShadowHeap
from vmfuzz.harness.targets import CATALOGUE, resolve
from vmfuzz.strategies import chain_configs, configs, trivial_configs
from tests.sglang_copies import altered_copy, assert_caught_by, run_cases, run_on_copy


CHAIN = Config(TreeMaskMode.QLEN_ONLY, 2, 6, 3, 1, 2, True, "chain")
PP_FULL = Config(TreeMaskMode.FULL_MASK, 2, 6, 4, 2, 2, True, "pp")



def _bound_attrs(sg):
    """Every SGLang attribute a pp or chain call binds, as found."""
    pp = sg.pp()
    return (pp.module.__dict__.get("get_spec"), sg.eagle_utils.__dict__.get("default_tree_mask_mode"),
            sg.eagle_utils.__dict__.get("build_tree_kernel_efficient"),
            sg.call_site.__dict__.get("build_tree_kernel_efficient"),
            sg.chain_module.__dict__.get("_build_chain_tree_kernel"), sg.VerifyMask.__dict__.get("fits"))


def _spy(target, seam):
    calls = []
    original = getattr(target, seam)

    def spy(call):
        calls.append(call)
        return original(call)
    setattr(target, seam, spy)
    return calls


# -- the case picks the call site -------------------------------------------------

def test_call_site_field_round_trips_and_old_repros_load(tmp_path):
    path = dump(from_case("sglang", "no-oob-write", PP_FULL, [Batch((1, 6, 0))]), tmp_path / "pp.json")
    assert json.loads(path.read_text())["config"]["call_site"] == "pp"
    assert to_case(load(path))[0] == PP_FULL
    eagle = msgspec.structs.replace(PP_FULL, call_site="eagle")
    path = dump(from_case("sglang", "no-oob-write", eagle, [Batch((1,))]), tmp_path / "eagle.json")
    assert "call_site" not in json.loads(path.read_text())["config"]  # the file reads as it always did
    assert to_case(load(path))[0].call_site == "eagle"


@pytest.mark.parametrize("config, why", [
    (msgspec.structs.replace(PP_FULL, call_site="chain"), "build_chain_tree branch"),
    (msgspec.structs.replace(CHAIN, call_site="scheduler"), "not one of"),
])
def test_call_site_is_validated(config, why):
    with pytest.raises(ConfigError, match=why):
        config.validate()


def test_chain_site_refuses_a_tree_the_chain_branch_would_misread(tmp_path):
    data = msgspec.to_builtins(from_case("sglang", "reference-agreement", CHAIN, [Batch((1,))]))
    data["batches"][0].update(top_scores_index=[[0, 1]], parent_list=[[-1, -1]])
    (tmp_path / "r.json").write_text(json.dumps(data))
    with pytest.raises(ReproError, match="chain topology"):
        to_case(load(tmp_path / "r.json"))


@pytest.mark.parametrize("call, words", [
    (lambda: configs(call_sites=["scheduler"]), "pick from"),
    (lambda: configs(call_sites="pp"), "sequence of names"),
    (lambda: trivial_configs(call_sites=["chain"]), "one-node tree"),
    (lambda: chain_configs(spec_steps=0), "spec_steps"),
])
def test_call_site_strategies_reject_bad_arguments(call, words):
    with pytest.raises(InvalidArgument, match=words):
        call()


@settings(max_examples=200)
@given(configs(max_bs=(1, 4), topk=(1, 2), spec_steps=(1, 3), num_draft_tokens=(2, 4)))
def test_drawn_call_sites_are_valid(config):
    config.validate()
    assert config.call_site in CALL_SITES
    assert config.call_site != "chain" or config.chain
    assert config.call_site != "frozen_kv_mtp" or config.mode == TreeMaskMode.FULL_MASK


@given(chain_configs(max_bs=(1, 4), spec_steps=(1, 3)))
def test_chain_configs_have_the_chain_writers_shape(config):
    assert config.validate().chain


def test_boundary_corpus_meets_every_call_site():
    core = PROPERTIES["no-oob-write"]
    sites = {(c.mode, c.call_site) for c, _ in boundary_cases(core, Bounds())}
    assert sites == {(TreeMaskMode.FULL_MASK, "eagle"), (TreeMaskMode.FULL_MASK, "pp"),
                     (TreeMaskMode.QLEN_ONLY, "eagle"), (TreeMaskMode.QLEN_ONLY, "pp"),
                     (TreeMaskMode.QLEN_ONLY, "chain"), (TreeMaskMode.FULL_MASK, "frozen_kv_mtp")}
    assert all(c.chain for c, _ in boundary_cases(PROPERTIES["chain-writer"], Bounds()))


# -- the installed SGLang ---------------------------------------------------------

def test_a_call_site_sglang_lacks_is_never_drawn(sglang_target):
    from types import SimpleNamespace

    from vmfuzz.harness.engine.search.cases import cases
    from vmfuzz.harness.targets.sglang.call_sites import available
    assert sglang_target.call_sites == ("eagle", "chain", "pp", "frozen_kv_mtp")
    no_chain = SimpleNamespace(build_chain_tree=None, call_site=SimpleNamespace())
    assert available(no_chain) == ("eagle", "pp", "frozen_kv_mtp")
    bounds = dataclasses.replace(sglang_target.bounds, call_sites=("eagle",))
    drawn = set()

    @settings(max_examples=40)
    @given(cases(PROPERTIES["no-oob-write"], bounds))
    def only_eagle(case):
        drawn.add(case[0].call_site)
    only_eagle()
    assert drawn == {"eagle"}
    assert {c.call_site for c, _ in boundary_cases(PROPERTIES["no-oob-write"], bounds)} == {"eagle"}


def test_pp_rebuild_is_sglangs_and_decides_reuse(sglang_target):
    sg = sglang_target.sglang
    for seq_lens, want in (((1, 6), True), ((1, 6, 3), False)):
        heap = ShadowHeap("cpu")
        mask = sglang_target.allocate(PP_FULL, heap)
        out = sglang_target.verify(mask, PP_FULL, Batch(seq_lens), heap)
        assert out.reused is want
    # What ran was the scheduler's rebuild: it leaves its verify input on the batch.
    from vmfuzz.harness.targets.sglang.call_sites import pp_rebuild, stand_ins
    forward_batch, worker, chain = stand_ins(sg, None, PP_FULL, Batch((2,)), "cpu")
    with sglang_target._routed(ShadowHeap("cpu"), None):
        vi = pp_rebuild(sg, forward_batch, worker, chain, PP_FULL, Batch((2,)), "cpu")
    assert type(vi).__name__ == "EagleVerifyInput" and forward_batch.spec_info is vi


def test_chain_site_takes_build_chain_tree_on_cpu(sglang_target):
    target = resolve("sglang")
    chain_calls, tree_calls = _spy(target, "chain_kernel"), _spy(target, "kernel")
    heap = ShadowHeap("cpu")
    mask = target.allocate(CHAIN, heap)
    assert target.verify(mask, CHAIN, Batch((0, 6)), heap).reused
    assert len(chain_calls) == 1 and not tree_calls
    # The same chain through the default call site on CPU is the tree kernel's.
    target.verify(mask, msgspec.structs.replace(CHAIN, call_site="eagle"), Batch((0, 6)), heap)
    assert len(chain_calls) == 1 and len(tree_calls) == 1
    assert not heap.check()


def test_modules_are_left_as_found(sglang_target):
    before = _bound_attrs(sglang_target.sglang)
    PROPERTIES["no-oob-write"].check(sglang_target, PP_FULL, [Batch((3, 5, 6))])
    PROPERTIES["chain-writer"].check(sglang_target, CHAIN, [Batch((3, 5, 6))])
    broken = resolve("sglang")

    def dies(call):
        raise RuntimeError("chain kernel died")
    broken.chain_kernel = dies
    with pytest.raises(RuntimeError, match="chain kernel died"):
        PROPERTIES["no-oob-write"].check(broken, CHAIN, [Batch((3,))])
    with pytest.raises(RuntimeError, match="chain kernel died"):
        PROPERTIES["chain-writer"].check(broken, CHAIN, [Batch((3,))])
    assert _bound_attrs(sglang_target.sglang) == before


@pytest.mark.parametrize("variant", ["pp-reuse-unchecked", "chain-row-offset"])
def test_new_variants_are_caught_over_sglang(sglang_target, variant, tmp_path):
    from vmfuzz.harness.engine.search.search import run_property
    target = CATALOGUE[variant].layer(sglang_target)
    for name in ("no-oob-write", "chain-writer", "reference-agreement"):
        res = run_property(target, PROPERTIES[name], seed=3, max_examples=6, bounds=sglang_target.bounds,
                           findings_dir=tmp_path)
        if res.finding:
            return
    pytest.fail(f"no property caught sglang+{variant}")


# -- altered copies of the installed SGLang ---------------------------------------

PP_MIXIN = ["srt/managers/scheduler_pp_mixin.py"]
CHAIN_WRITER = ["kernels/ops/speculative/eagle.py"]

#: name -> edits (file candidates, pattern, replacement): bugs a reviewer could miss.
ALTERATIONS = {
    "pp-fits-admits-one-more": [(PP_MIXIN, r"verify_mask\.fits\(bs\)", "verify_mask.fits(bs - 1)")],
    "pp-buffer-unconditional": [(PP_MIXIN, r"tree_mask_buf = verify_mask\.buffer if verify_mask\.fits\(bs\) else None",
                                 "tree_mask_buf = verify_mask.buffer")],
    "chain-row-stride-off-by-one": [(CHAIN_WRITER, r"tl\.store\(mask \+ offset, mask_col <= mask_row",
                                     "tl.store(mask + offset + mask_row, mask_col <= mask_row")],
    "chain-positions-off-by-one": [(CHAIN_WRITER, r"tl\.store\(positions \+ offset, length \+ col, valid\)",
                                    "tl.store(positions + offset, length + col + 1, valid)")],
}

#: The properties meant to catch each bug (a raise never counts).
CAUGHT_BY = {
    "pp-fits-admits-one-more": ("no-oob-write", "reference-agreement"),
    "pp-buffer-unconditional": ("no-oob-write", "reference-agreement"),
    "chain-row-stride-off-by-one": ("chain-writer", "no-oob-write", "reference-agreement"),
    "chain-positions-off-by-one": ("chain-writer", "reference-agreement"),
}

#: The properties a copy runs: the guard, the oracle through every call site, and the direct writer.
PROPS = ("--property", "no-oob-write", "--property", "reference-agreement", "--property", "chain-writer")

@pytest.mark.parametrize("alteration", run_cases(ALTERATIONS), ids=lambda a: a or "unaltered")
@pytest.mark.slow
def test_altered_copy_is_caught_by_run(sglang_target, alteration, tmp_path):
    site = altered_copy(tmp_path, ALTERATIONS[alteration] if alteration else [], alteration)
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "8", *PROPS,
                            "--report-dir", str(tmp_path / "report"))
    if alteration is None:
        assert proc.returncode == 0, out
    else:
        assert proc.returncode == 1, out
        assert "FAILED" in proc.stdout
        assert_caught_by(tmp_path / "report", *CAUGHT_BY[alteration], out=out)
        findings = list((tmp_path / "report" / "findings").glob("*.json"))
        assert findings, out
        site_of = {json.loads(f.read_text())["config"].get("call_site", "eagle") for f in findings}
        # The finding names the call site it came through, so it replays there.
        assert site_of & ({"pp"} if alteration.startswith("pp-") else {"chain", "eagle", "pp"}), site_of


#: The properties the bug may show through: the gate is narrowed to them (tests/test_gate_catches_parts.py's
#: pp call site is the whole gate's).
GATE_CAUGHT_BY = {
    "pp-buffer-unconditional": ("no-oob-write", "fallback-equivalence", "reference-agreement", "multi-step-reuse"),
    "chain-row-stride-off-by-one": ("chain-writer", "no-oob-write", "fallback-equivalence", "reference-agreement",
                                    "multi-step-reuse"),
}


@pytest.mark.parametrize("alteration", ["pp-buffer-unconditional", "chain-row-stride-off-by-one"])
@pytest.mark.slow
def test_altered_copy_is_caught_by_the_gate(sglang_target, alteration, tmp_path):
    site = altered_copy(tmp_path, ALTERATIONS[alteration], alteration)
    changed = tmp_path / "changed.txt"
    changed.write_text("python/sglang/" + ALTERATIONS[alteration][0][0][0] + "\n")
    narrowed = [arg for name in GATE_CAUGHT_BY[alteration] for arg in ("--property", name)]
    proc, out = run_on_copy(site, tmp_path, "gate", "--target", "sglang", "--changed-files", str(changed),
                            "--report-dir", str(tmp_path / "report"), *narrowed)
    assert proc.returncode == 1, out
    assert_caught_by(tmp_path / "report", *GATE_CAUGHT_BY[alteration], out=out)
