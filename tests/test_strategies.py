import pytest
from hypothesis import given, settings
from hypothesis.errors import InvalidArgument

from vmfuzz.harness.model.config import Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.strategies import batch_sizes, batches, configs, draft_trees, seq_lens, step_sequences, trivial_configs


@pytest.mark.parametrize("call, words", [
    (lambda: configs(max_bs=0), "max_bs"),
    (lambda: configs(max_bs=(4, 2)), "below the lower bound"),
    (lambda: configs(num_draft_tokens=1), "num_draft_tokens"),
    (lambda: configs(layouts=["QLEN_ONLY_BITPACKING"]), "never preallocated"),
    (lambda: configs(layouts=["NOPE"]), "unknown layout"),
    (lambda: configs(read=False, layouts=["FULL_MASK"]), "unread"),
    (lambda: configs(num_draft_tokens=(20, 30), topk=1, spec_steps=2), "candidates"),
    (lambda: configs(max_bs=True), "bool"),
    (lambda: draft_trees(1, 1, 5), "candidates"),
    (lambda: batch_sizes(0), "max_bs"),
    (lambda: batches("not a config"), "Config"),
    (lambda: seq_lens(Config(TreeMaskMode.QLEN_ONLY, 1, 4, 2, 1, 1), 0), "bs"),
    (lambda: step_sequences(Config(TreeMaskMode.QLEN_ONLY, 1, 4, 2, 1, 1), min_steps=3, max_steps=2), "max_steps"),
])
def test_public_strategies_reject_bad_arguments_clearly(call, words):
    with pytest.raises(InvalidArgument, match=words):
        call()


@given(configs())
def test_generated_configs_are_consistent(config):
    config.validate()
    assert config.is_read or config.mode == TreeMaskMode.QLEN_ONLY


@given(trivial_configs())
def test_trivial_configs_take_the_no_draft_path(config):
    assert config.validate().trivial


@settings(max_examples=60)
@given(configs(max_bs=(1, 4), max_context_len=(1, 16)).flatmap(lambda c: batches(c).map(lambda b: (c, b))))
def test_generated_batches_and_trees_are_valid(case):
    config, batch = case
    batch.validate(config)
