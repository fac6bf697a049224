"""A tiny DeepSeek-V4.1-Flash checkpoint in the published layout (numpy, random weights), a conversion source.

The structure is colibri's (``JustVugg/colibri`` ``c/tools/make_dsv41_tiny.py``, "the released structure at toy
dimensions", and ``c/tools/dsv41_ref.py``'s quantizers; read for facts only, docs/FORMATS.md "DeepSeek V4.1
Flash"): released names without a ``model.`` root (``embed.weight``, ``layers.{L}.attn.wq_a.weight``, ``mtp.{S}.``,
``vision.``, ``aligner.``), dense projections FP8 e4m3 with one UE8M0 byte per 32x32 tile (``<b>.scale``
``[O/32, I/32]``), routed experts FP4 e2m1 pairs (``<b>.weight`` I8 ``[O, I/2]``, low nibble = even column) with one
UE8M0 byte per 32 inputs (``<b>.scale`` ``[O, I/32]``), the engram tables FP8 with one UE8M0 byte per row group of
32 (``engram.embed.scale [rows, head_dim/32]``), hyper-connections / sinks / the routing bias F32, norms, the
compressor and indexer key path, the DSpark heads and the vision tower BF16. The config is the released shape:
the text model under ``text_config`` (short names and the released spellings both), ``quantization_config``
``{quant_method: fp8, weight_block_size: [32, 32], scale_fmt: ue8m0, expert_dtype: fp4}``. No hyper head: V4.1
collapses the streams with the last block's mix (colibri ``c/deepseek_v41.c`` ``forward_full``). ``engram_sidecar``
gives colibri's ``dsv41_engram.json`` for a config (the hash tables its ``tools/prepare_dsv41.py`` computes beside
the release, here with a synthetic compressed token map); ``write`` leaves it out, as the release does.

No transformers class exists for it: the reference is ``dsv41_reference.py`` (``make_deepseek_v41.py`` builds the
oracle fixture ``oracles/deepseek_v41`` through this file's ``tensors`` with its own initialisation).

    python oracles/make_dsv41_tiny.py OUT_FOLDER
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

F32 = np.float32
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu
SEED = 4101
TILE = 32  # FP8 tiles are TILE x TILE; FP4 / engram scales cover TILE inputs of one row
E2M1_LEVELS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F32)


def config_text() -> dict:
    """The text model's keys (colibri's short names): toy shapes, every quantized dimension a multiple of 32."""
    return dict(
        vocab_size=128, dim=64, moe_inter_dim=64, n_layers=4, n_heads=2, head_dim=64, rope_head_dim=16,
        q_lora_rank=64, o_lora_rank=32, o_groups=2, norm_eps=1e-6, n_routed_experts=4, n_shared_experts=1,
        n_activated_experts=2, score_func="sqrtsoftplus", route_scale=1.5, swiglu_limit=10.0, window_size=8,
        compress_ratios=[0, 2, 1, 0], kv_source_layers=[1, 2], index_source_layers=[1, 2],
        compress_rope_theta=40000.0, original_seq_len=32, rope_theta=10000.0, rope_factor=16.0,
        index_n_heads=2, index_head_dim=32, index_topk=4, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
        engram_layer_ids=[1, 2], engram_max_ngram_size=3, engram_n_heads=2, engram_head_dim=32,
        engram_vocab_size=37, engram_pad_id=2, engram_compressed_vocab_size=64, n_mtp_layers=2, dspark_block_size=3, dspark_noise_token_id=7,
        dspark_target_layer_ids=[2, 3], dspark_markov_rank=32, dspark_n_routed_experts=2,
        dspark_n_activated_experts=1, vision_n_layers=1, vision_dim=32, vision_n_heads=2, vision_inter_dim=64,
        vision_patch_size=4, vision_downsample_ratio=2, image_token_id=127,
    )  # fmt: skip


def engram_primes(c: dict) -> list[list[list[int]]]:
    """Each engram table's bucket primes ``[table][n-gram order - 1][head]``: the first primes above
    ``engram_vocab_size - 1`` not used before, in table, order, head order (colibri's ``engram_layout``)."""
    seen: set[int] = set()
    out = []
    for _ in c["engram_layer_ids"]:
        table = []
        for _ in range(c["engram_max_ngram_size"] - 1):
            row, candidate = [], c["engram_vocab_size"] - 1
            for _ in range(c["engram_n_heads"]):
                candidate += 1
                while candidate in seen or any(candidate % d == 0 for d in range(2, int(candidate**0.5) + 1)):
                    candidate += 1
                seen.add(candidate)
                row.append(candidate)
            table.append(row)
        out.append(table)
    return out


def engram_rows(c: dict) -> list[int]:
    """Rows of each engram table: the sum of its bucket primes (``engram_num_embeddings``)."""
    return [sum(sum(row) for row in table) for table in engram_primes(c)]


def engram_sidecar(c: dict, seed: int = SEED) -> dict:
    """colibri's ``dsv41_engram.json`` for this config: primes, row offsets (the running sum of the flattened
    primes), the per-table multipliers (the vendor's ``np.random.default_rng(10007 * layer_id)`` odd int64s below
    ``int64 max / compressed vocab``, as decimal strings), a synthetic compressed token map (a fixed shuffle of the
    ids modulo ``engram_compressed_vocab_size``) and the pad id through it."""
    primes, cv = engram_primes(c), c["engram_compressed_vocab_size"]
    offsets = []
    for table in primes:
        flat = [p for row in table for p in row]
        offsets.append([int(v) for v in np.cumsum([0, *flat[:-1]])])
    high = max(1, (np.iinfo(np.int64).max // cv) // 2)
    multipliers = [
        [str(int(v) * 2 + 1) for v in np.random.default_rng(10007 * layer).integers(
            0, high, size=(c["engram_max_ngram_size"],), dtype=np.int64)]
        for layer in c["engram_layer_ids"]
    ]  # fmt: skip
    token_map = [int(v) % cv for v in np.random.default_rng(seed + 1).permutation(c["vocab_size"])]
    return {
        "max_ngram_size": c["engram_max_ngram_size"], "n_heads": c["engram_n_heads"],
        "head_dim": c["engram_head_dim"], "pad_id": token_map[c["engram_pad_id"]],
        "layer_ids": c["engram_layer_ids"], "num_embeddings": engram_rows(c), "primes": primes,
        "offsets": offsets, "multipliers": multipliers, "token_map": token_map,
    }  # fmt: skip


def ue8m0(amax: np.ndarray, top: float) -> np.ndarray:
    """The exponent ``k`` of the smallest power of two with ``amax / 2^k <= top`` (0 for an all-zero block)."""
    safe = np.where(amax > 0, amax, 1.0).astype(F32)
    return np.where(amax > 0, np.ceil(np.log2(safe / F32(top))), 0).astype(np.int32)


def fp8_tiles(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float ``[O, I]`` -> e4m3 codes ``[O, I]`` and E8M0 ``[O/32, I/32]`` (one byte per 32x32 tile)."""
    O, I = w.shape
    tiles = w.reshape(O // TILE, TILE, I // TILE, TILE)
    k = ue8m0(np.abs(tiles).max(axis=(1, 3)), 448.0)
    codes = (tiles / np.ldexp(F32(1), k)[:, None, :, None]).astype(E4M3).reshape(O, I)
    return codes, (k + 127).astype(np.uint8).view(E8M0)


def fp8_rowgroups(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float ``[O, I]`` -> e4m3 codes ``[O, I]`` and E8M0 ``[O, I/32]`` (the engram tables)."""
    O, I = w.shape
    groups = w.reshape(O, I // TILE, TILE)
    k = ue8m0(np.abs(groups).max(axis=2), 448.0)
    codes = (groups / np.ldexp(F32(1), k)[..., None]).astype(E4M3).reshape(O, I)
    return codes, (k + 127).astype(np.uint8).view(E8M0)


def fp4_rowgroups(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float ``[O, I]`` -> e2m1 pairs I8 ``[O, I/2]`` (low nibble = even column) and E8M0 ``[O, I/32]``."""
    O, I = w.shape
    groups = w.reshape(O, I // TILE, TILE)
    k = ue8m0(np.abs(groups).max(axis=2), 6.0)
    scaled = groups / np.ldexp(F32(1), k)[..., None]
    mids = (E2M1_LEVELS[1:] + E2M1_LEVELS[:-1]) / 2
    nib = np.searchsorted(mids, np.abs(scaled), side="left").astype(np.uint8) | (np.signbit(scaled) << 3)
    nib = nib.reshape(O, I).astype(np.uint8)
    return (nib[:, 0::2] | (nib[:, 1::2] << 4)).view(np.int8), (k + 127).astype(np.uint8).view(E8M0)


class _Writer:
    """Collects the tensors, each in its published dtype. ``draw(rng, name, shape, scale, kind)``, when given,
    chooses the float values (``kind``: ``weight``, ``norm`` or ``small``; ``scale`` this file's default std)."""

    def __init__(self, seed: int = SEED, draw=None) -> None:
        self.rng = np.random.default_rng(seed)
        self.draw = draw
        self.t: dict[str, np.ndarray] = {}

    def value(self, name: str, shape: tuple[int, ...], scale: float = 0.02, kind: str = "weight") -> np.ndarray:
        if self.draw is not None:
            return np.asarray(self.draw(self.rng, name, shape, scale, kind), dtype=F32)
        w = (self.rng.standard_normal(shape) * scale).astype(F32)
        return (1 + w).astype(F32) if kind == "norm" else w

    def bf16(self, name: str, *shape: int, scale: float = 0.02) -> None:
        self.t[name] = self.value(name, shape, scale).astype(BF16)

    def norm(self, name: str, n: int) -> None:
        self.t[name] = self.value(name, (n,), 0.01, "norm").astype(BF16)

    def f32(self, name: str, *shape: int, scale: float = 0.1) -> None:
        self.t[name] = self.value(name, shape, scale, "small")

    def fp8(self, base: str, O: int, I: int) -> None:
        self.t[base + ".weight"], self.t[base + ".scale"] = fp8_tiles(self.value(base + ".weight", (O, I)))

    def fp4(self, base: str, O: int, I: int) -> None:
        self.t[base + ".weight"], self.t[base + ".scale"] = fp4_rowgroups(
            self.value(base + ".weight", (O, I), 0.05)
        )


def _block(w: _Writer, c: dict, p: str, experts: int) -> None:
    """What a backbone layer and a DSpark stage share: norms, hyper-connections, window attention, the MoE."""
    dim, hc, nh, hd = c["dim"], c["hc_mult"], c["n_heads"], c["head_dim"]
    for which in ("attn_norm", "ffn_norm"):
        w.norm(f"{p}{which}.weight", dim)
    for which in ("attn", "ffn"):
        w.f32(f"{p}hc_{which}_fn", (2 + hc) * hc, hc * dim, scale=0.01)
        w.f32(f"{p}hc_{which}_base", (2 + hc) * hc)
        w.f32(f"{p}hc_{which}_scale", 3)
    w.f32(p + "attn.attn_sink", nh)
    w.fp8(p + "attn.wq_a", c["q_lora_rank"], dim)
    w.norm(p + "attn.q_norm.weight", c["q_lora_rank"])
    w.fp8(p + "attn.wq_b", nh * hd, c["q_lora_rank"])
    w.fp8(p + "attn.wkv", hd, dim)
    w.norm(p + "attn.kv_norm.weight", hd)
    w.fp8(p + "attn.wo_a", c["o_groups"] * c["o_lora_rank"], nh * hd // c["o_groups"])
    w.fp8(p + "attn.wo_b", dim, c["o_groups"] * c["o_lora_rank"])
    w.bf16(p + "ffn.gate.weight", experts, dim, scale=0.05)
    w.f32(p + "ffn.gate.bias", experts)
    inter = c["moe_inter_dim"]
    for e in range(experts):
        for leaf, (O, I) in (("w1", (inter, dim)), ("w3", (inter, dim)), ("w2", (dim, inter))):
            w.fp4(f"{p}ffn.experts.{e}.{leaf}", O, I)
    for leaf, (O, I) in (("w1", (inter, dim)), ("w3", (inter, dim)), ("w2", (dim, inter))):
        w.fp8(f"{p}ffn.shared_experts.{leaf}", O, I)


def _layer_extras(w: _Writer, c: dict, layer: int, rows: list[int]) -> None:
    """A backbone layer's own parts: the compressor (KV source layers), the indexer, the engram."""
    p, dim, hd, hc = f"layers.{layer}.", c["dim"], c["head_dim"], c["hc_mult"]
    if layer in c["kv_source_layers"]:
        w.bf16(p + "attn.compressor.wkv.weight", hd, dim)
        w.norm(p + "attn.compressor.norm.weight", hd)
        if c["compress_ratios"][layer] > 1:
            w.bf16(p + "attn.compressor.wgate.weight", hd, dim)
    if layer in c["index_source_layers"]:
        w.fp8(p + "attn.indexer.wq_b", c["index_n_heads"] * c["index_head_dim"], c["q_lora_rank"])
        w.bf16(p + "attn.indexer.weights_proj.weight", c["index_n_heads"], dim)
        if layer in c["kv_source_layers"]:
            w.bf16(p + "attn.indexer.wk.weight", c["index_head_dim"], hd)
            w.norm(p + "attn.indexer.k_norm.weight", c["index_head_dim"])
    if layer in c["engram_layer_ids"]:
        table = w.value(p + "engram.embed.weight", (rows[c["engram_layer_ids"].index(layer)], c["engram_head_dim"]), 0.05)
        w.t[p + "engram.embed.weight"], w.t[p + "engram.embed.scale"] = fp8_rowgroups(table)
        cols = (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"] * c["engram_head_dim"]
        w.fp8(p + "engram.wkv", dim * (hc + 1), cols)
        w.f32(p + "engram.q_weight", hc, dim)
        w.f32(p + "engram.k_weight", hc, dim)


def _dspark(w: _Writer, c: dict) -> None:
    """The DSpark draft stages ``mtp.{S}.``: the backbone block without compressor / indexer, its own expert count,
    ``main_proj`` / ``main_norm`` on the first stage, the final norm and the Markov / confidence heads on the last."""
    dim, rank, last = c["dim"], c["dspark_markov_rank"], c["n_mtp_layers"] - 1
    for s in range(c["n_mtp_layers"]):
        p = f"mtp.{s}."
        _block(w, c, p, c["dspark_n_routed_experts"])
        if s == 0:
            w.fp8(p + "main_proj", dim, dim * len(c["dspark_target_layer_ids"]))
            w.norm(p + "main_norm.weight", dim)
        if s == last:
            w.norm(p + "norm.weight", dim)
            w.bf16(p + "markov_head.embed.weight", c["vocab_size"], rank)
            w.bf16(p + "markov_head.head.weight", c["vocab_size"], rank)
            w.bf16(p + "confidence_head.proj.weight", 1, dim + rank, scale=0.05)


def _vision(w: _Writer, c: dict) -> None:
    """The vision tower (a ViT) and its aligner into ``dim``, with the image marker rows: all BF16."""
    vd, inter, dim, r = c["vision_dim"], c["vision_inter_dim"], c["dim"], c["vision_downsample_ratio"]
    w.bf16("vision.patch_embed.proj.weight", vd, 3 * c["vision_patch_size"] ** 2)
    w.bf16("vision.patch_embed.proj.bias", vd)
    for i in range(c["vision_n_layers"]):
        p = f"vision.blocks.{i}."
        w.norm(p + "norm1.weight", vd)
        w.norm(p + "norm2.weight", vd)
        w.bf16(p + "attn.wqkv.weight", 3 * vd, vd)
        w.bf16(p + "attn.wqkv.bias", 3 * vd)
        w.bf16(p + "attn.wo.weight", vd, vd)
        w.bf16(p + "attn.wo.bias", vd)
        w.bf16(p + "mlp.w1.weight", 2 * inter, vd)
        w.bf16(p + "mlp.w2.weight", vd, inter)
    w.norm("vision.norm.weight", vd)
    w.bf16("aligner.w1.weight", dim, vd * r * r)
    w.bf16("aligner.w1.bias", dim)
    w.bf16("aligner.w2.weight", dim, dim)
    w.bf16("aligner.w2.bias", dim)
    for name in ("image_start", "image_end", "image_newline"):
        w.bf16(name, dim, scale=0.05)


def tensors(c: dict | None = None, seed: int = SEED, draw=None) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint by its published name, in its published dtype (``draw``: see ``_Writer``)."""
    c = c or config_text()
    w, rows = _Writer(seed, draw), engram_rows(c)
    w.bf16("embed.weight", c["vocab_size"], c["dim"], scale=0.05)
    w.bf16("head.weight", c["vocab_size"], c["dim"], scale=0.05)
    w.norm("norm.weight", c["dim"])
    for layer in range(c["n_layers"]):
        _block(w, c, f"layers.{layer}.", c["n_routed_experts"])
        _layer_extras(w, c, layer, rows)
    _dspark(w, c)
    _vision(w, c)
    return w.t


def config(c: dict | None = None, max_positions: int = 256) -> dict:
    """``config.json`` in the released shape: the text model under ``text_config``, the vision tower's own
    section, the FP8 32x32 UE8M0 / FP4-expert ``quantization_config``."""
    c = c or config_text()
    text = dict(
        c, model_type="deepseek_v41_text", hidden_size=c["dim"], num_hidden_layers=c["n_layers"],
        num_attention_heads=c["n_heads"], moe_intermediate_size=c["moe_inter_dim"],
        num_experts_per_tok=c["n_activated_experts"], max_position_embeddings=max_positions,
        engram_num_embeddings=engram_rows(c), sliding_window=c["window_size"],
        kv_source_layer_ids=c["kv_source_layers"], index_source_layer_ids=c["index_source_layers"],
        engram_pad_token_id=c["engram_pad_id"],
    )  # fmt: skip
    vision = {
        "model_type": "deepseek_v41_vision", "num_hidden_layers": c["vision_n_layers"],
        "hidden_size": c["vision_dim"], "num_attention_heads": c["vision_n_heads"],
        "intermediate_size": c["vision_inter_dim"], "patch_size": c["vision_patch_size"],
        "downsample_ratio": c["vision_downsample_ratio"],
    }  # fmt: skip
    return {
        "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                                "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
        "vision_config": vision, "image_token_id": c["image_token_id"], "text_config": text,
    }  # fmt: skip


def write(folder: Path, c: dict | None = None) -> dict[str, np.ndarray]:
    """Write the checkpoint as published (one ``model.safetensors`` + ``config.json``; no engram sidecar: colibri's
    ``tools/prepare_dsv41.py`` adds it, ``engram_sidecar`` here) into ``folder``; return its tensors."""
    from colitools.formats.safetensors_io import write_safetensors

    folder.mkdir(parents=True, exist_ok=True)
    out = tensors(c)
    write_safetensors(folder / "model.safetensors", out)
    (folder / "config.json").write_text(json.dumps(config(c), indent=2) + "\n")
    return out


if __name__ == "__main__":
    written = write(Path(sys.argv[1]))
    print(f"{len(written)} tensors, {sum(t.nbytes for t in written.values())} bytes -> {sys.argv[1]}")
