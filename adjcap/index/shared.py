"""The index as the Ray job shares it: one read-only copy per node, not one per retriever actor.

:func:`shared_index` reads a finished index's shards as stored (fp16 stays fp16) and packs the corpus
texts into two flat arrays (:class:`TextTable`), so the whole payload is numpy arrays. The job puts it
in Ray's object store once; ``ray.get`` in an actor on the same node returns read-only views of the
node's shared memory (no copy), and :meth:`SharedIndex.open` wraps those views without copying on the
CPU (the index is scored in fp32 chunk by chunk, see :meth:`CaptionIndex.search`). On a GPU the
actor copies the vectors to its device once, as before.

At bigG width (1280) and 566,747 captions that is 1.45 GB of fp16 vectors and ~60 MB of texts per
node, instead of 2.9 GB of fp32 vectors plus ~100 MB of Python strings per actor.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from adjcap.index.search import CaptionIndex
from adjcap.index.shards import read_arrays


@dataclass(frozen=True)
class TextTable:
    """Caption texts as one UTF-8 byte array and row offsets: ``table[i]`` is text ``i``. A sequence
    of str that Ray shares between processes without copying (a list of str is unpickled per actor)."""

    blob: np.ndarray  # uint8 [total bytes]
    offsets: np.ndarray  # int64 [n + 1]

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> TextTable:
        encoded = [t.encode("utf-8") for t in texts]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets)

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def __getitem__(self, i: int) -> str:
        if not -len(self) <= i < len(self):
            raise IndexError(f"text {i} of {len(self)}")
        i %= len(self)
        return self.blob[self.offsets[i] : self.offsets[i + 1]].tobytes().decode("utf-8")

    @property
    def nbytes(self) -> int:
        return int(self.blob.nbytes + self.offsets.nbytes)


@dataclass(frozen=True)
class SharedIndex:
    """What the job puts in the object store once for every retriever actor."""

    vectors: np.ndarray  # [n, dim] as stored (fp16 or fp32), unit rows
    ids: np.ndarray  # int64 [n]
    precision: str
    texts: TextTable

    @property
    def nbytes(self) -> int:
        return int(self.vectors.nbytes + self.ids.nbytes + self.texts.nbytes)

    def open(self, device: str = "auto") -> CaptionIndex:
        """The searchable index over these arrays: on the CPU without a copy, on a GPU one copy there."""
        return CaptionIndex.from_stored(self.vectors, self.ids, self.precision, device)


def shared_index(out: Path, texts: Sequence[str]) -> SharedIndex:
    """The finished index in ``out`` (checked against its manifest) and the corpus texts, as arrays."""
    vectors, ids, precision = read_arrays(out)
    if ids.size and int(ids.max()) >= len(texts):
        raise ValueError(f"{out}: index ids go up to {int(ids.max())} but the corpus has {len(texts)} texts; "
                         "rebuild the index for this corpus")
    return SharedIndex(vectors, ids, precision, TextTable.from_texts(texts))
