"""vmfuzz: property-based regression harness for SGLang's target-verify tree mask."""

__version__ = "0.1.0"
