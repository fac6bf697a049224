"""A torch reference of Kimi K3 (no transformers model exists), written from the architecture (issue 28; the
paper-level description colibri's ``c/kimi_k3.c`` header and ``c/tools/k3_ref.py`` give, read for facts only),
not from colitools' runtime. In the weights' dtype (``make_kimi_k3.py`` passes float64 copies of the float32
source values), the whole sequence at once (teacher forcing), no cache: the KDA recurrence token by token,
causal MLA over the whole sequence, attention residuals per layer.

``K3Reference(text_config, weights, mutations)``: ``weights`` by the checkpoint's names (``language_model.``
root, experts decoded to ``...experts.{E}.w1/w2/w3.weight``); ``mutations``: features switched off, each a
deliberate bug for ``make_kimi_k3.py --mutations`` (oracles/README.md "Do the oracles catch bugs?").
``forward(ids) -> logits [T, V]``; ``router_margins`` collects the top-k boundary of every routing decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F

ROOT = "language_model."

MUTATIONS = {
    "attn_res_off": "attention residuals off (plain residual stream x + a, x + mlp; output = last state)",
    "attn_res_uniform": "attention-residual queries zeroed (uniform mixing of the block states)",
    "attn_res_normed_values": "attention residuals mix the RMS-normed states instead of the raw ones",
    "situ_as_swiglu": "SiTU-GLU read as SwiGLU (silu(g) * u)",
    "situ_linear_off": "SiTU-GLU's linear side untamed (u for b2 tanh(u / b2))",
    "latent_norm_off": "LatentMoE routed_expert_norm dropped",
    "shared_off": "shared experts dropped",
    "bias_off": "correction bias ignored in the expert choice",
    "renorm_off": "routing weights not renormalised",
    "kda_gate_off": "KDA output gate sigmoid(g_proj x) dropped",
    "kda_lower_bound_off": "KDA lower-bounded forget gate read as Kimi-Linear's -exp(A_log) softplus(g)",
    "kda_conv_off": "KDA short convolutions dropped",
    "kda_a_log_off": "KDA A_log dropped (read as 0)",
    "kda_dt_bias_off": "KDA dt_bias dropped",
    "mla_gate_off": "MLA output gate sigmoid(g_proj x) dropped",
    "mla_k_rot_off": "MLA shared key slice k_rot dropped",
    "eps_x10": "RMSNorm eps x10",
}


def rmsnorm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


class K3Reference:
    def __init__(self, text: Mapping, weights: Mapping[str, torch.Tensor], mutations: Iterable[str] = ()):
        self.c, self.w, self.m = text, weights, set(mutations)
        unknown = self.m - set(MUTATIONS)
        assert not unknown, unknown
        la = text["linear_attn_config"]
        self.kda_layers = {i - 1 for i in la["kda_layers"]}
        self.nh, self.hd, self.K = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
        self.lower = la["gate_lower_bound"]
        self.eps = text["rms_norm_eps"] * (10 if "eps_x10" in self.m else 1)
        self.b1, self.b2 = text["activation_situ_beta"], text["activation_situ_linear_beta"]
        self.router_margins: list[float] = []

    def t(self, name: str) -> torch.Tensor:
        return self.w[ROOT + name]

    # ------------------------------------------------------------------------------------------ pieces
    def situ(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        if "situ_as_swiglu" in self.m:
            return F.silu(g) * u
        gate = self.b1 * torch.tanh(g / self.b1) * torch.sigmoid(g)
        return gate * (u if "situ_linear_off" in self.m else self.b2 * torch.tanh(u / self.b2))

    def glu(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        g, u = x @ self.t(f"{prefix}.gate_proj.weight").T, x @ self.t(f"{prefix}.up_proj.weight").T
        return self.situ(g, u) @ self.t(f"{prefix}.down_proj.weight").T

    def res(self, entries: list[torch.Tensor], norm: str) -> torch.Tensor:
        """Softmax over the entries (each [T, H]) of their RMS-normed projection on res_proj; raw mix."""
        if "attn_res_off" in self.m:
            return entries[-1]
        v = torch.stack(entries)  # [B, T, H]
        query = self.t(f"{norm}_norm.weight") * self.t(f"{norm}_proj.weight").reshape(-1)
        if "attn_res_uniform" in self.m:
            query = torch.zeros_like(query)
        normed = rmsnorm(v, None, self.c["rms_norm_eps"])
        p = torch.softmax((normed * query).sum(-1), dim=0)  # [B, T]
        return (p[..., None] * (normed if "attn_res_normed_values" in self.m else v)).sum(0)

    # --------------------------------------------------------------------------------------- attention
    def kda(self, li: int, x: torch.Tensor) -> torch.Tensor:
        p = f"model.layers.{li}.self_attn."
        T, nh, hd = x.shape[0], self.nh, self.hd
        out = []
        for n in ("q", "k", "v"):
            y = x @ self.t(p + f"{n}_proj.weight").T  # [T, C]
            if "kda_conv_off" not in self.m:
                w = self.t(p + f"{n}_conv1d.weight")  # [C, 1, K]: causal depthwise
                y = F.conv1d(F.pad(y.T[None], (self.K - 1, 0)), w, groups=y.shape[1])[0].T
            out.append(F.silu(y).reshape(T, nh, hd))
        q, k, v = out
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * hd**-0.5
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        z = (x @ self.t(p + "f_a_proj.weight").T) @ self.t(p + "f_b_proj.weight").T
        if "kda_dt_bias_off" not in self.m:
            z = z + self.t(p + "dt_bias")
        z = z.reshape(T, nh, hd)
        a_log = self.t(p + "A_log")[:nh]  # stored [head_dim], the heads' values first
        if "kda_a_log_off" in self.m:
            a_log = torch.zeros_like(a_log)
        rate = torch.exp(a_log)[None, :, None]
        if "kda_lower_bound_off" in self.m:
            log_decay = -rate * F.softplus(z)
        else:
            log_decay = self.lower * torch.sigmoid(rate * z)
        beta = torch.sigmoid(x @ self.t(p + "b_proj.weight").T)  # [T, nh]
        S = torch.zeros(nh, hd, hd, dtype=x.dtype)  # [head, key, value]
        o = torch.empty(T, nh, hd, dtype=x.dtype)
        for t in range(T):
            S = S * torch.exp(log_decay[t])[:, :, None]
            pred = torch.einsum("hk,hkv->hv", k[t], S)
            S = S + torch.einsum("hk,hv->hkv", k[t], (v[t] - pred) * beta[t][:, None])
            o[t] = torch.einsum("hk,hkv->hv", q[t], S)
        o = rmsnorm(o, self.t(p + "o_norm.weight"), self.eps)
        if "kda_gate_off" not in self.m:
            o = o * torch.sigmoid(x @ self.t(p + "g_proj.weight").T).reshape(T, nh, hd)
        return o.reshape(T, nh * hd) @ self.t(p + "o_proj.weight").T

    def mla(self, li: int, x: torch.Tensor) -> torch.Tensor:
        p, c = f"model.layers.{li}.self_attn.", self.c
        T, nh = x.shape[0], c["num_attention_heads"]
        nope, rope, vd, r = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        qa = rmsnorm(x @ self.t(p + "q_a_proj.weight").T, self.t(p + "q_a_layernorm.weight"), self.eps)
        q = (qa @ self.t(p + "q_b_proj.weight").T).reshape(T, nh, nope + rope)
        kv_a = x @ self.t(p + "kv_a_proj_with_mqa.weight").T
        latent = rmsnorm(kv_a[:, :r], self.t(p + "kv_a_layernorm.weight"), self.eps)
        k_rot = kv_a[:, r:]  # NoPE: neither normed nor rotated, one slice for every head
        if "mla_k_rot_off" in self.m:
            k_rot = torch.zeros_like(k_rot)
        kv = (latent @ self.t(p + "kv_b_proj.weight").T).reshape(T, nh, nope + vd)
        k = torch.cat([kv[..., :nope], k_rot[:, None].expand(T, nh, rope)], dim=-1)
        scores = torch.einsum("thd,shd->hts", q, k) * (nope + rope) ** -0.5
        scores = scores.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
        ctx = torch.einsum("hts,shd->thd", torch.softmax(scores, -1), kv[..., nope:]).reshape(T, nh * vd)
        if "mla_gate_off" not in self.m:
            ctx = ctx * torch.sigmoid(x @ self.t(p + "g_proj.weight").T)
        return ctx @ self.t(p + "o_proj.weight").T

    # ---------------------------------------------------------------------------------------------- MoE
    def moe(self, li: int, x: torch.Tensor) -> torch.Tensor:
        p, c = f"model.layers.{li}.block_sparse_moe.", self.c
        k = c["num_experts_per_token"]
        scores = torch.sigmoid(x @ self.t(p + "gate.weight").T)  # [T, E]
        choice = scores if "bias_off" in self.m else scores + self.t(p + "gate.e_score_correction_bias")
        top = torch.sort(choice, dim=-1, descending=True).values
        self.router_margins.append(float((top[:, k - 1] - top[:, k]).min()))
        idx = torch.topk(choice, k, dim=-1).indices
        w = torch.gather(scores, -1, idx)
        if "renorm_off" not in self.m:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        z = x @ self.t(p + "routed_expert_down_proj.weight").T  # into the latent
        u = torch.zeros_like(z)
        for t in range(x.shape[0]):
            for e, we in zip(idx[t].tolist(), w[t], strict=True):
                u[t] += we * self.glu_expert(f"{p}experts.{e}.", z[t])
        if "latent_norm_off" not in self.m:
            u = rmsnorm(u, self.t(p + "routed_expert_norm.weight"), self.eps)
        y = u @ self.t(p + "routed_expert_up_proj.weight").T
        return y if "shared_off" in self.m else y + self.glu(x, p + "shared_experts")

    def glu_expert(self, p: str, z: torch.Tensor) -> torch.Tensor:
        g, u = z @ self.t(p + "w1.weight").T, z @ self.t(p + "w3.weight").T  # w1 gate, w3 up, w2 down
        return self.situ(g, u) @ self.t(p + "w2.weight").T

    # ------------------------------------------------------------------------------------------- model
    @torch.no_grad()
    def forward(self, ids: list[int]) -> torch.Tensor:
        c = self.c
        x = self.t("model.embed_tokens.weight")[torch.tensor(ids)]
        blocks: list[torch.Tensor] = []
        for li in range(c["num_hidden_layers"]):
            lp = f"model.layers.{li}."
            h = self.res([*blocks, x], lp + "self_attention_res") if blocks else x
            start = li % c["attn_res_block_size"] == 0 and "attn_res_off" not in self.m
            if start:
                blocks.append(x)
            a_in = rmsnorm(h, self.t(lp + "input_layernorm.weight"), self.eps)
            a = self.kda(li, a_in) if li in self.kda_layers else self.mla(li, a_in)
            part = a if start else x + a  # the block's partial sum restarts at a block boundary
            mix = self.res([*blocks, part], lp + "mlp_res")
            f_in = rmsnorm(mix, self.t(lp + "post_attention_layernorm.weight"), self.eps)
            dense = li < c["first_k_dense_replace"]
            x = part + (self.glu(f_in, lp + "mlp") if dense else self.moe(li, f_in))
        h = self.res([*blocks, x], "model.output_attn_res")
        return rmsnorm(h, self.t("model.norm.weight"), self.eps) @ self.t("lm_head.weight").T
