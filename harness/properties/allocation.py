"""``allocation-soundness``: each allocating backend sizes the mask for what the server runs.

The case's config is read as a server: captured max_bs, the model's context
length (``max_context_len``), the draft width and topk. Every allocation site
the target drives runs its set-up for those numbers, and its call to
``maybe_create_verify_mask`` must

- make a mask at all (a target runner that drafts: otherwise every step falls back),
- pass max_bs, max_context_len and num_draft_tokens at least the server's,
- pass ``is_read`` exactly when the backend's verify attention reads the mask
  (``vmfuzz.harness.model.allocation.reads_mask``),

and the mask it got must admit the captured max_bs and hold, for every batch it
admits, every request at the context limit, in exactly the cells its layout
needs for the numbers it was asked with. Before any site runs, the target's
footprint function (SGLang's ``tree_mask_numel``) is asked for the case's
batch sizes in each preallocated layout and must equal the layout arithmetic
(``vmfuzz.harness.model.layouts``): a footprint too large to allocate is judged as a
footprint, not reported as the allocation raising. FlashAttention's
cuda-graph metadata buffers (``vmfuzz.harness.model.fa3_graph``) are judged the same
way, each at least what the captured max_bs binds (and each running sum it fills
once and every replay binds as it is, with the start and step its pass's rows
mean: ``fa3_graph.constant_sums``), and so are the Triton
backend's per-request index pointers (``kv_indptr``, ``qo_indptr``,
``mask_indptr``: pool + 1 entries each). Arithmetic and meta-device
allocations only: it holds at production scale as cheaply as at small scale.
Sites the target cannot drive are named in the observed classes ("not driven:
NAME"), never counted as held; a target that drives none fails the case.
"""

from __future__ import annotations

from contextlib import nullcontext

from vmfuzz.harness.model.allocation import TRITON_INIT, ServerNumbers, indptr_entries, reads_mask
from vmfuzz.harness.model.fa3_graph import (DIMENSIONS, constant_sums, graph_needs, length_sums, page_sizes,
                                              short_dimension)
from vmfuzz.harness.model.fa3_graph import WRITER as FA3_GRAPH
from vmfuzz.harness.model.config import Batch, Config
from vmfuzz.harness.model.layouts import PREALLOCATED_LAYOUTS, worst_case_size
from vmfuzz.harness.model.origin import ALLOCATOR, BEYOND_CAPACITY
from vmfuzz.harness.properties.kit import KnownMet, Observation, fail, known_goes_on

NAME = "allocation-soundness"
#: who sized the mask: a backend's cuda-graph set-up calling maybe_create_verify_mask
SITE = "allocation site"
_SITE = {"writer": SITE, "buffer": "tree_mask"}
#: who says how many cells a preallocated mask takes: the target's ``numel`` seam
FOOTPRINT = "tree_mask_numel"


def _cells(n: int) -> str:
    # A shifted footprint runs to millions of digits, more than Python will print.
    return f"{n} cells" if n.bit_length() <= 64 else f"about 2^{n.bit_length() - 1} cells"


def _footprint_differs(at: str, got: int, want: int, why: str, writer: str = FOOTPRINT) -> None:
    over = got > want
    fail(NAME, f"{at} is {_cells(got)}, {why} needs {_cells(want)}: "
                + ("memory no batch uses" if over else "a batch fits admits writes past the buffer"),
         effect="wrong" if over else "unsound", writer=writer, buffer="tree_mask",
         cell="footprint over the layout's" if over else "footprint under the layout's")


def check_footprint(target, config: Config, batches: list[Batch]) -> None:
    """The target's footprint for the case's batch sizes, in each preallocated layout, against the
    layout arithmetic; asked before any allocation, so a footprint no allocator accepts is still judged."""
    d, context = config.num_draft_tokens, config.max_context_len
    for bs in sorted({1, config.max_bs, *(batch.bs for batch in batches)}):
        for mode in PREALLOCATED_LAYOUTS:
            got = int(target.numel(mode, bs, d, context))
            want = worst_case_size(mode, bs, d, context)
            if got != want:
                _footprint_differs(f"{FOOTPRINT}({mode.name}, bs={bs}, d={d}, max_context_len={context})",
                                   got, want, f"the layout of {bs} requests at the context limit")


