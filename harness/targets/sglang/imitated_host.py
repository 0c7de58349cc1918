"""SGLang's allocator asked for a mask on the server vmfuzz imitates.

A read FULL_MASK config models a GPU server and a read QLEN_ONLY one a CPU
server: the device's default-layout function answers as SGLang's own function
does on that host (``host_default``; the config's layout only where it cannot
be run so) while the allocator runs, and whatever layout the allocator then
picks is judged, never replaced.

An allocator that never calls that function at run time may still follow the
host: it read the answer once, at its module's import, on *this* machine. So
its module is imported a second time, privately, while the imitated host
answers (imitation before import), and that copy is asked again. Only a copy
that still ignores the host is the allocator's own choice: a finding.
"""

from __future__ import annotations

import importlib.util
import sys

from vmfuzz.harness.model.allocation import AllocatorChose
from vmfuzz.harness.model.config import Config
from vmfuzz.harness.model.errors import OutOfStep
from vmfuzz.harness.targets.sglang import call_sites, host_default
from vmfuzz.harness.targets.sglang.binding import bound
from vmfuzz.harness.targets.sglang.seams import ALLOCATOR_SYNONYMS, call_by_quantity, call_with, where
from vmfuzz.harness.targets.sglang.structs import fields_of

VERIFY_MASK = "srt/layers/attention/verify_mask.py"


def allocate(sg, config: Config, numel_router):
    """SGLang's ``VerifyMask`` for ``config`` on its imitated host (on the meta device: sized, not filled)."""
    mode = sg.Mode(int(config.mode))
    asked = []  # whether the allocator consulted the imitated host at all
    # SGLang's own default-layout function answers, run as on the imitated host (host_default)
    own = host_default.answering(call_sites.default_layout_function(sg, sg.maybe_create),
                                 host_default.host_of(mode.name), mode)

    def asked_host():
        asked.append(True)
        return own()

    holders = call_sites.default_layout_holders(sg, sg.maybe_create)
    vm = _ask(sg.maybe_create, sg.verify_mask, config, numel_router,
              [(owner, name, asked_host) for owner, name in holders])
    if vm is not None and vm.mode != mode and config.is_read and not asked:
        again = _imported_on_host(sg.maybe_create, mode, holders, own)
        copy = _ask(getattr(again, sg.maybe_create.__name__), again, config, numel_router, [])
        # The copy is SGLang's own allocator on the imitated host; the mask it made goes on as
        # the struct the rest of SGLang knows (its class in the copy is another object).
        vm = copy if copy is None or copy.mode != mode else _as_real(sg, copy)
    if vm is None or vm.mode != mode:
        raise AllocatorChose(None if vm is None else sg.Mode(vm.mode).name, mode.name,
                             f"maybe_create_verify_mask(max_bs={config.max_bs}, "
                             f"max_context_len={config.max_context_len}, num_draft_tokens={config.d}, "
                             f"is_read={config.is_read})")
    return vm


def _ask(allocator, module, config: Config, numel_router, host):
    # By the allocator's own parameter names (a renamed keyword binds through its synonyms).
    quantities = dict(is_draft_runner=False, skip_prefill=False, max_bs=config.max_bs,
                      max_context_len=config.max_context_len, d=config.d, device="meta", is_read=config.is_read)
    with bound((module, "tree_mask_numel", numel_router), *host):
        return call_by_quantity(allocator, "maybe_create_verify_mask", VERIFY_MASK, quantities, ALLOCATOR_SYNONYMS)


#: (allocator's file, layout) -> its module imported while the host answered that layout
_COPIES: dict[tuple[str, int], object] = {}


def _imported_on_host(allocator, mode, holders, answer):
    module = sys.modules.get(getattr(allocator, "__module__", ""))
    file = getattr(module, "__file__", None)
    if not file:
        raise OutOfStep(call_sites.DEFAULT_LAYOUT, where(allocator), f"{allocator.__qualname__} chose a read "
                        "mask's layout without asking the host, and its module has no file to import again "
                        "on the imitated host")
    copy = _COPIES.get((file, int(mode)))
    if copy is not None:
        return copy
    name = f"{module.__name__}__vmfuzz_on_{mode.name.lower()}_host"
    spec = importlib.util.spec_from_file_location(name, file)
    copy = importlib.util.module_from_spec(spec)
    sys.modules[name] = copy  # a dataclass or an annotation resolves its module by name
    try:
        with bound(*[(owner, attr, answer) for owner, attr in holders]):
            spec.loader.exec_module(copy)
        if not callable(getattr(copy, allocator.__name__, None)):
            raise AttributeError(f"it defines no {allocator.__name__}")
    except Exception as exc:  # noqa: BLE001 -- whatever SGLang's module raises on a second import
        sys.modules.pop(name, None)
        raise OutOfStep(call_sites.DEFAULT_LAYOUT, where(allocator), f"{allocator.__qualname__} chose a read "
                        f"mask's layout without asking the host, and its module could not be imported again on "
                        f"the imitated host: {type(exc).__name__}: {exc}") from None
    _COPIES[(file, int(mode))] = copy
    return copy


def _as_real(sg, vm):
    fields = fields_of(type(vm), "VerifyMask", VERIFY_MASK)
    return call_with(sg.VerifyMask, "VerifyMask", VERIFY_MASK, **{f: getattr(vm, f) for f in fields})
