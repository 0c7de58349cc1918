"""The ``reference`` target: the embedded model of SGLang's fixed design, no SGLang needed."""

from vmfuzz.harness.targets.reference.mask import VerifyMask
from vmfuzz.harness.targets.reference.target import ReferenceTarget, reusable_buffer

__all__ = ["ReferenceTarget", "VerifyMask", "reusable_buffer"]
