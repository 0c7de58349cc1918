"""SGLang's call sites: where a verify step decides reuse or fallback with ``fits``.

The call site, not this harness, decides: the harness builds the stand-ins a
call site reads (batch, worker, model runner, attention backend holding the
verify mask) and calls SGLang's own function. Which call site runs depends on
the config, as in a server: ``build_eagle_verify_input`` when drafting,
``EAGLEWorkerV2._build_trivial_verify_input`` when d = 1.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

from harness.config import Batch, Config
from harness.trees import tree_tensors

#: The SGLang code this module drives, for ``vmfuzz surface`` and the gate's
#: summary: (sglang-relative file, function, properties that run through it).
SURFACE = (
    ("srt/speculative/eagle_worker_common.py", "build_eagle_verify_input",
     ("no-oob-write", "fallback-equivalence", "reference-agreement", "multi-step-reuse")),
    ("srt/speculative/eagle_worker_v2.py", "EAGLEWorkerV2._build_trivial_verify_input", ("trivial-path",)),
)


def stand_ins(sg, mask, config: Config, batch: Batch, dev):
    """(batch, target worker, bonus tokens): only what SGLang's call sites read."""
    bs = batch.bs
    seq_lens = torch.tensor(batch.seq_lens, dtype=torch.long, device=dev)
    backend = SimpleNamespace(verify_mask=mask, max_context_len=config.max_context_len)
    model_runner = SimpleNamespace(attn_backend=backend,
                                   model_config=SimpleNamespace(context_len=config.max_context_len,
                                                                model_is_mrope=False))
    target_worker = SimpleNamespace(model_runner=model_runner)
    bonus = torch.arange(bs, dtype=torch.long, device=dev)
    forward_batch = SimpleNamespace(
        forward_mode=sg.forward_info.ForwardMode.DECODE,
        seq_lens=seq_lens,
        # The exact sum sizes the wrapper's FULL_MASK fallback tightly, so a
        # short fallback allocation overflows instead of hiding in slack.
        seq_lens_sum=int(sum(batch.seq_lens)),
        seq_lens_cpu=seq_lens.cpu(),
        spec_info=SimpleNamespace(bonus_tokens=bonus),
        multimodal_inputs=[None] * bs,
    )
    return forward_batch, target_worker, bonus


def build_verify_input(sg, mask, config: Config, batch: Batch, dev):
    """One verify step through the call site a server would take for ``config``."""
    forward_batch, target_worker, bonus = stand_ins(sg, mask, config, batch, dev)
    if config.trivial:
        return trivial(sg, forward_batch, target_worker, config, dev)
    sel, par = tree_tensors(config, batch, dev)
    draft = torch.zeros((batch.bs, config.d - 1), dtype=torch.long, device=dev)
    return sg.call_site.build_eagle_verify_input(
        forward_batch, SimpleNamespace(bonus_tokens=bonus), par, sel, draft, None,
        target_worker=target_worker, topk=config.topk, num_steps=config.spec_steps,
        num_draft_tokens=config.d, tree_mask_mode=sg.Mode(int(config.mode)), device=str(dev))


def trivial(sg, forward_batch, target_worker, config: Config, dev):
    """``EAGLEWorkerV2._build_trivial_verify_input``: d = 1, no drafting."""
    worker_cls = sg.worker_v2.EAGLEWorkerV2
    worker = worker_cls.__new__(worker_cls)  # only the attributes the trivial path reads
    for attr, value in (("_target_worker", target_worker), ("target_worker", target_worker),
                        ("topk", config.topk), ("device", str(dev))):
        with contextlib.suppress(AttributeError):
            setattr(worker, attr, value)
    return worker._build_trivial_verify_input(forward_batch)
