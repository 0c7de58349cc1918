"""Every size the harness accepts from outside, stated once.

A repro file, a deployment file, a changed-files list or a command-line number
is checked against these before anything is allocated or searched. The limits
sit well above any server SGLang ships for (context 1M tokens, max_bs 1024,
64 draft tokens, topk 10) where only arithmetic is needed, and at what one
process can hold in memory where a buffer is really allocated.

Past a limit the input is refused with exit 2, naming the limit and the field;
the capacity properties need no allocation and so take the arithmetic limits
only (vmfuzz.harness.model.validate).
"""

from __future__ import annotations

import os

# -- inputs read from disk -------------------------------------------------------
#: bytes of a repro file, a deployment file or a changed-files list
MAX_FILE_BYTES = 16 << 20
# JSON nesting needs no limit of its own: every file is decoded against a typed
# schema (msgspec), which refuses a value nested where the schema has none.

# -- one configuration (arithmetic: nothing is allocated at this size) ------------
#: max_bs, cuda_graph_max_bs, max_running_requests: a scheduler's int32 batch index
MAX_REQUESTS = (1 << 31) - 1
#: max_context_len, context_length and every seq_len: SGLang's int32 positions
MAX_CONTEXT_LEN = (1 << 31) - 1
#: num_draft_tokens (d): a tree of d nodes per request; SGLang's bit-packed rows hold 32
MAX_DRAFT_TOKENS = 1024
#: topk and spec_steps: the draft stage's width and depth
MAX_TOPK = 64
MAX_SPEC_STEPS = 64
#: candidates the draft stage scores, topk + (spec_steps-1)*topk^2 (trees are built over all of them)
MAX_CANDIDATES = 1 << 13
#: cells of the buffer at the captured max_bs, as arithmetic (int64 tensors index it)
MAX_ARITHMETIC_CELLS = 1 << 62

# -- one case as replayed (allocation: this much memory is really touched) --------
#: cells of any one buffer a property allocates: the reused buffer at max_bs, or
#: one step's per-batch fallback. 2^24 bool cells keep a replay under ~1 GB with
#: the oracle's copy, the shadow redzones and both paths' outputs.
MAX_BUFFER_CELLS = 1 << 24
#: cells over all steps of one case, for a property that allocates: bounds a
#: replay's time (about a second per 2^24 cells on one core) as the above bounds its memory
MAX_CASE_CELLS = 1 << 27
#: requests in one step of a repro file (bs = len(seq_lens))
MAX_REQUESTS_PER_STEP = 1 << 16
#: steps (batches) in one repro file
MAX_STEPS = 64
#: batch sizes a deployment-scoped search draws for properties that allocate;
#: larger ones are covered by the capacity verdict's arithmetic
MAX_SEARCH_REQUESTS = 64

# -- command-line numbers ----------------------------------------------------------
MAX_WORKERS = min(64, 4 * (os.cpu_count() or 1))
MAX_EXAMPLES = 1_000_000
MAX_TIME_BUDGET = 7 * 24 * 3600.0
#: one isolated example: below a second, process start-up alone reads as a hang
MIN_EXAMPLE_TIMEOUT, MAX_EXAMPLE_TIMEOUT = 1.0, 24 * 3600.0
MAX_SEED = (1 << 63) - 1

#: properties that check by arithmetic alone (allocate on the meta device):
#: they replay at any size within the arithmetic limits
ARITHMETIC_PROPERTIES = frozenset({"capacity-soundness", "capacity-liveness"})


def allocates(prop: str) -> bool:
    """Does ``prop`` allocate real buffers? Unknown properties are assumed to."""
    return prop not in ARITHMETIC_PROPERTIES


def table() -> list[tuple[str, object, str]]:
    """(name, value, what) for README and ``--help``-style listings."""
    return [
        ("MAX_FILE_BYTES", MAX_FILE_BYTES, "bytes of an input file"),
        ("MAX_REQUESTS", MAX_REQUESTS, "max_bs / cuda_graph_max_bs / max_running_requests"),
        ("MAX_CONTEXT_LEN", MAX_CONTEXT_LEN, "max_context_len / context_length / seq_len"),
        ("MAX_DRAFT_TOKENS", MAX_DRAFT_TOKENS, "num_draft_tokens"),
        ("MAX_TOPK", MAX_TOPK, "topk"),
        ("MAX_SPEC_STEPS", MAX_SPEC_STEPS, "spec_steps"),
        ("MAX_CANDIDATES", MAX_CANDIDATES, "topk + (spec_steps-1)*topk^2"),
        ("MAX_ARITHMETIC_CELLS", MAX_ARITHMETIC_CELLS, "buffer cells at max_bs (arithmetic)"),
        ("MAX_BUFFER_CELLS", MAX_BUFFER_CELLS, "cells of one allocated buffer"),
        ("MAX_CASE_CELLS", MAX_CASE_CELLS, "cells over all steps of one allocating case"),
        ("MAX_REQUESTS_PER_STEP", MAX_REQUESTS_PER_STEP, "requests in one repro step"),
        ("MAX_STEPS", MAX_STEPS, "steps in one repro"),
        ("MAX_SEARCH_REQUESTS", MAX_SEARCH_REQUESTS, "batch size a deployment search allocates for"),
        ("MAX_WORKERS", MAX_WORKERS, "--workers"),
        ("MAX_EXAMPLES", MAX_EXAMPLES, "--max-examples"),
        ("MAX_TIME_BUDGET", MAX_TIME_BUDGET, "--time-budget seconds"),
        ("MIN/MAX_EXAMPLE_TIMEOUT", (MIN_EXAMPLE_TIMEOUT, MAX_EXAMPLE_TIMEOUT), "--example-timeout seconds"),
    ]