def check_site(target, backend: str, numbers: ServerNumbers, obs: Observation | None = None) -> float:
    """Fails with a way ``backend``'s allocation misses ``numbers``; returns the margin (cells a full
    batch at the context limit needs beyond the buffer, negative when it fits). Given ``obs``, a failure
    a known entry names ends only its own check (``kit.known_goes_on``): the site's other numbers are
    still judged, so a second defect of the same site is a finding; without it, the first failure ends all."""
    call = target.allocation_call(backend, numbers)
    at = f"{backend}: maybe_create_verify_mask({call.describe()})"
    server = (f"a server capturing max_bs {numbers.max_bs}, context {numbers.context_len}, "
              f"num_draft_tokens {numbers.num_draft_tokens}, topk {numbers.topk}")

    def part(label: str):
        return known_goes_on(target, obs, f"site {backend} {label}") if obs is not None else nullcontext(KnownMet())

    if _check_arguments(call, backend, numbers, at, server, part):
        # the mask was sized by a known defect's numbers: judging it again would only see that defect
        obs.classes.add(f"site {backend} mask: not judged past a known defect of its numbers")
        return float("-inf")
    margin = float("-inf")
    with part("mask"):  # each check of the mask needs the one before it: a known failure ends them all
        margin = _check_mask(target, call, numbers, at, server)
    return margin


def _check_arguments(call, backend: str, numbers: ServerNumbers, at: str, server: str, part) -> bool:
    """What the site asked ``maybe_create_verify_mask`` for, each number judged on its own; True when
    one of them met a known defect."""
    want_read = reads_mask(backend, numbers.topk)
    fewer = {"effect": "overrun", "side": "above"}
    checks = (
        ("runner role", call.is_draft_runner or call.skip_prefill,
         f"{at} on the target runner of {server} passes is_draft_runner={call.is_draft_runner}, "
         f"skip_prefill={call.skip_prefill}: no mask, every verify step falls back",
         {"effect": "unsound", "cell": "runner role"}),
        ("max_bs", not isinstance(call.max_bs, int) or call.max_bs < numbers.max_bs,
         f"{at}, for {server}: batches of {call.max_bs}..{numbers.max_bs} run captured "
         "but the mask was sized for fewer", {**fewer, "cell": "sized for fewer requests"}),
        ("context", not isinstance(call.max_context_len, int) or call.max_context_len < numbers.context_len,
         f"{at}, for {server}: requests reach {numbers.context_len} tokens but a FULL_MASK row "
         f"was sized for {call.max_context_len}", {**fewer, "cell": "sized for a shorter context"}),
        ("draft tokens", not isinstance(call.num_draft_tokens, int) or call.num_draft_tokens < numbers.num_draft_tokens,
         f"{at}, for {server}: every request writes {numbers.num_draft_tokens} draft rows, "
         f"the mask was sized for {call.num_draft_tokens}", {**fewer, "cell": "sized for fewer draft tokens"}),
        ("is_read", call.is_read != want_read,
         f"{at}, for {server}: {backend}'s verify attention {'reads' if want_read else 'does not read'} the "
         f"mask, so is_read must be {want_read} (an unread mask is allocated QLEN_ONLY, a read one in the "
         "reader's layout)", {"effect": "unsound", "cell": "is_read"}),
    )
    met = False
    for label, wrong, said, origin in checks:
        with part(label) as m:
            if wrong:
                fail(NAME, said, **origin, **_SITE)
        met = met or m.name is not None
    return met


def _check_mask(target, call, numbers: ServerNumbers, at: str, server: str) -> float:
    """The mask the site got: there at all, admitting the captured max_bs, sized as asked, and holding
    a full batch at the context limit; returns the margin."""
    mask = call.mask
    if mask is None:
        fail(NAME, f"{at}, for {server}: returned no mask, so every verify step falls back",
             effect="unsound", cell="no mask", **_SITE)
    if not target.fits(mask, numbers.max_bs):
        fail(NAME, f"{at}, for {server}: the mask does not admit the captured max_bs {numbers.max_bs}",
             effect="unsound", cell="refused the captured max_bs", **_SITE)
    cap = mask.buffer.numel()
    if isinstance(call.max_context_len, int) and isinstance(call.num_draft_tokens, int):
        asked = worst_case_size(mask.mode, mask.max_bs, call.num_draft_tokens, call.max_context_len)
        if cap != asked:  # the allocator sized its buffer for other numbers than it was asked with
            _footprint_differs(f"{at}: its {mask.mode.name} mask for max_bs {mask.max_bs}", cap, asked,
                               "the layout of those numbers", writer=ALLOCATOR)
    worst = worst_case_size(mask.mode, mask.max_bs, numbers.num_draft_tokens, numbers.context_len)
    if worst > cap:
        fail(NAME, f"{at}, for {server}: the {cap}-cell {mask.mode.name} mask admits {mask.max_bs} requests, "
                    f"which need {worst} cells at the context limit ({worst - cap} past its end)",
             effect="overrun", side="above", cell=BEYOND_CAPACITY, **_SITE)
    return float(worst - cap)


