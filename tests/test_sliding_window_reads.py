"""reader-agreement on a sliding-window server: the Triton backend's window metadata, eager and replayed.

A model whose layers read a sliding window of W tokens reads, beside the full
metadata, each request's last min(s_b, W) prefix tokens: their KV slots
(``window_kv_indptr``, ``window_kv_indices``) and the mask column the first of
them sits in (``window_kv_offsets``). A wrong offset makes the windowed layers
read another token's mask cells while every full layer reads right, so it is
judged on its own. What each must hold comes from seq_lens and W alone
(``readers.expected_window``); W is the batch's median prefix less one, so some
windows start inside their prefix and others hold all of it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.readers import expected_reads, expected_window, sliding_window
from vmfuzz.harness.properties import PROPERTIES, PropertyFailure
from vmfuzz.harness.targets import resolve
from tests.sglang_copies import altered_copy, assert_caught_by, run_on_copy

CONFIG = Config(TreeMaskMode.FULL_MASK, 4, 8, 4, 2, 2)


def test_the_window_each_request_must_read_comes_from_seq_lens_and_w():
    """Worked by hand for seq_lens (3, 0, 5), W 2, replayed in a graph of 4 (one padding row at fill 1)."""
    want = expected_window(expected_reads(CONFIG, Batch((3, 0, 5)), rows=4), 2, CONFIG.max_context_len)
    assert want.window_kv_indptr == [0, 2, 2, 4, 5]
    assert want.window_kv_offsets == [1, 0, 3, 0]
    # pool slots last first (request 0 in slot 3): request 0's tokens 1 and 2, request 2's tokens 3 and 4
    assert want.window_kv_indices == [41, 42, 23, 24]
    assert sliding_window(Batch((3, 0, 5))) == 2 and sliding_window(Batch((1,))) == 1


def _windowed(target, path, alter):
    """``target`` whose sliding-window ``path`` reader hands back its view's window altered by ``alter``."""
    read = getattr(target, path)

    def altered(*args):
        view = read(*args)
        alter(view)
        return view

    setattr(target, path, altered)
    return target


def _offsets_from_zero(view):
    view.window.kv_offsets.zero_()  # the windowed layers read from each row's first prefix column


def _one_more_token(view):
    ptr = view.window.kv_indptr
    ptr.copy_(ptr + torch.arange(ptr.numel()))


def _request_0_twice(view):
    ids, n = view.window.kv_indices, int(view.window.kv_indptr[1])
    ids[n:2 * n] = ids[:n]  # request 1's first entries are request 0's slots


def _no_window_made(view):
    # a backend that ignored the runner's window: its metadata has none
    view.window = dataclasses.replace(view.window, kv_indptr=None, kv_indices=None, kv_offsets=None)


#: slip -> (reader, alteration, buffer the finding must name)
WINDOW_SLIPS = {
    "offsets from column 0": ("read_window_eager", _offsets_from_zero, "window_kv_offsets"),
    "one token more a request": ("read_window_replay", _one_more_token, "window_kv_indptr"),
    "request 0's slots for request 1's": ("read_window_eager", _request_0_twice, "window_kv_indices"),
    "no window metadata at all": ("read_window_replay", _no_window_made, "window_kv_indptr"),
}


@pytest.mark.parametrize("slip", sorted(WINDOW_SLIPS))
def test_each_window_output_is_judged_against_the_meaning(slip):
    path, alter, buffer = WINDOW_SLIPS[slip]
    target = _windowed(resolve("reference"), path, alter)
    with pytest.raises(PropertyFailure) as caught:
        PROPERTIES["reader-agreement"].check(target, CONFIG, [Batch((3, 5, 6))])
    origin = caught.value.origin
    assert (origin.effect, origin.writer, origin.buffer, origin.stage) == (
        "wrong", "triton reader", buffer, "eager" if path == "read_window_eager" else "replay"), caught.value


def test_the_reference_holds_with_windows_inside_the_prefix():
    obs = PROPERTIES["reader-agreement"].check(resolve("reference"), CONFIG, [Batch((3, 5, 6))])
    assert {"sliding-window read eager, its windows' KV ids, some windows inside the prefix",
            "sliding-window read replay, its windows' KV ids, some windows inside the prefix"} <= obs.classes


# -- altered copies of the installed SGLang ------------------------------------------

TRITON = "srt/layers/attention/triton_backend.py"
_UPDATE = r"(def update_sliding_window_buffer\((?:.|\n)*?)"

#: name -> (edits, the window buffer reader-agreement's finding must name; None: a refactor that must hold)
ALTERATIONS = {
    # The replay unpacks the window's lengths where its start offsets go.
    "replay-window-offsets-are-lengths": (
        [([TRITON], r"window_kv_indptr, window_kv_indices, _, window_kv_offsets\[:bs\] = \(",
          "window_kv_indptr, window_kv_indices, window_kv_offsets[:bs], _ = (")], "window_kv_offsets"),
    # The window is clipped one token wide: min(s, W + 1).
    "window-one-token-wide": (
        [([TRITON], _UPDATE + r"torch\.tensor\(sliding_window_size\),", r"\1torch.tensor(sliding_window_size + 1),")],
        "window_kv_indptr"),
    # The window's gather starts at each request's first token, not at its window's.
    "window-gather-from-token-0": (
        [([TRITON], _UPDATE + r"kv_start_idx=window_kv_start_idx,", r"\1kv_start_idx=torch.zeros_like(seq_lens),")],
        "window_kv_indices"),
    # A refactor: the start as max(s - W, 0), which is s - min(s, W).
    "refactor-window-start-clamped": (
        [([TRITON], r"window_kv_start_idx = seq_lens - window_kv_lens",
          "window_kv_start_idx = torch.clamp(seq_lens - sliding_window_size, min=0)")], None),
}


@pytest.mark.parametrize("alteration", [None, *ALTERATIONS], ids=lambda a: a or "unaltered")
@pytest.mark.slow
def test_altered_sliding_window_read_is_caught(sglang_target, alteration, tmp_path):
    edits, buffer = ALTERATIONS[alteration] if alteration else ([], None)
    site = altered_copy(tmp_path, edits, alteration)
    proc, out = run_on_copy(site, tmp_path, "run", "--target", "sglang", "--seed", "1", "--max-examples", "15",
                            "--property", "reader-agreement", "--report-dir", str(tmp_path / "report"))
    if buffer is None:
        assert proc.returncode == 0, out
        assert "sliding-window read replay, its windows' KV ids" in (tmp_path / "report" / "summary.json").read_text()
        return
    assert proc.returncode == 1, out
    assert "target raised" not in out, out
    assert_caught_by(tmp_path / "report", "reader-agreement", out=out)
    findings = json.loads((tmp_path / "report" / "summary.json").read_text())["findings"]
    assert {f["origin"]["buffer"] for f in findings} == {buffer}, out
