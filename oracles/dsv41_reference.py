"""A torch reference of DeepSeek V4.1 Flash (no transformers model exists), written from the architecture (issue 29:
the description colibri's ``c/deepseek_v41.c`` header and ``c/tools/dsv41_ref.py`` give of the vendor's
``inference/model.py``, read for facts only), not from colitools' runtime. In the weights' dtype
(``make_deepseek_v41.py`` passes float64 copies of the float32 source values).

Stateful like the vendor's model: ``forward(ids)`` runs one chunk (the whole prompt on a fresh model, then one token
per call) and keeps the per-layer caches; ``reset()`` empties them. The chunking matters for this model, not only
for speed: the index keys a layer scores against are the ones published last (the vendor's module-level
``shared_attn``), and a compressing layer whose group is still filling on a decode step does not republish, so
a decode step can read another layer's keys where a prefill of the same tokens reads its own. Greedy decoding is
prefill + one token per call; teacher forcing is one prefill of the whole sequence.

What one layer does (``hc_mult`` residual streams ``h [N, hc, H]``):

* engram layers first: the n-gram hash rows of the position (``EngramHash``, the sidecar ``dsv41_engram.json``)
  projected by ``engram.wkv`` into one key per stream and one value; ``h_i += sigmoid(ssqrt(<h_i * q_w * k_w,
  key_i> / (rms(h_i) rms(key_i) sqrt(H)))) * value`` (``ssqrt`` the signed square root of ``max(|d|, 1e-6)``);
* hyper-connections as V4 (Sinkhorn ``comb``, ``post``), except that a sublayer's input collapses the streams with
  the ``pre`` the *previous* sublayer computed (the attention with the previous layer's FFN's, the first one with
  stream 0), and the output collapses them with the last FFN's ``pre`` (no hyper head);
* attention: ``q = wq_b(RMSNorm(wq_a x))`` (no per-head norm), one K = V head ``RMSNorm(wkv x)``, interleaved RoPE
  on the trailing ``rope_head_dim`` channels (``compress_rope_theta`` with YaRN on compressing layers when
  ``max_position_embeddings > original_seq_len``, ``rope_theta`` without on window-only layers); keys = the last
  ``sliding_window`` positions plus, on compressing layers, the compressed entries the indexer selected; per-head
  sinks; the output's rope slice rotated back; ``wo_b(concat_g wo_a_g(out_g))``;
* compressor on ``kv_source_layers`` only (``RMSNorm(sum_j softmax_j(wgate x_j) wkv x_j)`` over groups of
  ``ratio`` positions, ratio 1: ``RMSNorm(wkv x)``), roped at the group's first position; the other compressing
  layers read the last source's entries;
* indexer on ``index_source_layers``: ``sum_h relu(q_h . k_j) w_h``, ``q = indexer.wq_b(q latent)`` roped at the
  query, ``w = weights_proj(x) / sqrt(d n)``, keys ``RMSNorm(indexer.wk(latent))`` roped at the group (computed on
  layers that are KV sources too, and published); entry ``j`` visible to position ``p`` iff ``j < (p+1)//ratio``;
  the top ``index_topk`` finite scores; the candidate source layer also keeps ``candidate_topk_blocks`` blocks of
  ``candidate_block_size`` entries (the newest block always) and the later index layers score only those
  (two-level top-k); the other compressing layers reuse the last index source's selection;
* MoE: ``sqrt(softplus(gate x / gate_temp))``, top-k of score + ``gate.bias``, weights the scores at the picks
  renormalised (``norm_topk_prob``) times ``route_scale``, clamped SwiGLU experts plus the shared expert.

``V41Reference(text, weights, engram, mutations)``: ``weights`` by the checkpoint's names (float, decoded);
``engram`` the sidecar's dict; ``mutations`` deliberate bugs (``MUTATIONS``) for the mutation check.
``router_margins`` / ``indexer_margins`` collect every routing / selection boundary; ``ambiguous`` counts
selections that would depend on tie-breaking among masked entries (a fixture must have none).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F

MUTATIONS = {
    "engram_off": "engram layers skipped",
    "engram_hash_shifted": "n-gram hash ends at the previous token (the current one left out)",
    "engram_hash_sum": "n-gram hash adds the multiplied ids instead of XOR-ing them",
    "engram_pad_raw": "hash pad id not mapped through the compressed token map",
    "engram_gate_plain": "engram gate sigmoid(d) without the signed square root",
    "kv_share_off": "a compressing layer without a compressor of its own attends no compressed entries",
    "topk_share_off": "a compressing layer without an indexer of its own attends every visible entry",
    "yarn_on_window": "YaRN (and compress_rope_theta) on the window-only layers too",
    "yarn_off": "no YaRN on the compressing layers",
    "published_keys_own": "each indexer scores its own KV source's keys (not the last published ones)",
    "candidates_off": "two-level top-k off: the later index layers ignore the candidate blocks",
    "indexer_off": "every visible compressed entry attended",
    "hc_pre_same_site": "each sublayer collapses with its own pre (V4's rule); the output with the mean",
    "compressor_gate_off": "compressor pools by the plain mean (softmax gate dropped)",
    "inverse_rope_off": "attention output's rope slice not rotated back",
    "sinks_off": "attention sinks dropped",
    "q_head_norm": "V4's per-head RMSNorm on the queries",
    "bias_off": "routing bias ignored in the expert choice",
    "renorm_off": "routing weights not renormalised",
    "shared_off": "shared expert dropped",
    "swiglu_clamp_off": "SwiGLU clamp removed",
    "eps_x10": "RMSNorm eps x10",
}


def rmsnorm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def rope_freqs(dim: int, theta: float, yarn: Mapping | None) -> torch.Tensor:
    """``[dim/2]`` angular frequencies; ``yarn`` {factor, original, beta_fast, beta_slow} blends the low ones down."""
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if yarn is None:
        return freqs

    def correction(rotations: float) -> float:
        return dim * math.log(yarn["original"] / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction(yarn["beta_fast"])), 0)
    high = min(math.ceil(correction(yarn["beta_slow"])), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return freqs / yarn["factor"] * ramp + freqs * (1 - ramp)


def rotate_tail(x: torch.Tensor, pos: torch.Tensor, freqs: torch.Tensor, rd: int, inverse: bool = False):
    """Rotate the trailing ``rd`` channels of ``x [N, ..., D]`` as pairs ``(2i, 2i+1)`` at positions ``pos [N]``."""
    ang = pos.to(torch.float64)[:, None] * freqs[None, :]  # [N, rd/2]
    cos, sin = torch.cos(ang), torch.sin(ang) * (-1 if inverse else 1)
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [rd // 2]
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    out = x.clone()
    a, b = x[..., -rd::2], x[..., -rd + 1 :: 2]
    out[..., -rd::2] = a * cos - b * sin
    out[..., -rd + 1 :: 2] = a * sin + b * cos
    return out


class EngramHash:
    """The n-gram hash of the sidecar (colibri ``dsv41_engram.json``: ``token_map``, ``primes``, ``offsets``,
    decimal-string ``multipliers``, ``pad_id`` already compressed): for position ``p`` and table ``t``, the ids
    ``c_s`` of positions ``p - s`` (``s < max_ngram``; the pad from the first missing one on), ``r = c_0 m_0``
    then ``r ^= c_i m_i`` and one row per head ``r mod prime[t][i-1][h] + offset[t][col]``."""

    def __init__(self, sidecar: Mapping, mutations: set[str]):
        self.token_map = [int(v) for v in sidecar["token_map"]]
        self.primes = sidecar["primes"]
        self.offsets = sidecar["offsets"]
        self.mult = [[int(v) for v in row] for row in sidecar["multipliers"]]
        self.n, self.heads = sidecar["max_ngram_size"], sidecar["n_heads"]
        self.pad = int(sidecar["pad_id"])
        self.m = mutations

    def compress(self, token: int) -> int:
        return self.token_map[token]

    def ids(self, history: list[int], pos: int, table: int, raw_pad: int) -> list[int]:
        shift0 = 1 if "engram_hash_shifted" in self.m else 0
        pad = raw_pad if "engram_pad_raw" in self.m else self.pad
        tokens, blocked = [], False
        for s in range(self.n):
            at = pos - s - shift0
            blocked = blocked or at < 0
            tokens.append(pad if blocked else history[at])
        rolling = tokens[0] * self.mult[table][0]
        out = []
        for i in range(1, self.n):
            term = tokens[i] * self.mult[table][i]
            rolling = rolling + term if "engram_hash_sum" in self.m else rolling ^ term
            for h in range(self.heads):
                col = (i - 1) * self.heads + h
                out.append(rolling % self.primes[table][i - 1][h] + self.offsets[table][col])
        return out


class V41Reference:
    def __init__(self, text: Mapping, weights: Mapping[str, torch.Tensor], engram: Mapping,
                 mutations: Iterable[str] = ()):  # fmt: skip
        self.c, self.w, self.m = text, weights, set(mutations)
        unknown = self.m - set(MUTATIONS)
        assert not unknown, unknown
        c = text
        self.L, self.H, self.hc = c["num_hidden_layers"], c["hidden_size"], c["hc_mult"]
        self.nh, self.D, self.rd = c["num_attention_heads"], c["head_dim"], c["rope_head_dim"]
        self.eps = c["rms_norm_eps"] * (10 if "eps_x10" in self.m else 1)
        self.ratios = c["compress_ratios"]
        self.kv_src, self.ix_src = set(c["kv_source_layer_ids"]), set(c["index_source_layer_ids"])
        self.cand = c.get("candidate_source_layer_id", -1)
        self.hash = EngramHash(engram, self.m)
        self.engram_layers = list(c["engram_layer_ids"])
        yarn = None
        if 0 < c["original_seq_len"] < c["max_position_embeddings"]:
            yarn = {"factor": c["rope_factor"], "original": c["original_seq_len"], "beta_fast": c["beta_fast"],
                    "beta_slow": c["beta_slow"]}  # fmt: skip
        self.f_compress = rope_freqs(
            self.rd, c["compress_rope_theta"], None if "yarn_off" in self.m else yarn
        )
        self.f_window = (
            self.f_compress if "yarn_on_window" in self.m else rope_freqs(self.rd, c["rope_theta"], None)
        )
        self.router_margins: list[float] = []
        self.indexer_margins: list[float] = []
        self.ambiguous = 0
        self.reset()

    def t(self, name: str) -> torch.Tensor:
        return self.w[name]

    def reset(self) -> None:
        self.pos = 0
        self.history: list[int] = []
        self.kv = {i: [] for i in range(self.L)}  # every position's roped K = V, per layer
        self.entries = {i: {} for i in self.kv_src}  # group -> roped compressed entry
        self.keys = {i: {} for i in self.kv_src}  # group -> roped index key
        self.pending = {i: {} for i in self.kv_src}  # slot -> (kv, gate) of the group filling
        self.kv_owner = self.key_owner = None  # the last KV source / the last publisher of index keys
        self.topk: list[list[int]] | None = None  # the last index source's selection per row
        self.candidates: list[torch.Tensor] | None = None  # the candidate source's kept entries per row

    # ------------------------------------------------------------------------------------------ pieces
    def freqs(self, layer: int) -> torch.Tensor:
        return self.f_compress if self.ratios[layer] else self.f_window

    def hc_weights(self, h: torch.Tensor, site: str, layer: int):
        p = f"layers.{layer}.hc_{site}_"
        n, N = self.hc, h.shape[0]
        flat = h.reshape(N, -1)
        mix = (flat @ self.t(p + "fn").T) * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + self.eps)
        s, b, e = self.t(p + "scale"), self.t(p + "base"), self.c["hc_eps"]
        pre = torch.sigmoid(mix[:, :n] * s[0] + b[:n]) + e
        post = 2 * torch.sigmoid(mix[:, n : 2 * n] * s[1] + b[n : 2 * n])
        comb = torch.softmax((mix[:, 2 * n :] * s[2] + b[2 * n :]).reshape(N, n, n), dim=-1) + e
        comb = comb / (comb.sum(-2, keepdim=True) + e)
        for _ in range(self.c["hc_sinkhorn_iters"] - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + e)
            comb = comb / (comb.sum(-2, keepdim=True) + e)
        return pre, post, comb

    @staticmethod
    def hc_post(h, out, post, comb):
        """``h'_k = post_k out + sum_j comb[j, k] h_j``."""
        return post[..., None] * out[:, None, :] + torch.einsum("njk,njd->nkd", comb, h)

    def engram(self, layer: int, h: torch.Tensor, positions: list[int]) -> torch.Tensor:
        p, table = f"layers.{layer}.engram.", self.engram_layers.index(layer)
        ids = [self.hash.ids(self.history, q, table, self.c["engram_pad_token_id"]) for q in positions]
        rows = self.t(p + "embed.weight")[torch.tensor(ids)].reshape(len(ids), -1)
        kv = rows @ self.t(p + "wkv.weight").T
        key, value = kv[:, : self.hc * self.H].reshape(-1, self.hc, self.H), kv[:, self.hc * self.H :]
        weight = self.t(p + "q_weight") * self.t(p + "k_weight")
        rstd = torch.rsqrt(h.pow(2).mean(-1) + self.eps) * torch.rsqrt(key.pow(2).mean(-1) + self.eps)
        dot = (h * weight * key).sum(-1) * rstd * self.H**-0.5
        if "engram_gate_plain" in self.m:
            gate = torch.sigmoid(dot)
        else:
            gate = torch.sigmoid(torch.sign(dot) * dot.abs().clamp_min(1e-6).sqrt())
        return h + gate[..., None] * value[:, None, :]

    # ------------------------------------------------------------------------------------------ attention
    def compressor(self, layer: int, x: torch.Tensor, positions: list[int]) -> list[tuple[int, torch.Tensor]]:
        """The (group, pre-RoPE entry) pairs this chunk completes."""
        p, ratio = f"layers.{layer}.attn.compressor.", self.ratios[layer]
        kv = x @ self.t(p + "wkv.weight").T
        out = []
        if ratio == 1:
            return [(q, rmsnorm(kv[i], self.t(p + "norm.weight"), self.eps)) for i, q in enumerate(positions)]
        gate = x @ self.t(p + "wgate.weight").T
        pend = self.pending[layer]
        for i, q in enumerate(positions):
            pend[q % ratio] = (kv[i], gate[i])
            if (q + 1) % ratio:
                continue
            kvs = torch.stack([pend[s][0] for s in range(ratio)])
            gates = torch.stack([pend[s][1] for s in range(ratio)])
            w = torch.full_like(gates, 1 / ratio) if "compressor_gate_off" in self.m else gates.softmax(0)
            out.append((q // ratio, rmsnorm((kvs * w).sum(0), self.t(p + "norm.weight"), self.eps)))
        return out

    def select_blocks(self, score: torch.Tensor, lens: int) -> torch.Tensor:
        """Candidate blocks of one row ``score [T]`` (``-inf`` past ``lens``): the newest block and the best others."""
        size, want = self.c["candidate_block_size"], self.c["candidate_topk_blocks"]
        T = score.shape[0]
        nb = -(-T // size)
        best = torch.full((nb,), -math.inf, dtype=score.dtype)
        for b in range(nb):
            best[b] = score[b * size : (b + 1) * size].max()
        last = (lens - 1) // size
        if 0 <= last < nb:
            best[last] = math.inf
        order = sorted((b for b in range(nb) if best[b] > -math.inf), key=lambda b: -float(best[b]))
        finite = [float(best[b]) for b in order if best[b] < math.inf]
        kept_finite = want - (1 if 0 <= last < nb and best[last] == math.inf else 0)
        if 0 < kept_finite < len(finite):
            self.indexer_margins.append(finite[kept_finite - 1] - finite[kept_finite])
        keep = torch.zeros(T, dtype=torch.bool)
        for b in order[:want]:
            keep[b * size : (b + 1) * size] = True
        return keep

    def indexer(self, layer: int, x, qr, latents, positions: list[int], T: int) -> list[list[int]]:
        p, ratio, rd = f"layers.{layer}.attn.indexer.", self.ratios[layer], self.rd
        fr = self.freqs(layer)
        if layer in self.kv_src and latents:
            for g, lat in latents:
                k = rmsnorm(lat @ self.t(p + "wk.weight").T, self.t(p + "k_norm.weight"), self.eps)
                self.keys[layer][g] = rotate_tail(k[None], torch.tensor([g * ratio]), fr, rd)[0]
            self.key_owner = layer
        nh, d = self.c["index_n_heads"], self.c["index_head_dim"]
        N = x.shape[0]
        pos = torch.tensor(positions)
        q = rotate_tail((qr @ self.t(p + "wq_b.weight").T).reshape(N, nh, d), pos, fr, rd)
        owner = self.owner_of(layer) if "published_keys_own" in self.m else self.key_owner
        keys = torch.stack([self.keys[owner][j] for j in range(T)])
        w = (x @ self.t(p + "weights_proj.weight").T) * (d**-0.5 * nh**-0.5)
        score = (torch.relu(torch.einsum("nhd,td->nht", q, keys)) * w[..., None]).sum(1)  # [N, T]
        rows, cands = [], []
        for i, q_pos in enumerate(positions):
            lens = (q_pos + 1) // ratio
            s = score[i].clone()
            s[lens:] = -math.inf
            if layer == self.cand:
                cands.append(self.select_blocks(s, lens))
            elif 0 <= self.cand < layer and "candidates_off" not in self.m:
                keep = self.candidates[i]
                masked_valid = int((~keep[:lens]).sum())
                s = torch.where(keep, s, torch.tensor(-math.inf, dtype=s.dtype))
                finite = int(torch.isfinite(s).sum())
                if finite < min(self.c["index_topk"], T) and masked_valid:
                    self.ambiguous += 1
            rows.append(self.top(s, min(self.c["index_topk"], T)))
        if layer == self.cand:
            self.candidates = cands
        return rows

    def top(self, s: torch.Tensor, k: int) -> list[int]:
        """The ``k`` best finite entries of ``s``, in position order; records the boundary margin."""
        finite = [(float(v), j) for j, v in enumerate(s.tolist()) if v > -math.inf]
        finite.sort(key=lambda t: -t[0])
        if len(finite) > k > 0:
            self.indexer_margins.append(finite[k - 1][0] - finite[k][0])
        return sorted(j for _, j in finite[:k])

    def owner_of(self, layer: int) -> int:
        return max(i for i in self.kv_src if i <= layer)

    def attention(self, layer: int, x: torch.Tensor, positions: list[int]) -> torch.Tensor:
        p, ratio, rd, N = f"layers.{layer}.attn.", self.ratios[layer], self.rd, x.shape[0]
        fr, pos = self.freqs(layer), torch.tensor(positions)
        qr = rmsnorm(x @ self.t(p + "wq_a.weight").T, self.t(p + "q_norm.weight"), self.eps)
        q = (qr @ self.t(p + "wq_b.weight").T).reshape(N, self.nh, self.D)
        if "q_head_norm" in self.m:
            q = rmsnorm(q, None, self.eps)
        q = rotate_tail(q, pos, fr, rd)
        kv = rotate_tail(
            rmsnorm(x @ self.t(p + "wkv.weight").T, self.t(p + "kv_norm.weight"), self.eps), pos, fr, rd
        )
        self.kv[layer].extend(kv)
        win = self.c["sliding_window"]
        selected: list[list[int]] = [[] for _ in positions]
        entries: list[torch.Tensor] = []
        if ratio:
            T = (positions[-1] + 1) // ratio
            latents = []
            if layer in self.kv_src:
                latents = self.compressor(layer, x, positions)
                self.kv_owner = layer
            if layer in self.ix_src:
                self.topk = (
                    [[] for _ in positions] if T == 0 else self.indexer(layer, x, qr, latents, positions, T)
                )
            for g, lat in latents:
                self.entries[layer][g] = rotate_tail(lat[None], torch.tensor([g * ratio]), fr, rd)[0]
            shares_kv = layer in self.kv_src or "kv_share_off" not in self.m
            if T and shares_kv:
                entries = [self.entries[self.kv_owner][j] for j in range(T)]
                if "indexer_off" in self.m or (layer not in self.ix_src and "topk_share_off" in self.m):
                    selected = [list(range((q + 1) // ratio)) for q in positions]
                else:
                    selected = [[j for j in row if j < T] for row in self.topk]
        sinks = self.t(p + "attn_sink")
        out = torch.zeros(N, self.nh, self.D, dtype=x.dtype)
        for i, q_pos in enumerate(positions):
            keys = [self.kv[layer][j] for j in range(max(0, q_pos - win + 1), q_pos + 1)]
            keys += [entries[j] for j in selected[i]]
            K = torch.stack(keys)  # [k, D]
            sc = (q[i] @ K.T) * self.D**-0.5  # [nh, k]
            m = sc.max(-1, keepdim=True).values
            if "sinks_off" not in self.m:
                m = torch.maximum(m, sinks[:, None])
            e = torch.exp(sc - m)
            den = e.sum(-1, keepdim=True) + (0 if "sinks_off" in self.m else torch.exp(sinks[:, None] - m))
            out[i] = (e / den) @ K
        if "inverse_rope_off" not in self.m:
            out = rotate_tail(out, pos, fr, rd, inverse=True)
        G, R = self.c["o_groups"], self.c["o_lora_rank"]
        wo_a = self.t(p + "wo_a.weight").reshape(G, R, -1)
        o = torch.einsum("ngd,grd->ngr", out.reshape(N, G, -1), wo_a).reshape(N, G * R)
        return o @ self.t(p + "wo_b.weight").T

    # ------------------------------------------------------------------------------------------------ MoE
    def swiglu(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        g, u = x @ self.t(prefix + "w1.weight").T, x @ self.t(prefix + "w3.weight").T
        lim = self.c["swiglu_limit"]
        if lim > 0 and "swiglu_clamp_off" not in self.m:
            g, u = g.clamp(max=lim), u.clamp(-lim, lim)
        return (F.silu(g) * u) @ self.t(prefix + "w2.weight").T

    def moe(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        p, k = f"layers.{layer}.ffn.", self.c["num_experts_per_tok"]
        scores = F.softplus((x @ self.t(p + "gate.weight").T) / self.c.get("gate_temp", 1.0)).sqrt()
        choice = scores if "bias_off" in self.m else scores + self.t(p + "gate.bias")
        top = choice.topk(k + 1, dim=-1)
        self.router_margins += (top.values[:, k - 1] - top.values[:, k]).tolist()
        idx = top.indices[:, :k]
        w = scores.gather(1, idx)
        if self.c["norm_topk_prob"] and k > 1 and "renorm_off" not in self.m:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * self.c["routed_scaling_factor"]
        y = torch.zeros_like(x)
        for n in range(x.shape[0]):
            for j in range(k):
                y[n] += w[n, j] * self.swiglu(x[n : n + 1], p + f"experts.{int(idx[n, j])}.")[0]
        return y if "shared_off" in self.m else y + self.swiglu(x, p + "shared_experts.")

    # -------------------------------------------------------------------------------------------- forward
    def forward(self, ids: list[int]) -> torch.Tensor:
        """Logits ``[N, V]`` of the chunk ``ids`` after the cached positions (a prefill, or one token)."""
        assert self.pos == 0 or len(ids) == 1, "after the prefill, one token per call"
        positions = list(range(self.pos, self.pos + len(ids)))
        self.history += [self.hash.compress(t) for t in ids]
        h = self.t("embed.weight")[torch.tensor(ids)][:, None, :].repeat(1, self.hc, 1)
        N = len(ids)
        pre = torch.zeros(N, self.hc, dtype=h.dtype)
        pre[:, 0] = 1
        same = "hc_pre_same_site" in self.m
        self.layer_states: list[torch.Tensor] = []  # the streams after each layer (cross-checks)
        for layer in range(self.L):
            if layer in self.engram_layers and "engram_off" not in self.m:
                h = self.engram(layer, h, positions)
            a_pre, post, comb = self.hc_weights(h, "attn", layer)
            x = ((a_pre if same else pre)[..., None] * h).sum(1)
            y = self.attention(
                layer, rmsnorm(x, self.t(f"layers.{layer}.attn_norm.weight"), self.eps), positions
            )
            h = self.hc_post(h, y, post, comb)
            f_pre, post, comb = self.hc_weights(h, "ffn", layer)
            x = ((f_pre if same else a_pre)[..., None] * h).sum(1)
            y = self.moe(layer, rmsnorm(x, self.t(f"layers.{layer}.ffn_norm.weight"), self.eps))
            h = self.hc_post(h, y, post, comb)
            pre = f_pre
            self.layer_states.append(h)
        x = h.mean(1) if same else (pre[..., None] * h).sum(1)
        self.pos += N
        return rmsnorm(x, self.t("norm.weight"), self.eps) @ self.t("head.weight").T
