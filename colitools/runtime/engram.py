"""DeepSeek-V4.1 Flash's engram: n-gram memory looked up by hash and gated into the hyper-connection streams
(colibri ``c/deepseek_v41.c`` ``engram_hash`` / ``engram_run``, the vendor's ``engram.py``).

The hash tables are not weights: colibri's ``tools/prepare_dsv41.py`` computes them (bucket primes with sympy, the
vendor's PCG64 multipliers, the tokenizer's compressed-token map) into the sidecar ``dsv41_engram.json`` beside
``config.json``; ``EngramHash`` reads it, ``Engram`` is one layer's lookup and gate. ``state`` (``hash``, ``history``
of compressed ids by position) is shared by the layers of one model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from colitools.formats.errors import RuntimeModelError
from colitools.formats.jsonfile import load_json_object
from colitools.formats.targets import V41_ENGRAM_FILE
from colitools.runtime.ops import Embedding, Linear, sigmoid
from colitools.runtime.weights import Checkpoint, sanitize

F32 = np.float32


@dataclass(frozen=True)
class EngramArgs:
    layers: tuple[int, ...]  # engram_layer_ids: table t belongs to layers[t]
    max_ngram: int
    heads: int
    head_dim: int

    @property
    def cols(self) -> int:
        """Rows looked up per position and table: one per n-gram order above 1 and head."""
        return (self.max_ngram - 1) * self.heads


class EngramHash:
    """The n-gram hash of colibri's sidecar ``dsv41_engram.json`` (``c/deepseek_v41.c`` ``engram_hash``): position
    ``p``'s compressed ids ``c_s = token_map[id(p - s)]``, ``s < max_ngram`` (the sidecar's ``pad_id`` from the first
    position before 0 on); ``r = c_0 m_0``, then for each order ``i >= 1`` ``r ^= c_i m_i`` and one row per head
    ``r mod primes[t][i-1][h] + offsets[t][col]``. The multipliers are decimal strings (past a double's 53 bits)."""

    def __init__(self, side: dict, e: EngramArgs, vocab: int, where: str):
        try:
            self.token_map = np.asarray(side["token_map"], dtype=np.int64)
            self.pad = int(side["pad_id"])
            self.primes = np.asarray(side["primes"], dtype=np.int64).reshape(
                len(e.layers), e.max_ngram - 1, e.heads
            )
            self.offsets = np.asarray(side["offsets"], dtype=np.int64).reshape(len(e.layers), e.cols)
            if any(not isinstance(v, str) for row in side["multipliers"] for v in row):
                raise ValueError("multipliers must be decimal strings (a JSON number may have been rounded)")
            self.mult = np.array([[int(v, 10) for v in row] for row in side["multipliers"]], dtype=np.int64)
            geometry = [side["layer_ids"], side["max_ngram_size"], side["n_heads"], side["head_dim"]]
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise RuntimeModelError(f"{where}: not an engram sidecar ({type(exc).__name__}: {exc})") from None
        if geometry != [list(e.layers), e.max_ngram, e.heads, e.head_dim]:
            raise RuntimeModelError(f"{where}: layer_ids / max_ngram_size / n_heads / head_dim {geometry} do not "
                                    f"match config.json's {[list(e.layers), e.max_ngram, e.heads, e.head_dim]}")  # fmt: skip
        if self.mult.shape != (len(e.layers), e.max_ngram) or self.token_map.shape != (vocab,):
            raise RuntimeModelError(f"{where}: multipliers {list(self.mult.shape)} / token_map of {self.token_map.size}"
                                    f" (expected [{len(e.layers)}, {e.max_ngram}] / {vocab} ids)")  # fmt: skip
        top = max(int(self.token_map.max(initial=0)), self.pad)
        if (
            self.token_map.min(initial=0) < 0
            or (self.primes <= 0).any()
            or int(self.mult.max()) > (2**63 - 1) // max(top, 1)
        ):
            raise RuntimeModelError(
                f"{where}: negative ids, non-positive primes or multipliers that overflow int64"
            )
        self.n, self.heads = e.max_ngram, e.heads

    def compress(self, ids: np.ndarray) -> np.ndarray:
        return self.token_map[ids]

    def rows(self, history: np.ndarray, positions: np.ndarray, table: int) -> np.ndarray:
        """``[N, cols]`` row ids of table ``table`` at ``positions`` (``history``: compressed ids by position)."""
        at = positions[:, None] - np.arange(self.n)[None, :]  # [N, n]: the position s back
        tokens = np.where(at >= 0, history[np.maximum(at, 0)], self.pad)
        terms = tokens * self.mult[table][None, :]
        rolling, out = terms[:, 0], []
        for i in range(1, self.n):
            rolling = rolling ^ terms[:, i]
            out.append(rolling[:, None] % self.primes[table, i - 1][None, :])
        return np.concatenate(out, axis=1) + self.offsets[table][None, :]


def load_engram_hash(model_dir: Path, e: EngramArgs, vocab: int) -> EngramHash:
    """The sidecar of the model folder, checked against the config's engram geometry (one line when absent)."""
    path = model_dir / V41_ENGRAM_FILE
    if not path.is_file():
        raise RuntimeModelError(f"{model_dir}: engram layers {list(e.layers)} need {V41_ENGRAM_FILE} beside "
                                "config.json (colibri's c/tools/prepare_dsv41.py writes it)")  # fmt: skip
    return EngramHash(load_json_object(path), e, vocab, str(path))


class Engram:
    """One engram layer: table ``engram.embed [rows, head_dim]``, ``engram.wkv [H (hc + 1), cols head_dim]``
    (``formats/families.v41_shapes``), ``q_weight`` / ``k_weight [hc, H]``; ``state.hash`` / ``state.history``
    the model's hash tables and compressed ids."""

    def __init__(self, ckpt: Checkpoint, layer: int, e: EngramArgs, hidden: int, hc: int, eps: float, state: Any):
        p, H, n = f"layers.{layer}.engram", hidden, hc
        self.table_index, self.pub, self.H, self.hc, self.eps = e.layers.index(layer), state, H, n, eps
        name = sanitize(f"{p}.embed.weight")
        if name not in ckpt.infos:
            raise RuntimeModelError(f"{ckpt.dir}: missing tensor {name}")
        res = ckpt.infos[name][2]
        self.table = Embedding(ckpt, name, (res.logical_shape or res.shape)[0], e.head_dim)
        self.wkv = Linear(ckpt.resident(sanitize(f"{p}.wkv.weight"), H * (n + 1), e.cols * e.head_dim))
        self.weight = ckpt.array(sanitize(f"{p}.q_weight"), (n, H)) * ckpt.array(
            sanitize(f"{p}.k_weight"), (n, H)
        )
        self.enabled = True  # False: the layer skips its engram (a mutation switch for tests)

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.wkv.nbytes + self.weight.nbytes

    def __call__(self, streams: np.ndarray, positions: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return streams
        ids = self.pub.hash.rows(self.pub.history, positions, self.table_index)
        if (ids < 0).any() or (ids >= self.table.V).any():
            raise RuntimeModelError(
                f"engram table {self.table_index}: a hash row past its {self.table.V} rows"
            )
        N = streams.shape[0]
        kv = self.wkv(self.table(ids.reshape(-1)).reshape(N, -1))
        key, value = kv[:, : self.hc * self.H].reshape(N, self.hc, self.H), kv[:, self.hc * self.H :]
        ms = np.mean(np.square(streams), axis=-1, dtype=F32) + F32(self.eps)
        mk = np.mean(np.square(key), axis=-1, dtype=F32) + F32(self.eps)
        dot = np.sum(streams * self.weight * key, axis=-1, dtype=F32) / np.sqrt(ms * mk) * F32(self.H**-0.5)
        root = np.sqrt(np.maximum(np.abs(dot), F32(1e-6)))
        gate = sigmoid(np.where(dot < 0, -root, root))  # the signed square root
        return (streams + gate[..., None] * value[:, None, :]).astype(F32)
