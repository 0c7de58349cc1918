"""A known finding: a real defect of SGLang, upstream's to fix, kept with the releases it applies to.

A gate must not fail every pull request on a defect the pull request did not
bring, and must not hide it either: every command lists a known finding and
exits on new groups only. Each entry is one file under ``known/``: the repro
that shows the defect, the SGLang releases it was seen on (a *closed* PEP 440
range: up to the newest release it was seen on, so a new release is judged
afresh), one line saying why it is upstream's, and the origins that are this
defect (``origins``: each a set of origin fields, every field given must equal
the finding's, or be one of a list). Matching is on typed fields only, exact
and anchored: a new router, another resolved class or a new property is never
swallowed by an entry, and no pattern can run away.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from vmfuzz.harness.model.origin import EFFECTS, Origin
from vmfuzz.harness.model.repro_file import Repro, ReproError, to_case
from vmfuzz.harness.model.validate import load_file

Field = str | list[str]

#: what a known entry's replay showed (summary.json's ``known_findings[].status``): its origin again;
#: held (retire it); another origin (a finding); out of step (nothing can be said)
REPRODUCES, GONE, DIFFERENT, UNCHECKED = ("reproduces", "no longer reproduces", "fails differently",
                                          "could not replay")
KNOWN_STATUSES = (REPRODUCES, GONE, DIFFERENT, UNCHECKED)


class OriginPattern(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Origin fields a known defect has; an absent field matches anything, a list any of its values."""

    property: str
    effect: str
    writer: Field | None = None
    buffer: Field | None = None
    side: Field | None = None
    cell: Field | None = None
    exc_type: Field | None = None
    frame: Field | None = None
    router: Field | None = None
    role: Field | None = None
    spec_mode: Field | None = None
    resolved: Field | None = None

    def matches(self, origin: Origin) -> bool:
        for name in self.__struct_fields__:
            want = getattr(self, name)
            if want is None:
                continue
            have = getattr(origin, name)
            if have not in (want if isinstance(want, list) else [want]):
                return False
        return True


class Known(msgspec.Struct, forbid_unknown_fields=True):
    #: SGLang releases the defect was seen on, closed above, e.g. ">=0.5.19,<=0.5.23"
    sglang: str
    #: one line: what the defect is, and why it is SGLang's, not the harness's
    reason: str
    #: the origins this defect shows as, and only it
    origins: list[OriginPattern]
    repro: Repro
    #: the file's stem, filled in when loaded
    name: str = ""

    def applies_to(self, version: str | None) -> bool:
        if not version:
            return False
        try:
            return SpecifierSet(self.sglang).contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False

    def matches(self, origin: Origin | None) -> bool:
        """Does this entry excuse ``origin``? Only when it names every cause the failure showed: a
        second defect met on the same case (another escaped cell class, another differing output)
        is new, whatever the first one is."""
        return origin is not None and not self.uncovered(origin)

    def uncovered(self, origin: Origin) -> list[Origin]:
        """The causes of ``origin`` this entry does not name (each an origin of one cause)."""
        return [part for part in origin.parts() if not any(p.matches(part) for p in self.origins)]


def applying(found: list[tuple[Path, Known]], versions: dict) -> list[tuple[Path, Known]]:
    """The entries whose range holds the SGLang of ``versions`` (none for a target that is not SGLang)."""
    return [(p, k) for p, k in found if k.applies_to(versions.get("sglang"))]


def _closed(spec: SpecifierSet) -> bool:
    return any(s.operator in ("<", "<=", "==", "===", "~=") for s in spec)


def decode(data: bytes, path: str | Path = "<known finding>") -> Known:
    try:
        known = msgspec.json.decode(data, type=Known)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ReproError(f"{path}: not a known-finding file: {exc}") from None
    try:
        spec = SpecifierSet(known.sglang)
    except InvalidSpecifier:
        raise ReproError(f"{path}: sglang {known.sglang!r} is not a version range (e.g. '>=0.5.17,<=0.5.23')") \
            from None
    if not _closed(spec):
        raise ReproError(f"{path}: sglang {known.sglang!r} is open above: close it at the newest release the "
                         "defect was seen on (e.g. '<=0.5.23'), so a new release is judged afresh")
    if not known.reason.strip() or "\n" in known.reason:
        raise ReproError(f"{path}: reason must be one line")
    if not known.repro.property:
        raise ReproError(f"{path}: the repro must name its property")
    if not known.origins:
        raise ReproError(f"{path}: origins is empty: name the origin fields of this defect")
    for i, p in enumerate(known.origins):
        if p.effect not in EFFECTS:
            raise ReproError(f"{path}: origins[{i}].effect {p.effect!r} is not one of {', '.join(EFFECTS)}")
        if p.property != known.repro.property:
            raise ReproError(f"{path}: origins[{i}].property {p.property!r} is not the repro's property "
                             f"{known.repro.property!r}")
    to_case(known.repro)  # a known finding that cannot be replayed proves nothing
    return msgspec.structs.replace(known, name=Path(path).stem)


def load(path: str | Path) -> Known:
    return load_file(path, "known-finding file", decode, ReproError)
