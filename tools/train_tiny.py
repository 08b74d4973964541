#!/usr/bin/env python3
"""Train lily-tiny: a ~20M-parameter model of the exact Qwen3.6-35B-A3B (qwen3_5_moe)
architecture, on synthetic chat data (tools/synth_conversations.py), and export it as an
mlx-community style 4-bit checkpoint (tools/mlx_format.py) with its own Qwen3.6-pipeline
tokenizer (tools/qwen_tokenizer.py).

    python3 tools/train_tiny.py --smoke --out /tmp/lily-tiny-smoke     # seconds: crash check
    python3 tools/train_tiny.py --out models/lily-tiny                  # ~7 minutes on one H200

Steps (all from --seed):
 1. generate + render conversations with the Qwen3.6 chat template (multiprocessing);
 2. train the tokenizer (BPE, Qwen3.6 pipeline, 33 added tokens) on a sample of them;
 3. check that the torch module below gives the same logits as transformers'
    Qwen3_5MoeForCausalLM on the same weights (fp32);
 4. train by wall-clock deadline (bf16 autocast, AdamW, warmup + cosine by elapsed time), loss on
    assistant tokens only, with a quantization-aware phase (fake 4-bit/8-bit affine g64 weights,
    straight-through) at the end;
 5. export: HF tensors (published names) -> mlx_format.hf_to_mlx -> save_mlx_checkpoint; tokenizer
    files, generation_config.json, heldout.json;
 6. evaluate greedily on the held-out tests with the DEQUANTIZED 4-bit weights read back from the
    written checkpoint (and the float weights for comparison); write train_log.txt.

The module: the real architecture at a small size. Layers i%4==3 are gated full attention
(head_dim 256, partial rotary 64 dims, theta 1e7, q_proj carrying the output gate per head), the
others Gated DeltaNet (key/value heads of 128, twice as many value heads as key heads, conv 4);
every layer a sparse MoE (softmax router, top-k renormalised, SwiGLU experts) plus a sigmoid-gated
shared expert; zero-centred RMSNorms. The MoE is computed densely (all experts, zero weight for the
unselected ones: the same function and gradients as the sparse form, but two big GEMMs).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import re
import sys
import time
import traceback

T_START = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import synth_conversations as sc  # noqa: E402

LOG: list[str] = []


def log(msg: str) -> None:
    line = "[%6.1fs] %s" % (time.time() - T_START, msg)
    print(line, flush=True)
    LOG.append(line)


# ============================================================================================
# Model
# ============================================================================================

class FQ:
    """Quantization-aware training switch: when on, weights go through fake affine quantization."""
    on = False


def fake_quant(w: torch.Tensor, bits: int = 4, group: int = 64) -> torch.Tensor:
    """MLX-style affine group quantization (min/max, larger edge exact), straight-through."""
    shape = w.shape
    g = w.reshape(-1, group).float()
    lo = g.amin(1, keepdim=True)
    hi = g.amax(1, keepdim=True).clamp(min=0)
    n = float(2 ** bits - 1)
    scale = ((hi - lo) / n).clamp(min=1e-7)
    q = ((g - lo) / scale).round().clamp(0, n)
    dq = (q * scale + lo).reshape(shape).to(w.dtype)
    return w + (dq - w).detach()


def Wt(p: torch.Tensor, bits: int = 4) -> torch.Tensor:
    return fake_quant(p, bits) if FQ.on else p


class ZNorm(nn.Module):
    """Zero-centred RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), fp32 inside."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class GatedNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, z):
        dt = x.dtype
        xf = x.float()
        n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        n = self.weight * n.to(dt)
        return (n * F.silu(z.float())).to(dt)


