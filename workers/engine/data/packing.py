"""Documents packed into rows of a fixed window (model.seq_len + 1 tokens).

With packing, whole documents sit side by side in a row, in the order given, until the
next one does not fit; without, each row holds one. The rest of a row is padding. A row is
kept as the list of its documents, so packing a corpus costs a few integers per document;
its tokens are read from the documents' memmap when a batch needs them.

Alongside the tokens a row carries each token's document number within the row (-1 for
padding): attention never crosses documents and positions restart at each, and a target
counts only where it continues the same document and the loss learns it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardline.workers.engine.data.documents import Documents


@dataclass(frozen=True)
class Rows:
    """Materialized rows: token ids, whether each token is learned, its document number
    within the row (-1: padding). Each (rows, window)."""

    tokens: np.ndarray
    learned: np.ndarray
    documents: np.ndarray

    def loss_mask(self) -> np.ndarray:
        """(rows, window - 1): whether the target at each input position counts."""
        same = self.documents[:, 1:] == self.documents[:, :-1]
        return same & (self.documents[:, 1:] >= 0) & self.learned[:, 1:].astype(bool)


@dataclass(frozen=True)
class PackedRows:
    """Row r holds documents doc_ids[row_start[r]:row_start[r + 1]], in that order."""

    docs: Documents
    window: int
    row_start: np.ndarray
    doc_ids: np.ndarray
    # Per row: loss targets, and real input tokens (the window's last token is no input).
    loss_tokens: np.ndarray
    input_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.row_start) - 1

    def rows(self, indices: np.ndarray) -> Rows:
        k = len(indices)
        tokens = np.zeros((k, self.window), dtype=np.int64)
        learned = np.zeros((k, self.window), dtype=np.uint8)
        documents = np.full((k, self.window), -1, dtype=np.int32)
        starts = self.docs.starts
        for out, r in enumerate(indices):
            pos = 0
            for number, d in enumerate(self.doc_ids[self.row_start[r] : self.row_start[r + 1]]):
                a, b = starts[d], starts[d + 1]
                n = b - a
                tokens[out, pos : pos + n] = self.docs.tokens[a:b]
                learned[out, pos : pos + n] = self.docs.learned[a:b]
                documents[out, pos : pos + n] = number
                pos += n
        return Rows(tokens, learned, documents)


def pack(docs: Documents, order: np.ndarray, window: int, packing: bool) -> PackedRows:
    """Rows of `window` tokens from documents `order` (each at most `window` long)."""
    lengths = docs.lengths[order]
    if len(lengths) and lengths.max() > window:
        raise ValueError(f"a document of {lengths.max()} tokens does not fit a window of {window}")
    bounds = [0]
    used = 0
    for i, n in enumerate(lengths.tolist()):
        if packing and i > bounds[-1] and used + n <= window:
            used += n
            continue
        if i > 0:
            bounds.append(i)
        used = n
    if len(order):
        bounds.append(len(order))
    row_start = np.asarray(bounds, dtype=np.int64)
    doc_ids = np.asarray(order, dtype=np.int64)
    if len(row_start) < 2:
        empty = np.zeros(0, dtype=np.int64)
        return PackedRows(docs, window, row_start, doc_ids, empty, empty)
    heads = row_start[:-1]
    loss = np.add.reduceat(docs.loss_tokens()[doc_ids], heads)
    used_per_row = np.add.reduceat(lengths, heads)
    inputs = np.minimum(used_per_row, window - 1)
    return PackedRows(docs, window, row_start, doc_ids, loss, inputs)
