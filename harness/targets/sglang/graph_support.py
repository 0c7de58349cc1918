"""Whether the code under test has what the cuda-graph runners' and the KV-location step's drivers bind.

The drivers build SGLang's runners by their own set-up, with stand-ins for the
model and the device, and follow each release where it differs by what its
classes and signatures show (``graph_lookups.keep_bodies``,
``graph_lookups.attention_context``, ``glue_graph.GlueWatch``,
``kv_launches``); a piece one release lays out otherwise says so where it is
met (``OutOfStep``, ``verify_runner_init.NotDriven``, a sub-check's reason).
What no driver can stand without is checked here, on the installed SGLang's
own modules: the target verify runner's capture and replay, the graph backend
it captures through, and the forward context attention finds its backend in.
Code that lacks one is not driven on the graph path, and says which: a gate
whose changed lines needed these properties is could not check, never green.
"""

from __future__ import annotations

import importlib

#: the properties that drive the cuda-graph runners and the KV-location step
PROPERTIES = frozenset({"graph-replay-equivalence", "padding-inert", "capture-replay-agreement",
                        "graph-buffer-soundness", "kv-location-soundness"})

#: what every graph driver binds: (module, class or None for the module itself, the names it must hold)
NEEDS = (
    ("sglang.srt.model_executor.runner.decode_cuda_graph_runner", "DecodeCudaGraphRunner",
     ("capture", "can_run_graph", "load_batch", "execute")),
    ("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend", "FullCudaGraphBackend",
     ("capture_one", "replay")),
    ("sglang.srt.model_executor.forward_context", None,
     ("ForwardContext", "forward_context", "get_forward_context", "has_forward_context", "set_forward_context")),
)


def not_driven(needs=NEEDS) -> str | None:
    """Why the installed SGLang is not driven on the graph path (the first of ``needs`` it lacks); None:
    it has every one."""
    from vmfuzz.harness.targets.sglang.loader import _quiet_import
    for module_name, class_name, names in needs:
        try:
            with _quiet_import():
                module = importlib.import_module(module_name)
        except ImportError as exc:
            return f"this SGLang has no {module_name} ({exc}), which the graph drivers bind"
        owner = getattr(module, class_name, None) if class_name else module
        if owner is None:
            return f"this SGLang's {module_name} has no {class_name}, which the graph drivers build"
        missing = [n for n in names if not hasattr(owner, n)]
        if missing:
            return (f"this SGLang's {class_name or module_name} has no {', '.join(missing)}, which the graph "
                    "drivers bind")
    return None


def pieces_not_driven() -> dict[str, str]:
    """Pieces of a case's server the installed SGLang keeps vmfuzz from driving (a case that asks for one
    runs without it, and says so), each by the words a finding's writer names it with, and why. A replay
    there cannot say that a defect of such a piece holds (``known_on_base``)."""
    from vmfuzz.harness.targets.sglang import kv_locations, kv_plan_reads, kv_translation, swa_server
    out = {}
    if why := swa_server.missing():
        out["a sliding-window KV pool"] = why
    if not_driven():  # no graph path, no KV-location step driven here: its entries are NotDriven already
        return out
    # the KV-location step's pieces a release holds none of (their sub-checks absent there): a base
    # without them runs a case and holds, which says nothing of a defect of theirs
    sg = kv_locations.kv_modules()
    for piece, why in ((PLAN_PIECE, kv_plan_reads.absent(sg)), (FUSED_PIECE, kv_translation.absent(sg))):
        if why:
            out[piece] = why
    return out


#: the words kv-location-soundness's writers name the plan's reads and the fused window by
PLAN_PIECE, FUSED_PIECE = "the iteration's plan", "fused outputs"