def rotary(T: int, rot_dim: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim))
    f = torch.arange(T, dtype=torch.float32, device=device)[:, None] * inv[None, :]
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    r = cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return torch.cat([xr * cos + rot * sin, xp], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, self.nh, self.nkv, self.hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.q_proj = nn.Linear(H, self.nh * self.hd * 2, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = ZNorm(self.hd, c["rms_norm_eps"])
        self.k_norm = ZNorm(self.hd, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        qg = F.linear(x, Wt(self.q_proj.weight)).view(B, T, self.nh, 2 * self.hd)
        q, gate = qg[..., : self.hd], qg[..., self.hd:].reshape(B, T, self.nh * self.hd)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(F.linear(x, Wt(self.k_proj.weight)).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = F.linear(x, Wt(self.v_proj.weight)).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin).to(v.dtype), apply_rope(k, cos, sin).to(v.dtype)
        rep = self.nh // self.nkv
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.hd ** -0.5)
        o = o.transpose(1, 2).reshape(B, T, self.nh * self.hd) * torch.sigmoid(gate)
        return F.linear(o, Wt(self.o_proj.weight))


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def chunk_gated_delta(q, k, v, g, beta, C=64):
    """Chunked gated delta rule (spec section 3.2), fp32. q,k [B,T,Hk,dk]; v [B,T,Hv,dv];
    g, beta [B,T,Hv]. Returns [B,T,Hv,dv]."""
    B, T, Hk, dk = k.shape
    Hv, dv = v.shape[2], v.shape[3]
    if Hv != Hk:
        q = q.repeat_interleave(Hv // Hk, dim=2)
        k = k.repeat_interleave(Hv // Hk, dim=2)
    q = l2norm(q) * dk ** -0.5
    k = l2norm(k)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))        # [B,H,T,d]
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)       # [B,H,T]
    pad = (C - T % C) % C
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    N = (T + pad) // C
    q, k, v = (t.reshape(B, Hv, N, C, -1) for t in (q, k, v))
    g, beta = g.reshape(B, Hv, N, C), beta.reshape(B, Hv, N, C)
    kb, vb = k * beta[..., None], v * beta[..., None]
    gc = g.cumsum(-1)
    upper = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)
    D = (gc[..., :, None] - gc[..., None, :]).masked_fill(upper, float("-inf")).exp()
    diag_up = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(0)
    A = ((kb @ k.transpose(-1, -2)) * D).masked_fill(diag_up, 0.0)    # strictly lower
    # (I + A)^-1 for strictly lower (nilpotent, A^C = 0) A: prod_j (I + X^(2^j)), X = -A. Batched GEMMs
    # only (torch.linalg.solve_triangular on thousands of 64x64 systems is far slower).
    X = -A
    Tinv = torch.eye(C, dtype=A.dtype, device=A.device) + X
    p = 1
    while 2 * p < C:
        X = X @ X
        Tinv = Tinv + Tinv @ X
        p *= 2
    U = Tinv @ vb
    Wk = Tinv @ (kb * gc.exp()[..., None])
    intra = (q @ k.transpose(-1, -2)) * D
    qd = q * gc.exp()[..., None]
    kd = k * (gc[..., -1:] - gc).exp()[..., None]
    last = gc[..., -1].exp()
    S = q.new_zeros(B, Hv, dk, dv)
    outs = []
    for i in range(N):
        vn = U[:, :, i] - Wk[:, :, i] @ S
        outs.append(qd[:, :, i] @ S + intra[:, :, i] @ vn)
        S = S * last[:, :, i, None, None] + kd[:, :, i].transpose(-1, -2) @ vn
    o = torch.stack(outs, 2).reshape(B, Hv, N * C, dv)[:, :, :T]
    return o.transpose(1, 2)


