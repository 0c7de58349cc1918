"""The widths a mask path's code is built around: where a production shape crosses a boundary.

The deep boundary corpus (vmfuzz.harness.engine.search.deep_corpus) sizes its cases from these,
not from a list of favourite numbers: a row one node past a packed word, a batch
one lane group past a kernel's block, a packed row one block past the packing
kernel's reach. A target that can read them from the code under test does so
(``shape_constants()``); the defaults are the model's own, from the dtypes it
packs and indexes with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: bits in one packed mask byte (the model packs LSB first, 8 cells a byte)
BITS_PER_BYTE = torch.iinfo(torch.uint8).bits
#: byte offsets a uint8 index reaches: a batch packing to more bytes than this needs wider offsets
UINT8_OFFSETS = torch.iinfo(torch.uint8).max + 1


@dataclass(frozen=True)
class ShapeConstants:
    #: the unsigned widths a per-request tree row is packed into (one node past each is a boundary)
    packed_widths: tuple[int, ...]
    #: bytes one packing program covers: a packed row longer than this needs a second program
    pack_block_bytes: int
    #: lanes one kernel program runs: a batch of more cells than this spans lane groups
    lanes: int
    #: where each number came from (reported in the summary, so a reader can check it)
    source: str

    @property
    def pack_block_bits(self) -> int:
        return self.pack_block_bytes * BITS_PER_BYTE

    @property
    def long_row_bits(self) -> int:
        """What the longest packed row must pass: the packing block, and a uint8's byte offsets."""
        return max(self.pack_block_bytes, UINT8_OFFSETS) * BITS_PER_BYTE


def model_constants() -> ShapeConstants:
    """The reference model's own: rows packed as uint8/16/32 words, byte offsets past what a
    uint8 can index (256), and batches past what an int8 index can count (128)."""
    widths = tuple(torch.iinfo(t).bits for t in (torch.uint8, torch.int16, torch.int32))
    return ShapeConstants(packed_widths=widths, pack_block_bytes=UINT8_OFFSETS,
                          lanes=torch.iinfo(torch.int8).max + 1,
                          source="the model's dtypes: uint8/16/32 packed words, uint8 byte offsets, int8 indices")
