"""The search confined to one server deployment, and what the deployment's numbers say by arithmetic."""

from __future__ import annotations

from hypothesis import strategies as st

from vmfuzz.harness.model.allocation import AllocatorChose
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.deployment_file import Deployment, DeploymentPlan


def search_requests(dep: Deployment, config: Config, allocates: bool) -> int:
    """The largest batch a deployment-scoped search draws.

    A property that allocates gets batches up to MAX_SEARCH_REQUESTS whose
    fallback buffer stays under MAX_BUFFER_CELLS; larger batches of the same
    server are the capacity verdict's, by arithmetic. An arithmetic property
    takes any size the server schedules.
    """
    from vmfuzz.harness.model import limits
    from vmfuzz.harness.model.layouts import worst_case_size
    r = dep.max_running_requests
    if not allocates:
        return r
    cap = min(r, limits.MAX_SEARCH_REQUESTS)
    while cap > 1 and worst_case_size(config.mode, cap, config.d, config.max_context_len) > limits.MAX_BUFFER_CELLS:
        cap //= 2
    return cap


def case_strategy(dep: DeploymentPlan, *, trivial: bool, steps: bool, allocates: bool = True):
    """Cases this one server can produce: its config, batches of 1..max_running_requests."""
    from vmfuzz.strategies import batches

    config = dep.trivial_config if trivial else dep.config
    m = config.max_bs
    r = search_requests(dep.file, config, allocates)
    # The boundary sizes first, so even a short search reaches an eager batch.
    edges = sorted({x for x in (1, m, m + 1, r) if 1 <= x <= r})
    sizes = st.one_of(st.sampled_from(edges), st.integers(1, r))
    if allocates:
        one = sizes.flatmap(lambda n: batches(config, bs=n))
    else:
        # Only bs and max_context_len enter the arithmetic: a batch of any size
        # is built whole instead of drawn request by request.
        c = config.max_context_len
        one = st.tuples(sizes, st.sampled_from(sorted({0, c}))).map(lambda t: Batch((t[1],) * t[0]))
    seqs = st.lists(one, min_size=2, max_size=4) if steps else one.map(lambda b: [b])
    return seqs.map(lambda bs: (config, bs))


def capacity_verdict(target, dep: Deployment) -> tuple[bool, str]:
    """Exhaustive over every batch size the server can schedule: can a batch that
    ``fits`` need more cells than the buffer has? Arithmetic only, so it is exact."""
    from vmfuzz.harness.model.layouts import worst_case_size

    config = dep.config()
    try:
        mask = target.allocate(config, None)
    except AllocatorChose as chose:
        return True, str(chose)
    cap = mask.buffer.numel()
    r = dep.max_running_requests
    # Only batches whose worst case overflows matter; the worst case grows with
    # bs, so they start at the first such size. Past VERDICT_SPAN of them the
    # sizes are sampled (powers of two and the largest), since fits() is a
    # black box that need not be monotone.
    first = _first_overflowing(config, cap, r)
    if first is None:
        sizes, every = range(0), True
    elif r - first < VERDICT_SPAN:
        sizes, every = range(first, r + 1), True
    else:
        pows = [1 << k for k in range(first.bit_length(), r.bit_length()) if first <= 1 << k <= r]
        sizes, every = sorted({*range(first, first + VERDICT_SPAN), *pows, r}), False
    for bs in sizes:
        if target.fits(mask, bs):
            worst = worst_case_size(mask.mode, bs, config.d, config.max_context_len)
            return True, (f"a batch of {bs} requests reuses the {cap}-cell buffer but can need "
                          f"{worst} cells ({worst - cap} past its end)")
    how = "" if every else f" (sizes past {first + VERDICT_SPAN - 1} sampled)"
    return False, (f"every batch of 1..{r} requests that reuses the "
                   f"{cap}-cell buffer fits it at full context{how}")


#: batch sizes the deployment verdict checks one by one past the first that could overflow
VERDICT_SPAN = 1 << 16


