"""The repro file (docs/workflows.md, the repro file): the contract other tools read and write.

JSON via msgspec. ``batches[i].top_scores_index``/``parent_list`` are optional:
without them each request gets the simplest valid tree, so a person can write a
repro by hand from nothing but seq_lens.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

import vmfuzz.harness
from vmfuzz.harness.model.config import Batch, Config, ConfigError, DraftTree
from vmfuzz.harness.model.layouts import TreeMaskMode
from vmfuzz.harness.model.limits import MAX_STEPS
from vmfuzz.harness.model.origin import Origin
from vmfuzz.harness.model.validate import LimitError, check_case, check_config, load_file, repeated_key


class ReproError(Exception):
    """A repro file that cannot be read or does not describe a valid case: exit 2."""


class ConfigSpec(msgspec.Struct, forbid_unknown_fields=True):
    mode: str
    max_bs: int
    max_context_len: int
    num_draft_tokens: int
    topk: int
    spec_steps: int
    is_read: bool = True
    #: absent in files written before the other call sites were driven: "eagle"
    call_site: str = "eagle"


class BatchSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    seq_lens: list[int]
    top_scores_index: list[list[int]] | None = None
    parent_list: list[list[int]] | None = None


class Repro(msgspec.Struct, forbid_unknown_fields=True):
    config: ConfigSpec
    batches: list[BatchSpec]
    #: optional, so a repro can be pasted from a crash report: without them the
    #: command line's --target / --property decide (default reference, every
    #: property that applies to the config)
    target: str = ""
    property: str = ""
    detail: str = ""
    seed: int | None = None
    harness_version: str = ""
    #: "target-crash" / "target-hang": the target died or stopped answering on
    #: this case (vmfuzz.harness.engine.core.isolation); absent for a property's own failure.
    fault: str | None = None
    #: which failure it is, as typed fields (vmfuzz.harness.model.origin): what minimize keeps, bisect
    #: tests and groups read. Absent in files written by hand or before origins: replay fills it in.
    origin: Origin | None = None


def to_case(repro: Repro) -> tuple[Config, list[Batch]]:
    c = repro.config
    try:
        mode = TreeMaskMode.parse(c.mode)
        # The limits first: a consistency message about 10**6 draft tokens would hide the size.
        config = check_config(Config(mode, c.max_bs, c.max_context_len, c.num_draft_tokens, c.topk,
                                     c.spec_steps, c.is_read, c.call_site)).validate()
        if not repro.batches:
            raise ConfigError("batches is empty: a repro needs at least one step")
        if len(repro.batches) > MAX_STEPS:
            raise LimitError(f"batches has {len(repro.batches)} steps, over MAX_STEPS ({MAX_STEPS})")
        out = []
        for i, b in enumerate(repro.batches):
            trees = None
            if (b.top_scores_index is None) != (b.parent_list is None):
                raise ConfigError(f"batches[{i}]: give both top_scores_index and parent_list, or neither")
            if b.top_scores_index is not None:
                if len(b.top_scores_index) != len(b.seq_lens) or len(b.parent_list) != len(b.seq_lens):
                    raise ConfigError(f"batches[{i}]: one top_scores_index row and one parent_list row per request")
                trees = tuple(DraftTree(tuple(s), tuple(p)) for s, p in zip(b.top_scores_index, b.parent_list))
            try:
                out.append(Batch(tuple(b.seq_lens), trees).validate(config))
            except ConfigError as exc:
                raise ConfigError(f"batches[{i}]: {exc}") from None
        check_case(config, out, repro.property)
    except (ConfigError, ValueError) as exc:
        raise ReproError(str(exc)) from None
    return config, out


def from_case(target: str, prop: str, config: Config, batches: list[Batch], *,
              detail: str = "", seed: int | None = None, fault: str | None = None,
              origin: Origin | None = None) -> Repro:
    specs = []
    for b in batches:
        if b.trees is None:
            specs.append(BatchSpec(list(b.seq_lens)))
        else:
            specs.append(BatchSpec(list(b.seq_lens), [list(t.top_scores_index) for t in b.trees],
                                   [list(t.parent_list) for t in b.trees]))
    cfg = ConfigSpec(config.mode.name, config.max_bs, config.max_context_len, config.num_draft_tokens,
                     config.topk, config.spec_steps, config.is_read, config.call_site)
    return Repro(cfg, specs, target, prop, detail, seed, vmfuzz.harness.__version__, fault, origin)


def load(path: str | Path) -> Repro:
    return load_file(path, "repro file", decode, ReproError)


def decode(data: bytes, path: str | Path = "<repro>") -> Repro:
    """The repro in ``data``; decoding is data only (a plug-in ``target`` is a name here,
    imported later only when the user names it with --target)."""
    key = repeated_key(data)
    if key is not None:
        raise ReproError(f"{path}: invalid repro: key {key!r} appears more than once in one object")
    try:
        return msgspec.json.decode(data, type=Repro)
    except msgspec.ValidationError as exc:
        raise ReproError(f"{path}: invalid repro: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ReproError(f"{path}: not valid JSON: {exc}") from None


def dump(repro: Repro, path: str | Path) -> Path:
    """Write ``repro`` to ``path``; returns where it really went.

    A finding must never be lost to a broken output place (a report directory
    removed or made read-only mid-run, a full disk): then it goes to
    ``validate.fallback_dir()`` and stderr says where.
    """
    path = Path(path)
    data = msgspec.to_builtins(repro)
    # A target's message may hold lone surrogates, which no UTF-8 file can.
    data["detail"] = data.get("detail", "").encode("utf-8", "backslashreplace").decode("utf-8")
    # the documented key order: target and property first
    data = {k: data[k] for k in ("target", "property", "config", "batches")} | data
    for optional in ("fault", "origin"):
        if data.get(optional) is None:
            data.pop(optional, None)  # a hand-written repro's file stays exactly the documented schema
    if data["config"].get("call_site") == "eagle":
        data["config"].pop("call_site")  # the default call site: the file reads as before
    body = msgspec.json.format(msgspec.json.encode(data), indent=2) + b"\n"
    import sys
    try:
        return _write(path, body)
    except OSError as exc:
        from vmfuzz.harness.model.validate import fallback_dir
        try:
            spare = fallback_dir()
            where = _write(spare / path.name if not (spare / path.name).exists()
                           else spare / f"{path.stem}-{len(list(spare.iterdir()))}{path.suffix}", body)
        except OSError as again:
            # Every disk this process can write is full: the finding stands (its exit is 1) and the
            # repro itself goes to stderr, where a CI log keeps it.
            print(f"vmfuzz: cannot write {path} ({exc.strerror or exc}) nor a fallback copy "
                  f"({again.strerror or again}); the repro follows:\n{body.decode()}", file=sys.stderr, end="")
            return path
        print(f"vmfuzz: cannot write {path} ({exc.strerror or exc}); the repro is at {where}", file=sys.stderr)
        return where


def _write(path: Path, body: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_bytes(body)
        tmp.replace(path)  # a finding on disk is whole or absent, never half-written
    except BaseException:
        tmp.unlink(missing_ok=True)  # a half-written temporary is no finding: the caller writes it elsewhere
        raise
    return path
