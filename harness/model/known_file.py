"""A known finding: a real defect of SGLang, upstream's to fix, kept with the releases it applies to.

A gate must not fail every pull request on a defect the pull request did not
bring, and must not hide it either: ``gate`` lists a known finding and passes,
``run`` reports it as the finding it is. Each entry is one file under
``known/``: the repro that shows the defect, the SGLang versions it applies to
(a PEP 440 range), one line saying why it is upstream's, and a phrase of the
finding's detail that names this defect and no other (``match``, a regular
expression), so that a
new defect of the same property is still a finding.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.model.repro_file import Repro, ReproError, to_case
from harness.model.validate import load_file


class Known(msgspec.Struct, forbid_unknown_fields=True):
    #: SGLang releases the defect is in, e.g. ">=0.5.17,<0.5.23" (open-ended while upstream has not fixed it)
    sglang: str
    #: one line: what the defect is, and why it is SGLang's, not the harness's
    reason: str
    #: a regular expression found in the finding's detail when, and only when, it is this defect
    match: str
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

    def matches(self, prop: str, detail: str) -> bool:
        return prop == self.repro.property and re.search(self.match, detail) is not None


def decode(data: bytes, path: str | Path = "<known finding>") -> Known:
    try:
        known = msgspec.json.decode(data, type=Known)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ReproError(f"{path}: not a known-finding file: {exc}") from None
    try:
        SpecifierSet(known.sglang)
    except InvalidSpecifier:
        raise ReproError(f"{path}: sglang {known.sglang!r} is not a version range (e.g. '>=0.5.17,<0.5.23')") \
            from None
    if not known.reason.strip() or "\n" in known.reason:
        raise ReproError(f"{path}: reason must be one line")
    try:
        if not known.match.strip():
            raise re.error("empty")
        re.compile(known.match)
    except re.error as exc:
        raise ReproError(f"{path}: match must be a regular expression naming the defect ({exc})") from None
    if not known.repro.property:
        raise ReproError(f"{path}: the repro must name its property")
    to_case(known.repro)  # a known finding that cannot be replayed proves nothing
    return msgspec.structs.replace(known, name=Path(path).stem)


def load(path: str | Path) -> Known:
    return load_file(path, "known-finding file", decode, ReproError)