class GatedDeltaNet(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.hk, self.hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        self.dk, self.dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        self.kd, self.vd = self.hk * self.dk, self.hv * self.dv
        cd = 2 * self.kd + self.vd
        K = c["linear_conv_kernel_dim"]
        self.conv1d = nn.Conv1d(cd, cd, K, groups=cd, bias=False, padding=K - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.empty(self.hv).uniform_(0.01, 16).log())
        self.norm = GatedNorm(self.dv, c["rms_norm_eps"])
        self.out_proj = nn.Linear(self.vd, H, bias=False)
        self.in_proj_qkv = nn.Linear(H, cd, bias=False)
        self.in_proj_z = nn.Linear(H, self.vd, bias=False)
        self.in_proj_b = nn.Linear(H, self.hv, bias=False)
        self.in_proj_a = nn.Linear(H, self.hv, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        qkv = F.linear(x, Wt(self.in_proj_qkv.weight))
        z = F.linear(x, Wt(self.in_proj_z.weight)).view(B, T, self.hv, self.dv)
        b = F.linear(x, Wt(self.in_proj_b.weight))
        a = F.linear(x, Wt(self.in_proj_a.weight))
        # causal depthwise conv as K shifted multiply-adds (cuDNN's depthwise backward is slow):
        # u[t] = sum_i w[:, i] * qkv[t - (K-1) + i]
        w = self.conv1d.weight[:, 0, :].to(qkv.dtype)                     # [C, K]
        K = w.shape[-1]
        xp = F.pad(qkv, (0, 0, K - 1, 0))
        u = sum(xp[:, i: i + T] * w[:, i] for i in range(K))
        u = F.silu(u)
        q, k, v = torch.split(u, [self.kd, self.kd, self.vd], dim=-1)
        dt = q.dtype
        beta = torch.sigmoid(b)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        with torch.autocast(device_type=x.device.type, enabled=False):
            o = chunk_gated_delta(q.reshape(B, T, self.hk, self.dk).float(), k.reshape(B, T, self.hk, self.dk).float(),
                                  v.reshape(B, T, self.hv, self.dv).float(), g.float(), beta.float())
        o = self.norm(o.to(dt), z)
        return F.linear(o.reshape(B, T, self.vd), Wt(self.out_proj.weight))


class MLP(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return F.linear(F.silu(F.linear(x, Wt(self.gate_proj.weight))) * F.linear(x, Wt(self.up_proj.weight)),
                        Wt(self.down_proj.weight))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, self.E, self.I, self.k = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"], c["num_experts_per_tok"]
        self.gate = nn.Linear(H, self.E, bias=False)
        self.experts = nn.Module()
        self.experts.gate_up_proj = nn.Parameter(torch.empty(self.E, 2 * self.I, H))
        self.experts.down_proj = nn.Parameter(torch.empty(self.E, H, self.I))
        self.shared_expert = MLP(H, c["shared_expert_intermediate_size"])
        self.shared_expert_gate = nn.Linear(H, 1, bias=False)
        self.aux = None

    def forward(self, x):
        shp = x.shape
        xs = x.reshape(-1, shp[-1])
        logits = F.linear(xs, Wt(self.gate.weight, 8))
        probs = torch.softmax(logits.float(), dim=-1)
        topv, topi = probs.topk(self.k, dim=-1)
        topv = (topv / topv.sum(-1, keepdim=True)).to(logits.dtype)
        wfull = torch.zeros_like(logits).scatter(1, topi, topv)            # [N, E]
        if self.training:
            frac = torch.zeros_like(probs).scatter(1, topi, 1.0).mean(0) / self.k
            self.aux = self.E * (frac * probs.mean(0)).sum()
        gu = F.linear(xs, Wt(self.experts.gate_up_proj).reshape(self.E * 2 * self.I, -1))
        gu = gu.view(-1, self.E, 2 * self.I)
        h = F.silu(gu[..., : self.I]) * gu[..., self.I:] * wfull[..., None].to(gu.dtype)
        down = Wt(self.experts.down_proj).permute(1, 0, 2).reshape(shp[-1], self.E * self.I)
        routed = F.linear(h.reshape(-1, self.E * self.I), down)
        shared = torch.sigmoid(F.linear(xs, Wt(self.shared_expert_gate.weight, 8))) * self.shared_expert(xs)
        return (routed + shared).reshape(shp)


class Layer(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        self.kind = c["layer_types"][i]
        if self.kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(c)
        else:
            self.self_attn = Attention(c)
        self.mlp = MoE(c)
        self.input_layernorm = ZNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = ZNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        h = self.input_layernorm(x)
        h = self.linear_attn(h) if self.kind == "linear_attention" else self.self_attn(h, cos, sin)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyQwen(nn.Module):
    """Parameter names = transformers Qwen3_5MoeForCausalLM's state dict names."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.model.layers = nn.ModuleList([Layer(c, i) for i in range(c["num_hidden_layers"])])
        self.model.norm = ZNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        rp = c["rope_parameters"]
        self.rot_dim = int(c["head_dim"] * rp["partial_rotary_factor"])
        self.theta = float(rp["rope_theta"])

    def init_weights(self, std=0.02):
        L = self.c["num_hidden_layers"]
        for name, p in self.named_parameters():
            if name.endswith(("A_log", "dt_bias", "conv1d.weight")) or "norm" in name:
                continue
            s = std / math.sqrt(2 * L) if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight",
                                                          "experts.down_proj")) else std
            nn.init.normal_(p, 0.0, s)

    def hidden(self, ids):
        x = F.embedding(ids, Wt(self.model.embed_tokens.weight))
        cos, sin = rotary(ids.shape[1], self.rot_dim, self.theta, ids.device)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x)

    def logits(self, h):
        return F.linear(h, Wt(self.lm_head.weight))

    def forward(self, ids):
        return self.logits(self.hidden(ids))

    def aux_loss(self):
        return sum(l.mlp.aux for l in self.model.layers if l.mlp.aux is not None)


# ============================================================================================
# Config / naming
# ============================================================================================

def text_config(args, vocab_size, eot_id) -> dict:
    L = args.layers
    return {
        "model_type": "qwen3_5_moe_text",
        "dtype": "bfloat16",
        "vocab_size": vocab_size,
        "hidden_size": args.hidden,
        "num_hidden_layers": L,
        "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(L)],
        "full_attention_interval": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "attn_output_gate": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "mamba_ssm_dtype": "float32",
        "num_experts": args.experts,
        "num_experts_per_tok": args.topk,
        "moe_intermediate_size": args.expert_inter,
        "shared_expert_intermediate_size": args.expert_inter,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "partial_rotary_factor": 0.25,
        "tie_word_embeddings": False,
        "mtp_num_hidden_layers": 0,
        "mtp_use_dedicated_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "pad_token_id": None,
    }


def to_published(sd: dict) -> dict:
    """Module state dict (model.*, lm_head.*) -> published HF names (model.language_model.*)."""
    out = {}
    for k, v in sd.items():
        nk = "model.language_model." + k[len("model."):] if k.startswith("model.") else k
        out[nk] = v
    return out


def from_published(hf: dict) -> dict:
    out = {}
    for k, v in hf.items():
        if k.startswith("model.language_model."):
            out["model." + k[len("model.language_model."):]] = v
        else:
            out[k] = v
    return out


# ============================================================================================
# Check against transformers
# ============================================================================================

def hf_parity_check(model: TinyQwen, tc: dict, device, T=150) -> float:
    """Logits of transformers' Qwen3_5MoeForCausalLM vs this module, same weights, fp32."""
    import transformers
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    fields = {k: v for k, v in tc.items() if k not in ("model_type", "dtype")}
    try:
        cfg = Qwen3_5MoeTextConfig(**fields)
    except TypeError:
        known = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "hidden_act", "max_position_embeddings", "initializer_range", "rms_norm_eps", "use_cache",
                 "tie_word_embeddings", "rope_parameters", "attention_bias", "attention_dropout", "head_dim",
                 "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                 "linear_num_value_heads", "moe_intermediate_size", "shared_expert_intermediate_size",
                 "num_experts_per_tok", "num_experts", "output_router_logits", "router_aux_loss_coef",
                 "layer_types", "pad_token_id", "bos_token_id", "eos_token_id"]
        cfg = Qwen3_5MoeTextConfig(**{k: fields[k] for k in known})
    torch.manual_seed(123)
    hf = Qwen3_5MoeForCausalLM(cfg).to(device=device, dtype=torch.float32).eval()
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "rotary" not in m and "inv_freq" not in m]
    if missing or unexpected:
        raise RuntimeError("state dict mismatch with transformers: missing %s unexpected %s" % (missing, unexpected))
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    was_training = model.training
    model.eval()
    try:
        mine_model = TinyQwen(tc).to(device)
        mine_model.load_state_dict(sd)
        mine_model.eval()
        g = torch.Generator().manual_seed(7)
        ids = torch.randint(0, tc["vocab_size"], (2, T), generator=g).to(device)
        with torch.no_grad():
            ref = hf(input_ids=ids).logits.float()
            mine = mine_model(ids).float()
        err = (ref - mine).abs().max().item() / max(ref.abs().max().item(), 1e-6)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
        torch.backends.cudnn.allow_tf32 = prev_tf32
        model.train(was_training)
    log("transformers %s parity: max |logit diff| / max |logit| = %.2e over %s tokens"
        % (transformers.__version__, err, tuple(ids.shape)))
    del hf
    return err


# ============================================================================================
# Data
# ============================================================================================

def build_data(args, tok, examples_segments):
    """Tokenize (text, is_loss) segments separately (as at inference) -> ids, loss masks."""
    flat = []
    for segs in examples_segments:
        for s, loss in segs:
            flat.append(s)
    enc = tok.encode_batch(flat, add_special_tokens=False)
    seqs, masks = [], []
    j = 0
    for segs in examples_segments:
        ids, m = [], []
        for s, loss in segs:
            e = enc[j].ids
            j += 1
            ids.extend(e)
            m.extend([loss] * len(e))
        if len(ids) > args.max_len:
            continue
        seqs.append(np.asarray(ids, dtype=np.int32))
        masks.append(np.asarray(m, dtype=np.bool_))
    return seqs, masks


def make_batches(seqs, masks, tokens_per_batch, device, rng):
    order = sorted(range(len(seqs)), key=lambda i: (len(seqs[i]), rng.random()))
    batches, cur = [], []
    for i in order:
        L = len(seqs[i])
        if cur and (len(cur) + 1) * L > tokens_per_batch:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    out = []
    for b in batches:
        L = max(len(seqs[i]) for i in b)
        ids = np.zeros((len(b), L), dtype=np.int32)
        m = np.zeros((len(b), L), dtype=np.bool_)
        for r, i in enumerate(b):
            ids[r, : len(seqs[i])] = seqs[i]
            m[r, : len(seqs[i])] = masks[i]
        out.append((torch.from_numpy(ids).to(device), torch.from_numpy(m).to(device)))
    return out


# ============================================================================================
# Generation / evaluation
# ============================================================================================

@torch.no_grad()
def greedy(model, prompts_ids, stop_ids, max_new, device, bs=128):
    model.eval()
    results = [None] * len(prompts_ids)
    order = sorted(range(len(prompts_ids)), key=lambda i: len(prompts_ids[i]))
    for s in range(0, len(order), bs):
        idx = order[s: s + bs]
        seqs = [list(prompts_ids[i]) for i in idx]
        gen = [[] for _ in idx]
        done = [False] * len(idx)
        for _ in range(max_new):
            L = max(len(x) for x in seqs)
            ids = torch.zeros(len(seqs), L, dtype=torch.long)
            for r, x in enumerate(seqs):
                ids[r, : len(x)] = torch.tensor(x)
            ids = ids.to(device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                h = model.hidden(ids)
            pos = torch.tensor([len(x) - 1 for x in seqs], device=device)
            nxt = model.logits(h[torch.arange(len(seqs), device=device), pos].float()).argmax(-1).tolist()
            for r, t in enumerate(nxt):
                if done[r]:
                    continue
                if t in stop_ids:
                    done[r] = True
                    continue
                gen[r].append(t)
                seqs[r].append(t)
            if all(done):
                break
        for r, i in enumerate(idx):
            results[i] = gen[r]
    return results


def content_of(text: str) -> str:
    if "</think>" in text:
        text = text.split("</think>", 1)[1]
    return text.strip()


def evaluate(model, tok, heldout, device, stop_ids, tag, max_new=256):
    tests = heldout["tests"]
    prompts = [tok.encode(t["prompt"], add_special_tokens=False).ids for t in tests]
    outs = greedy(model, prompts, stop_ids, max_new, device)
    stats: dict[str, list[int]] = {}
    samples = []
    for t, o in zip(tests, outs):
        text = tok.decode(o, skip_special_tokens=False)
        c = content_of(text)
        k = t["kind"]
        if k == "arith":
            nums = re.findall(r"-?\d+", c)
            ok = bool(nums) and nums[-1] == t["expected_answer"]
            k = "arith_think" if t["enable_thinking"] else "arith_nothink"
        elif k == "tool_call":
            ok = c == t["expected_content"]
        elif "expected_contains" in t:
            ok = all(s in c for s in t["expected_contains"])
        else:
            ok = c == t["expected_content"]
        stats.setdefault(k, [0, 0])
        stats[k][0] += int(ok)
        stats[k][1] += 1
        if len(samples) < 400:
            samples.append((k, ok, text))
    summary = {k: (v[0], v[1]) for k, v in sorted(stats.items())}
    log("eval [%s]: " % tag + ", ".join("%s %d/%d (%.0f%%)" % (k, a, b, 100.0 * a / b) for k, (a, b) in summary.items()))
    return summary, samples


# ============================================================================================
# Main
# ============================================================================================

def main() -> int:
    ap = argparse.ArgumentParser(description="train lily-tiny")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "models", "lily-tiny"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="tiny data, a few steps: a crash check in seconds")
    ap.add_argument("--budget", type=float, default=440.0, help="total wall-clock seconds for the whole script")
    ap.add_argument("--reserve", type=float, default=38.0, help="seconds kept for export + evaluation")
    ap.add_argument("--eval-float", action="store_true",
                    help="also evaluate the float weights (about 15 s more; off by default: the 4-bit weights count)")
    ap.add_argument("--examples", type=int, default=300000)
    ap.add_argument("--vocab", type=int, default=4000, help="BPE vocabulary incl. 256 bytes (+33 added tokens)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--expert-inter", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch-tokens", type=int, default=32768)
    ap.add_argument("--max-len", type=int, default=640)
    ap.add_argument("--qat-frac", type=float, default=0.15, help="last fraction of training with fake quantization")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--allow-no-hf-check", action="store_true",
                    help="continue if transformers' class cannot be built (a numeric mismatch always aborts)")
    args = ap.parse_args()
    if args.smoke:
        args.examples, args.budget, args.reserve, args.vocab = 3000, 45.0, 15.0, 1000
        args.batch_tokens = 16384

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    log("torch %s, device %s, out %s, smoke %s" % (torch.__version__, device, args.out, args.smoke))

    from qwen_tokenizer import build_qwen36_tokenizer, save_tokenizer_files
    import mlx_format

    # ---- 1. data
    n_workers = args.workers or max(1, min(32, (os.cpu_count() or 2) - 1))
    chunk = 2000
    jobs = [(args.seed * 1000003 + i, min(chunk, args.examples - i * chunk))
            for i in range((args.examples + chunk - 1) // chunk)]
    if n_workers > 1 and len(jobs) > 1:
        with mp.get_context("fork").Pool(n_workers) as pool:
            parts = pool.map(sc.render_chunk, jobs)
    else:
        parts = [sc.render_chunk(j) for j in jobs]
    rendered = [r for p in parts for r in p]
    segs = [r[0] for r in rendered]
    kind_counts: dict[str, int] = {}
    for r in rendered:
        kind_counts[r[1]] = kind_counts.get(r[1], 0) + 1
    log("rendered %d conversations with %d workers; mix %s" % (len(segs), n_workers, ", ".join(
        "%s %.1f%%" % (k, 100.0 * v / len(segs)) for k, v in sorted(kind_counts.items()))))

    # ---- 2. tokenizer (on texts with the copied names removed: see sc.tokenizer_text)
    texts = [sc.tokenizer_text(r[0], r[2]) for r in rendered[: min(len(rendered), 30000)]]
    del rendered
    tok = build_qwen36_tokenizer(texts, args.vocab)
    for c in sc.HELDOUT_CITIES:
        log("held-out city %r -> %s / %s" % (c, tok.encode(" " + c, add_special_tokens=False).tokens,
                                              tok.encode("\n" + c, add_special_tokens=False).tokens))
    n_tok = tok.get_vocab_size(with_added_tokens=True)
    vocab_size = (n_tok + 63) // 64 * 64
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    stop_ids = {im_end, eot}
    seqs, masks = build_data(args, tok, segs)
    del segs, parts
    n_tokens = sum(len(s) for s in seqs)
    n_loss = sum(int(m.sum()) for m in masks)
    log("tokenizer: %d tokens (config vocab %d); %d sequences, %.1fM tokens (%.1fM trained), mean len %.0f, max %d"
        % (n_tok, vocab_size, len(seqs), n_tokens / 1e6, n_loss / 1e6, n_tokens / len(seqs), max(map(len, seqs))))

    tc = text_config(args, vocab_size, eot)
    model = TinyQwen(tc).to(device)
    model.init_weights()
    n_params = sum(p.numel() for p in model.parameters())
    log("model: %.2fM parameters, hidden %d, %d layers %s, %d experts top-%d, inter %d"
        % (n_params / 1e6, args.hidden, args.layers, "".join("A" if t == "full_attention" else "D" for t in tc["layer_types"]),
           args.experts, args.topk, args.expert_inter))

    # ---- 3. parity with transformers (before training, so a mismatch shows in seconds)
    try:
        err = hf_parity_check(model, tc, device)
    except Exception:
        traceback.print_exc()
        if not args.allow_no_hf_check:
            log("FATAL: could not run transformers' Qwen3_5MoeForCausalLM (use --allow-no-hf-check to go on)")
            return 2
        log("WARNING: transformers parity check could not run")
        err = None
    if err is not None and err > 2e-3:
        log("FATAL: module does not match transformers (rel err %.2e)" % err)
        return 3

    # ---- 4. training
    rng = random.Random(args.seed)
    batches = make_batches(seqs, masks, args.batch_tokens, device, rng)
    log("%d batches of <= %d tokens" % (len(batches), args.batch_tokens))
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if (p.ndim < 2 or "norm" in n or "conv1d" in n) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    t_train0 = time.time()
    deadline = T_START + args.budget - args.reserve
    train_secs = max(deadline - t_train0, 1.0)
    log("training for %.0f s (until the deadline)" % train_secs)
    model.train()
    step, epoch, seen_tok, ema = 0, 0, 0, None
    curve = []
    perm = []
    t_meas, tok_meas = None, 0
    while True:
        now = time.time()
        frac = (now - t_train0) / train_secs
        if frac >= 1.0 or (args.smoke and step >= 30):
            break
        if not perm:
            perm = list(range(len(batches)))
            rng.shuffle(perm)
            epoch += 1
        ids, m = batches[perm.pop()]
        warm = 0.03
        lr = args.lr * (frac / warm if frac < warm else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (frac - warm) / (1 - warm))))
        for gparam in opt.param_groups:
            gparam["lr"] = lr
        FQ.on = frac >= 1.0 - args.qat_frac
        ids = ids.long()
        inp, tgt, mk = ids[:, :-1], ids[:, 1:], m[:, 1:]
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            h = model.hidden(inp)
            logits = model.logits(h[mk])
            loss = F.cross_entropy(logits.float(), tgt[mk])
            aux = model.aux_loss()
        total = loss + 0.01 * aux
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen_tok += ids.numel()
        if step == 8 and os.environ.get("LILY_TINY_PROFILE"):
            from torch.profiler import profile, ProfilerActivity
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                    h = model.hidden(inp)
                    l2 = F.cross_entropy(model.logits(h[mk]).float(), tgt[mk]) + 0.01 * model.aux_loss()
                l2.backward()
                opt.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)
        if step == 5:
            torch.cuda.synchronize() if device.type == "cuda" else None
            t_meas, tok_meas = time.time(), seen_tok
        if step == 25 and t_meas is not None:
            torch.cuda.synchronize() if device.type == "cuda" else None
            rate = (seen_tok - tok_meas) / (time.time() - t_meas)
            log("throughput: %.0f tokens/s (padded) -> about %.0fM tokens, %.1f epochs in the budget"
                % (rate, rate * train_secs / 1e6, rate * train_secs / max(n_tokens, 1)))
        if step % 50 == 0 or step <= 3 or (args.smoke and step % 5 == 0):
            lv = loss.item()
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
            curve.append((step, round(frac, 3), round(lv, 4)))
            if step % 200 == 0 or step <= 3 or args.smoke:
                log("step %5d  epoch %d  t %.2f  lr %.2e  loss %.4f  aux %.3f  qat %s"
                    % (step, epoch, frac, lr, lv, aux.item(), FQ.on))
    FQ.on = False
    model.eval()
    log("trained %d steps, %.1fM tokens (padded), %d epochs; final loss ~%.4f" % (step, seen_tok / 1e6, epoch, ema or float("nan")))

    # ---- 5. export
    os.makedirs(args.out, exist_ok=True)
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    hf_tensors = {}
    for k, v in to_published(sd).items():
        hf_tensors[k] = v.float() if k.endswith("A_log") else v.to(torch.bfloat16)
    config = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": tc,
        "tie_word_embeddings": False,
        "image_token_id": tok.token_to_id("<|image_pad|>"),
        "video_token_id": tok.token_to_id("<|video_pad|>"),
        "vision_start_token_id": tok.token_to_id("<|vision_start|>"),
        "vision_end_token_id": tok.token_to_id("<|vision_end|>"),
        "transformers_version": "5.17.0",
    }
    gen_cfg = {"bos_token_id": eot, "eos_token_id": [im_end, eot], "pad_token_id": eot, "do_sample": True,
               "temperature": 0.7, "top_p": 0.8, "top_k": 20}
    mlx_tensors, mlx_cfg = mlx_format.hf_to_mlx(hf_tensors, config, gen_cfg)
    mlx_format.save_mlx_checkpoint(args.out, mlx_tensors, mlx_cfg, gen_cfg)
    save_tokenizer_files(tok, args.out)
    heldout = sc.heldout_tests(seed=args.seed + 4242, n_arith=40 if args.smoke else 200)
    with open(os.path.join(args.out, "heldout.json"), "w", encoding="utf-8") as f:
        json.dump(heldout, f, ensure_ascii=False, indent=1)
    size = os.path.getsize(os.path.join(args.out, "model.safetensors"))
    log("wrote %s (model.safetensors %.2f MB)" % (args.out, size / 1e6))

    # ---- 6. evaluation on the dequantized 4-bit weights read back from disk
    mt, mc = mlx_format.load_mlx_checkpoint(args.out)
    deq = from_published(mlx_format.mlx_to_dequantized_hf(mt, mc))
    qmodel = TinyQwen(tc).to(device)
    own = qmodel.state_dict()
    missing = [k for k in own if k not in deq]
    extra = [k for k in deq if k not in own]
    if missing or extra:
        log("FATAL: dequantized checkpoint names differ: missing %s extra %s" % (missing[:5], extra[:5]))
        return 4
    worst = 0.0
    for k, v in deq.items():
        ref = sd[k].float()
        v = v.reshape(ref.shape).float()
        rel = ((v - ref).norm() / ref.norm().clamp(min=1e-8)).item()
        worst = max(worst, rel)
        own[k].copy_(v)
    log("dequantized weights: worst relative error %.3f" % worst)
    qmodel.eval()
    res_f = None
    if args.eval_float or args.smoke:
        res_f, _ = evaluate(model, tok, heldout, device, stop_ids, "float weights")
    res_q, samples = evaluate(qmodel, tok, heldout, device, stop_ids, "4-bit dequantized")
    for k, ok, text in samples[:3] + [s for s in samples if s[0] == "tool_call"][:2] + [s for s in samples if not s[1]][:10]:
        log("sample %s %s: %r" % (k, "OK" if ok else "WRONG", text[:400]))
    a, b = res_q.get("arith_think", (0, 1))
    t, n = res_q.get("tool_call", (0, 1))
    log("RESULT (4-bit, thinking on): held-out arithmetic %d/%d = %.1f%% (target >= 80%%), held-out tool calls %d/%d"
        % (a, b, 100.0 * a / b, t, n))

    with open(os.path.join(args.out, "train_log.txt"), "w", encoding="utf-8") as f:
        f.write("lily-tiny training log (tools/train_tiny.py %s)\n\n" % " ".join(sys.argv[1:]))
        f.write("loss curve (step, fraction of time, loss):\n")
        for i in range(0, len(curve), max(1, len(curve) // 40)):
            f.write("  %s\n" % (curve[i],))
        if curve:
            f.write("  %s\n" % (curve[-1],))
        if res_f is not None:
            f.write("\nheld-out results, float weights: %s\n" % json.dumps(res_f))
        f.write("\nheld-out results, 4-bit dequantized: %s\n\n" % json.dumps(res_q))
        f.write("\n".join(LOG) + "\n")
    log("done in %.0f s" % (time.time() - T_START))
    return 0


if __name__ == "__main__":
    sys.exit(main())
