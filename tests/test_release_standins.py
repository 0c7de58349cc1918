"""The stand-ins give what every release asks of them, whichever place the release reads it from.

Two reads broke older releases on pristine code (``docs/releases.md``):

- 0.5.17's FlashAttention ``__init__`` asks the runner's ``server_args`` whether
  prefill context parallelism or DP attention is on, where later releases ask
  ``get_parallel()``: the stand-in server answered only the latter (exit 3).
- 0.5.19's sliding-window gather calls its KV-id view's
  ``sliding_window_read_ids()`` and hands the result's row stride to the KV
  gather: the stand-in view answered None for it, and the call raised a
  TypeError that was judged SGLang's (exit 1).

These tests need no SGLang: each builds the release's calling pattern with
classes of its own.
"""

from __future__ import annotations

import types

import torch

from vmfuzz.harness.model.allocation import ServerNumbers
from vmfuzz.harness.targets.sglang import backend_init
from vmfuzz.harness.targets.sglang.seams import TranslatesNothing

NUMBERS = ServerNumbers(max_bs=4, context_len=64, num_draft_tokens=5, topk=2, spec_steps=3)


def test_the_stand_in_server_args_and_get_parallel_agree_on_a_single_gpu_server():
    args = backend_init.server_args(NUMBERS)
    parallel = backend_init._context(args)["get_parallel"]()
    options = {k: v for k, v in vars(parallel).items() if k.startswith("enable_")}
    assert {"enable_prefill_cp", "enable_dp_attention"} <= set(options)
    for name, value in options.items():
        assert getattr(args, name, "absent") == value, name


class _ReadsParallelismOffServerArgs:
    """A backend whose ``__init__`` asks the runner's server arguments, through a helper of its module,
    whether prefill CP or DP attention is on (0.5.17's FlashAttention does so)."""

    def __init__(self, model_runner):
        self.precompute_metadata = not _needs_per_rank_metadata(model_runner.server_args)


def _needs_per_rank_metadata(server_args) -> bool:
    return bool(server_args.enable_prefill_cp or server_args.enable_dp_attention)


def test_a_backend_that_reads_parallelism_off_server_args_is_built_not_out_of_step():
    mod = types.ModuleType("sglang.srt.layers.attention.reads_parallelism")
    built = backend_init.built_by_init(mod, _ReadsParallelismOffServerArgs, NUMBERS)
    assert built.precompute_metadata is True


def _window_gather(view, seq_lens: torch.Tensor, window: int, launch) -> torch.Tensor:
    """0.5.19's calling pattern: the window's source ids come from a method of the batch's KV-id view,
    and their row stride goes to the gather with the view's other fields; a flag says whether to map
    the gathered ids afterwards. Returns the windows' lengths."""
    lens = torch.minimum(seq_lens, torch.tensor(window))
    source = view.sliding_window_read_ids()
    launch(source, view.row_ids, lens, source.stride(0), view.entry_page_size)
    if not view.is_translated:
        pass  # a release maps full-pool ids to the window pool's here (not with the stand-in pool)
    return lens


def test_the_kv_id_view_gives_a_window_gather_a_table_to_read_and_says_it_is_untranslated():
    launches = []
    view = TranslatesNothing().index_table_for_batch(types.SimpleNamespace())
    lens = _window_gather(view, torch.tensor([3, 7]), 4, lambda *a: launches.append(a))
    assert lens.tolist() == [3, 4] and len(launches) == 1
    assert isinstance(launches[0][0], torch.Tensor) and launches[0][0].numel() == 0
    assert not view.is_translated and not view.ids