def _first_overflowing(config: Config, cap: int, r: int) -> int | None:
    """The smallest bs in 1..r whose worst case needs more than ``cap`` cells (bisection), or None."""
    from vmfuzz.harness.model.layouts import worst_case_size
    def over(bs: int) -> bool:
        return worst_case_size(config.mode, bs, config.d, config.max_context_len) > cap
    if not over(r):
        return None
    lo, hi = 1, r
    while lo < hi:
        mid = (lo + hi) // 2
        if over(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def routing_verdict(target, dep: Deployment) -> tuple[bool | None, str]:
    """Which backend's mask this server's call sites get, checked through the target's router.

    (None, why) when the deployment names no split, or the target has no router seam.
    """
    from vmfuzz.harness.model.routing import Child, verify_child

    prefill, decode = dep.backends()
    if not (prefill and decode) or prefill == decode:
        return None, ("one attention backend, no router" if prefill or decode
                      else "no attention backend stated")
    if not callable(getattr(target, "route", None)):
        return None, f"target {target.name} drives no router"
    numbers = dep.numbers()
    masks = {}
    for role, name in (("prefill", prefill), ("decode", decode)):
        masks[role] = _site_mask(target, name, numbers)
    children = {role: Child(role, masks[role], dep.context_length) for role in ("prefill", "decode")}
    mode = dep.speculative_attention_mode
    role = verify_child("hybrid", mode)
    r = target.route("hybrid", mode, children, dep.context_length)
    name = decode if role == "decode" else prefill
    if r.verify_mask is not children[role].verify_mask:
        return False, (f"HybridAttnBackend(prefill={prefill}, decode={decode}) with speculative_attention_mode "
                       f"{mode} runs TARGET_VERIFY on {name} but hands the call sites another child's mask")
    if not isinstance(r.max_context_len, int) or r.max_context_len < dep.context_length:
        return False, (f"HybridAttnBackend(prefill={prefill}, decode={decode}) reports max_context_len "
                       f"{r.max_context_len!r} below the context length {dep.context_length}")
    held = "its preallocated mask" if r.verify_mask is not None else "no mask (every step falls back)"
    pp = ""
    if dep.pp_size > 1:
        pp = (f"; with {dep.pp_size} pipeline stages each rebuilds the verify input "
              "(scheduler_pp_mixin) from the same router's mask")
    return True, (f"HybridAttnBackend(prefill={prefill}, decode={decode}), speculative_attention_mode {mode}: "
                  f"TARGET_VERIFY on {name}, the call sites get {held}, max_context_len {r.max_context_len}{pp}")


def _site_mask(target, server_name: str, numbers):
    from vmfuzz.harness.model.allocation import allocating_backend
    site = allocating_backend(server_name)
    if site is None or not callable(getattr(target, "allocating_backends", None)):
        return None
    if target.allocating_backends().get(site, "unknown") is not None:
        return None
    return target.allocation_call(site, numbers).mask


def allocation_verdict(target, dep: Deployment) -> tuple[bool | None, str]:
    """allocation-soundness for the backend that runs TARGET_VERIFY, with this server's numbers."""
    from vmfuzz.harness.model.allocation import allocating_backend
    from vmfuzz.harness.properties import PropertyFailure
    from vmfuzz.harness.properties.allocation import check_site

    name = dep.verify_backend()
    if not name:
        return None, "no attention backend stated"
    site = allocating_backend(name)
    if site is None:
        return None, f"{name} preallocates no verify mask: every verify step allocates per batch"
    if not callable(getattr(target, "allocating_backends", None)):
        return None, f"target {target.name} drives no allocation site"
    why = target.allocating_backends().get(site, "unknown site")
    if why is not None:
        return None, f"{name} ({site}) not driven on {target.name}: {why}"
    try:
        margin = check_site(target, site, dep.numbers())
    except PropertyFailure as exc:
        return False, exc.detail
    return True, (f"{name} ({site}) allocates for max_bs {dep.cuda_graph_max_bs}, context {dep.context_length}, "
                  f"num_draft_tokens {dep.num_draft_tokens}: a full batch at the context limit has "
                  f"{-int(margin)} cell(s) to spare")


def deployment_verdict(dep, target, findings: list) -> dict:
    """What summary.json says of the deployment a run was confined to: whether its server can
    write out of range (by arithmetic, or shown by an overrun the search found), and its
    routing and allocation verdicts."""
    can, why = capacity_verdict(target, dep)
    oob = [f for f in findings if f.origin.effect == "overrun"]
    if oob and not can:
        can, why = True, oob[0].detail
    verdicts = {}
    for part, verdict in (("routing", routing_verdict), ("allocation", allocation_verdict)):
        try:
            ok, detail = verdict(target, dep)
        except Exception as exc:  # the target broke answering for this server: that fails it
            ok, detail = False, f"target raised {type(exc).__name__}: {exc}"
        verdicts[part] = {"ok": ok, "why": detail}
    return {"label": dep.label(), "can_write_out_of_range": can, "why": why,
            "cuda_graph_max_bs": dep.cuda_graph_max_bs, "max_running_requests": dep.max_running_requests,
            "context_length": dep.context_length, "pp_size": dep.pp_size, **verdicts}