def check_fa3_graph(target, obs: Observation, numbers: ServerNumbers, sites: dict | None = None) -> None:
    """FlashAttention's cuda-graph metadata buffers, as its ``init_cuda_graph_state(max_bs, ...)`` sized
    them, against what a graph of the captured max_bs binds (``vmfuzz.harness.model.fa3_graph``); run before the
    sites, so a size the real set-up refuses (it raises there) is judged as the size it is."""
    why = (target.allocating_backends() if sites is None else sites).get("flashattention", "no such site")
    read = getattr(target, "fa3_graph_buffers", None)
    if read is None or why is not None:
        obs.classes.add(f"fa3 cuda-graph buffers: not driven ({why or 'not by this target'})")
        return
    for page_size in page_sizes(numbers):
        needs = graph_needs(numbers, page_size)
        server = (f"a server capturing max_bs {numbers.max_bs}, context {numbers.context_len}, "
                  f"num_draft_tokens {numbers.num_draft_tokens}, topk {numbers.topk}, page size {page_size}")
        for name, got in read(numbers, list(needs), page_size=page_size).items():
            short = short_dimension(got, needs[name])
            if short is not None:
                unit = DIMENSIONS[name.rsplit(".", 1)[1]][short]
                fail(NAME, f"{FA3_GRAPH}: {name} is {list(got)}, {server} needs at least {list(needs[name])}: "
                            f"{unit} too few, so a captured batch's metadata runs past it",
                     effect="unsound", writer=FA3_GRAPH, buffer=name, cell=f"{unit} too few")
    _fa3_constants(target, obs, numbers)
    obs.classes.add("fa3 cuda-graph buffers")


def _fa3_constants(target, obs: Observation, numbers: ServerNumbers) -> None:
    """The running sums FlashAttention's set-up fills once, which every replay binds as they are, against
    what a row of their pass holds (``fa3_graph.constant_sums``, ``length_sums``)."""
    read = getattr(target, "fa3_graph_constants", None)
    if read is None:
        obs.classes.add("fa3 cuda-graph constant sums: not driven by this target")
        return
    sums, lengths_of = constant_sums(numbers), length_sums(numbers)
    made = read(numbers, [*sums, *lengths_of, *lengths_of.values()])
    for name, lengths in lengths_of.items():
        fill = made[lengths]
        if fill is not None and fill[0] == "full":
            sums[name] = fill[1]
    for name, step in sums.items():
        if made[name] != ("arange", 0, step):
            how = "left for the replay to write" if made[name] is None else \
                f"filled as {made[name][0]}{tuple(made[name][1:])}"
            fail(NAME, f"{FA3_GRAPH}: {name} is {how}; each row of its pass holds {step} tokens, so it must be "
                       f"arange(0, ..., step={step}): no replay rewrites it, every captured batch binds it as it is",
                 effect="wrong", writer=FA3_GRAPH, buffer=name, cell="constant running sum")
    obs.classes.add("fa3 cuda-graph constant sums")


def check_triton_indptrs(target, obs: Observation, numbers: ServerNumbers, sites: dict) -> None:
    """The Triton backend's per-request index pointers, as its ``__init__`` sized them, against the batches
    its request pool holds (``vmfuzz.harness.model.allocation.indptr_entries``): one too short is written past, or
    refuses a batch the server runs, the first time a full pool verifies."""
    why = sites.get("triton", "no such site")
    read = getattr(target, "triton_indptr_buffers", None)
    if read is None or why is not None:
        obs.classes.add(f"triton index pointers: not driven ({why or 'not by this target'})")
        return
    pool, want = numbers.max_bs, indptr_entries(numbers.max_bs)
    for name, shape in read(numbers).items():
        got = shape[0] if shape else 0
        if got < want:
            fail(NAME, f"{TRITON_INIT}: {name} has {got} entries, a request pool {pool} deep needs {want} "
                        f"(bs + 1 offsets for up to {pool} requests): a full batch's pointers run past it",
                 effect="unsound", writer=TRITON_INIT, buffer=name, cell="entries too few")
    obs.classes.add("triton index pointers")


def allocation_soundness(target, config: Config, batches: list[Batch], device="cpu") -> Observation:
    obs = Observation()
    numbers = ServerNumbers.of(config)
    check_footprint(target, config, batches)
    sites = target.allocating_backends()
    # a known defect of one part ends only that part (the footprint's stays whole: the sites allocate by it)
    with known_goes_on(target, obs, "fa3 cuda-graph buffers"):
        check_fa3_graph(target, obs, numbers, sites)
    with known_goes_on(target, obs, "triton index pointers"):
        check_triton_indptrs(target, obs, numbers, sites)
    driven = [name for name, why in sites.items() if why is None]
    for name, why in sites.items():
        if why is not None:
            obs.classes.add(f"not driven: {name}")
    if not driven:
        fail(NAME, "no allocation site can be driven on this target: "
                    + "; ".join(f"{n}: {why}" for n, why in sites.items()),
             effect="unsound", writer=SITE, cell="none driven")
    for name in driven:
        obs.classes.add(f"site {name}")
        obs.margin = max(obs.margin, check_site(target, name, numbers, obs))
    obs.classes.add("topk > 1" if config.topk > 1 else "topk 1")
    return obs
