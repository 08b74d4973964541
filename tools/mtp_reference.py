#!/usr/bin/env python3
"""Reference logits of the MTP head (multi-token prediction, spec §6) for a qwen3_5_moe checkpoint.

    python3 tools/mtp_reference.py --model DIR --out FILE.f32
        [--ids FILE] [--mtp DIR] [--chain K] [--json FILE]
        [--hidden FILE | --lily BIN [--main-logits FILE]]
        [--device cpu|cuda] [--dtype float32|bfloat16] [--loader auto|transformers|manual] [--no-self-check]

transformers ignores mtp.*, so the head is written here from the spec, in plain torch:

    e  = RMSNorm_zc(E[x_{i+1}]; mtp.pre_fc_norm_embedding)      E: the main model's embed_tokens
    hh = RMSNorm_zc(h_i; mtp.pre_fc_norm_hidden)                 h_i: main hidden row AFTER model.norm
    u  = concat(e, hh) @ mtp.fc^T                                embedding first, then hidden
    u  = DecoderLayer(u; mtp.layers.0)                           full attention at position i, own KV cache
    m  = RMSNorm_zc(u; mtp.norm)
    logits_{i+2} = m @ lm_head^T                                 the main model's lm_head

The main model (its post-norm hidden rows h_i, embed_tokens and lm_head) comes from one of:

  transformers (the default; needs it): loaded as tools/reference_logits.py loads it (DIR: an HF
      layout, fused or per-expert experts, or an mlx 4-bit layout, dequantized), the rows hooked
      on its final norm.
  a file, without transformers: --hidden FILE, float32 [T, hidden], the rows lily writes with
      `lily logits -m DIR --backend reference --ids IDS --out L.f32 --hidden-out FILE`, or --lily
      BIN, which runs that command itself. embed_tokens and lm_head are read from DIR in plain
      torch (mlx: dequantized, w = scale * q + bias). The rows are not taken on trust: h @ lm_head^T
      must give transformers' COMMITTED logits for the same ids (--main-logits; default the
      fixture's logits-hf.f32, or logits-mlx.f32 for an mlx DIR, by DIR/../reference.json) within
      the golden bound of the C++ logits tests (max |diff| <= 1e-3 of the largest logit, every
      argmax), else the run fails. lm_head [V, H] has full column rank (V > H), so the logits pin
      the rows down: rows before the final norm, or of another model, fail.

The mtp.* weights are read from --mtp DIR (default: --model), per expert as published or fused;
the zero-centred norm gains are 1 + w (HF storage).

For ids x_0 .. x_{T-1} (--ids; default: the "ids" of DIR/../reference.json, the fixture's), it
writes float32 little-endian logits [T - 1 + K, vocab] to --out:
  rows 0 .. T-2    teacher-forced: row i takes h_i and x_{i+1} at position i (one pass, causal);
  rows T-1 ..      K chained draft steps (--chain, default 3), the head's cache continuing from
                   the T-1 rows above: step 0 takes h_{T-1} and d_0 = argmax of the main logits
                   at T-1, at position T-1; step k takes m of step k-1 and d_k = argmax of step
                   k-1's logits, at position T-1+k.
and a JSON (--json; default: --out with .json for .f32) saying what it did: the ids, the shape,
where the main rows came from ("main_rows") and what checked them, the chain's tokens, the
positions, statistics, the self-checks and the versions.

Self-checks (on unless --no-self-check; each fails the run): with transformers, the hooked
post-norm rows times lm_head give transformers' logits (so h is the row AFTER the final norm),
and this file's decoder layer, run with the weights of the model's first full-attention layer
on that layer's hooked input, gives transformers' output of that layer (so the attention, RoPE
and MoE written here are transformers'). From a file, the first check against the committed
logits as above; the second needs transformers and is not run.

The fixtures the C++ test tests/model/test_mtp.cpp compares lily against (committed; made from
lily's rows, since this machine has no transformers):

    python3 tools/mtp_reference.py --model tests/fixtures/models/tiny-a/hf-fused --lily build/lily \\
        --out tests/fixtures/models/tiny-a/mtp-logits-hf.f32
    python3 tools/mtp_reference.py --model tests/fixtures/models/tiny-a/mlx-q4 --lily build/lily \\
        --mtp tests/fixtures/models/tiny-a/hf-fused --out tests/fixtures/models/tiny-a/mtp-logits-mlx.f32
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Imported by load_torch(), after the arguments are parsed, so that --help needs no torch.
torch = None
rl = None  # tools/reference_logits.py (imports torch and transformers)


def load_torch():
    global torch, rl
    import torch as torch_module
    import reference_logits
    torch = torch_module
    rl = reference_logits


def log(*a):
    print("[mtp-ref]", *a, flush=True)


# ----------------------------------------------------------------------------------------
# Reading only the tensors wanted (a full checkpoint is tens of GB; the MTP head is small)
# ----------------------------------------------------------------------------------------

_FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _shards(d: str) -> list[str]:
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return sorted(x for x in os.listdir(d) if x.endswith(".safetensors"))


def read_tensors(d: str, prefix: str) -> dict[str, torch.Tensor]:
    """The float tensors of checkpoint directory ``d`` whose names start with ``prefix``."""
    out: dict[str, torch.Tensor] = {}
    for fn in _shards(d):
        path = os.path.join(d, fn)
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n).decode("utf-8"))
            for name, info in header.items():
                if name == "__metadata__" or not name.startswith(prefix):
                    continue
                if info["dtype"] not in _FLOAT_DTYPES:
                    raise TypeError(f"{path}: {name} is {info['dtype']}: this reference reads float tensors "
                                    "(give --mtp the bf16 HF checkpoint)")
                begin, end = info["data_offsets"]
                f.seek(8 + n + begin)
                raw = bytearray(f.read(end - begin))
                dtype = getattr(torch, _FLOAT_DTYPES[info["dtype"]])
                t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
                if name in out:
                    raise ValueError(f"tensor {name} twice in {d}")
                out[name] = t.reshape(info["shape"]).clone()
    return out


# ----------------------------------------------------------------------------------------
# The model's geometry (config.json, nested text_config or flat)
# ----------------------------------------------------------------------------------------

class Geometry:
    def __init__(self, config: dict):
        tc = config.get("text_config", config)
        rp = tc.get("rope_parameters") or tc.get("rope_scaling") or {}
        self.H = tc["hidden_size"]
        self.vocab = tc["vocab_size"]
        self.nq = tc["num_attention_heads"]
        self.nkv = tc["num_key_value_heads"]
        self.d = tc.get("head_dim", self.H // self.nq)
        prf = tc.get("partial_rotary_factor", rp.get("partial_rotary_factor", 0.25))
        self.rotary = int(self.d * prf)
        self.theta = float(rp.get("rope_theta", tc.get("rope_theta", 1e7)))
        self.eps = float(tc.get("rms_norm_eps", 1e-6))
        self.E = tc["num_experts"]
        self.k = tc["num_experts_per_tok"]
        self.I = tc["moe_intermediate_size"]
        self.Is = tc["shared_expert_intermediate_size"]
        self.layer_types = tc["layer_types"]


# ----------------------------------------------------------------------------------------
# The block, from the spec (§2.2, §2.4, §2.5, §2.7, §6)
# ----------------------------------------------------------------------------------------

def rms_norm_zc(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm (spec §2.2.1): x * rsqrt(mean(x^2) + eps) * (1 + w), fp32 inside."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + w.float())).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, rotary: int, theta: float) -> torch.Tensor:
    """Partial NEOX rotate-half RoPE (spec §2.5) on the first ``rotary`` dims of each head.
    x: [T, heads, d]; pairs (j, j + rotary/2); angle p * theta^(-2j/rotary), fp32."""
    half = rotary // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary, 2, dtype=torch.float32, device=x.device) / rotary))
    ang = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, half]
    cos, sin = ang.cos()[:, None, :].to(x.dtype), ang.sin()[:, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:rotary]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rotary:]], dim=-1)


def gated_attention(x, w, positions, cache, g: Geometry):
    """Gated full attention (spec §2.4). x: [T, H] normed; appends T rows to cache (k, v:
    [L, nkv, d], row l at position l). Returns [T, H]."""
    T = x.shape[0]
    qg = (x @ w["q_proj"].T).view(T, g.nq, 2 * g.d)  # per head: 256 query rows then 256 gate rows
    q, gate = qg[..., :g.d], qg[..., g.d:]
    k = (x @ w["k_proj"].T).view(T, g.nkv, g.d)
    v = (x @ w["v_proj"].T).view(T, g.nkv, g.d)
    q = rope(rms_norm_zc(q, w["q_norm"], g.eps), positions, g.rotary, g.theta)
    k = rope(rms_norm_zc(k, w["k_norm"], g.eps), positions, g.rotary, g.theta)
    cache["k"] = torch.cat([cache["k"], k]) if cache["k"] is not None else k
    cache["v"] = torch.cat([cache["v"], v]) if cache["v"] is not None else v
    K = cache["k"].repeat_interleave(g.nq // g.nkv, dim=1)  # [L, nq, d]: q head h uses kv head h // group
    V = cache["v"].repeat_interleave(g.nq // g.nkv, dim=1)
    L = K.shape[0]
    scores = torch.einsum("tnd,lnd->ntl", q.float(), K.float()) / math.sqrt(g.d)  # [nq, T, L]
    visible = torch.arange(L, device=x.device)[None, :] <= positions[:, None]  # causal over positions
    scores = scores.masked_fill(~visible[None], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    o = torch.einsum("ntl,lnd->tnd", p, V.float()).to(x.dtype)  # [T, nq, d]
    o = o * torch.sigmoid(gate)  # the gate BEFORE o_proj
    return o.reshape(T, g.nq * g.d) @ w["o_proj"].T


def sparse_moe(x, w, g: Geometry):
    """Sparse MoE with the gated shared expert (spec §2.7). x: [T, H] normed -> [T, H]."""
    p = torch.softmax((x @ w["router"].T).float(), dim=-1)  # [T, E]
    top_p, top_e = torch.topk(p, g.k, dim=-1)
    top_p = (top_p / top_p.sum(-1, keepdim=True)).to(x.dtype)  # renormalised over the k, always
    routed = torch.zeros_like(x)
    for e in range(g.E):
        rows, slot = (top_e == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        xe = x[rows]
        ye = (torch.nn.functional.silu(xe @ w["gate"][e].T) * (xe @ w["up"][e].T)) @ w["down"][e].T
        routed.index_add_(0, rows, ye * top_p[rows, slot][:, None])
    shared = (torch.nn.functional.silu(x @ w["shared_gate"].T) * (x @ w["shared_up"].T)) @ w["shared_down"].T
    return routed + torch.sigmoid(x @ w["shared_expert_gate"].T) * shared


def decoder_layer(h, w, positions, cache, g: Geometry):
    """A full-attention MoE decoder layer (spec §2.3). h: [T, H] -> [T, H]."""
    h = h + gated_attention(rms_norm_zc(h, w["input_layernorm"], g.eps), w["attn"], positions, cache, g)
    return h + sparse_moe(rms_norm_zc(h, w["post_attention_layernorm"], g.eps), w["moe"], g)


def mtp_block(hidden, tokens, positions, cache, mtp, embed, lm_head, g: Geometry):
    """The MTP head (spec §6). hidden: [T, H] (post-norm main rows, or a chained m), tokens: [T]
    (x_{i+1}), positions: [T] (i). Returns (logits [T, vocab], m [T, H])."""
    e = rms_norm_zc(embed[tokens], mtp["pre_fc_norm_embedding"], g.eps)
    hh = rms_norm_zc(hidden, mtp["pre_fc_norm_hidden"], g.eps)
    u = torch.cat([e, hh], dim=-1) @ mtp["fc"].T  # ORDER: embedding first, then hidden
    u = decoder_layer(u, mtp["layer"], positions, cache, g)
    m = rms_norm_zc(u, mtp["norm"], g.eps)
    return m @ lm_head.T, m


# ----------------------------------------------------------------------------------------
# Weights: HF names -> the dicts above
# ----------------------------------------------------------------------------------------

def _get(t: dict, name: str, shape: tuple) -> torch.Tensor:
    if name not in t:
        raise KeyError(f"missing tensor {name}")
    if tuple(t[name].shape) != tuple(shape):
        raise ValueError(f"tensor {name}: expected shape {list(shape)}, found {list(t[name].shape)}")
    return t[name]


def layer_weights(t: dict, p: str, g: Geometry, device, dtype) -> dict:
    """A full-attention MoE layer under prefix ``p`` ("mtp.layers.0.", "model.language_model.layers.3.");
    experts per expert (``mlp.experts.{e}.{gate,up,down}_proj.weight``) or fused
    (``mlp.experts.gate_up_proj`` [E, 2I, H], gate rows first, and ``mlp.experts.down_proj`` [E, H, I])."""
    H, E, I, Is, nq, nkv, d = g.H, g.E, g.I, g.Is, g.nq, g.nkv, g.d

    def cv(x):
        return x.to(device=device, dtype=dtype)

    a = p + "self_attn."
    m = p + "mlp."
    if m + "experts.gate_up_proj" in t:
        gu = _get(t, m + "experts.gate_up_proj", (E, 2 * I, H))
        gate, up = [gu[e, :I] for e in range(E)], [gu[e, I:] for e in range(E)]
        down = [x for x in _get(t, m + "experts.down_proj", (E, H, I))]
    else:
        gate = [_get(t, f"{m}experts.{e}.gate_proj.weight", (I, H)) for e in range(E)]
        up = [_get(t, f"{m}experts.{e}.up_proj.weight", (I, H)) for e in range(E)]
        down = [_get(t, f"{m}experts.{e}.down_proj.weight", (H, I)) for e in range(E)]
    return {
        "input_layernorm": cv(_get(t, p + "input_layernorm.weight", (H,))),
        "post_attention_layernorm": cv(_get(t, p + "post_attention_layernorm.weight", (H,))),
        "attn": {
            "q_proj": cv(_get(t, a + "q_proj.weight", (2 * nq * d, H))),
            "k_proj": cv(_get(t, a + "k_proj.weight", (nkv * d, H))),
            "v_proj": cv(_get(t, a + "v_proj.weight", (nkv * d, H))),
            "o_proj": cv(_get(t, a + "o_proj.weight", (H, nq * d))),
            "q_norm": cv(_get(t, a + "q_norm.weight", (d,))),
            "k_norm": cv(_get(t, a + "k_norm.weight", (d,))),
        },
        "moe": {
            "router": cv(_get(t, m + "gate.weight", (E, H))),
            "gate": [cv(x) for x in gate],
            "up": [cv(x) for x in up],
            "down": [cv(x) for x in down],
            "shared_gate": cv(_get(t, m + "shared_expert.gate_proj.weight", (Is, H))),
            "shared_up": cv(_get(t, m + "shared_expert.up_proj.weight", (Is, H))),
            "shared_down": cv(_get(t, m + "shared_expert.down_proj.weight", (H, Is))),
            "shared_expert_gate": cv(_get(t, m + "shared_expert_gate.weight", (1, H))),
        },
    }


def mtp_weights(d: str, g: Geometry, device, dtype) -> dict:
    t = read_tensors(d, "mtp.")
    if not t:
        raise SystemExit(f"{d} holds no mtp.* tensors (mlx conversions drop them: pass --mtp with the HF checkpoint)")
    extra = sorted({k.split(".")[2] for k in t if k.startswith("mtp.layers.")} - {"0"})
    if extra:
        raise SystemExit(f"{d}: mtp.layers.{extra} beyond layer 0; this reference runs a one-layer head")
    H = g.H
    return {
        "fc": _get(t, "mtp.fc.weight", (H, 2 * H)).to(device=device, dtype=dtype),
        "pre_fc_norm_embedding": _get(t, "mtp.pre_fc_norm_embedding.weight", (H,)).to(device=device, dtype=dtype),
        "pre_fc_norm_hidden": _get(t, "mtp.pre_fc_norm_hidden.weight", (H,)).to(device=device, dtype=dtype),
        "norm": _get(t, "mtp.norm.weight", (H,)).to(device=device, dtype=dtype),
        "layer": layer_weights(t, "mtp.layers.0.", g, device, dtype),
    }


# ----------------------------------------------------------------------------------------
# The main model: post-norm hidden rows and logits, through transformers with hooks
# ----------------------------------------------------------------------------------------

def find_module(model, names: list[str]):
    mods = dict(model.named_modules())
    for n in names:
        if n in mods:
            return n, mods[n]
    raise KeyError(f"none of the modules {names} in the model (it has e.g. {list(mods)[:8]})")


def main_forward(model, ids: list[int], check_layer: int | None):
    """(post-norm hidden [T, H], logits [T, V], the checked layer's (input, output) or None)."""
    with torch.no_grad():
        return _main_forward(model, ids, check_layer)


def _main_forward(model, ids: list[int], check_layer: int | None):
    dev = next(model.parameters()).device
    captured = {}
    _, norm = find_module(model, ["model.language_model.norm", "model.norm", "language_model.norm"])
    hooks = [norm.register_forward_hook(lambda m, a, out: captured.__setitem__("h", out))]
    if check_layer is not None:
        _, layers = find_module(model, ["model.language_model.layers", "model.layers", "language_model.layers"])
        layer = layers[check_layer]

        def pre(m, args, kwargs):
            captured["layer_in"] = args[0] if args else kwargs["hidden_states"]

        def post(m, args, kwargs, out):
            captured["layer_out"] = out[0] if isinstance(out, (tuple, list)) else out

        hooks.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        hooks.append(layer.register_forward_hook(post, with_kwargs=True))
    try:
        x = torch.tensor([ids], dtype=torch.long, device=dev)
        pos = torch.arange(len(ids), device=dev)[None]
        out = model(input_ids=x, position_ids=pos, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    layer_io = (captured["layer_in"][0], captured["layer_out"][0]) if check_layer is not None else None
    return captured["h"][0], out.logits[0], layer_io


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def default_ids(model_dir: str) -> tuple[list[int], str]:
    path = os.path.join(os.path.dirname(os.path.abspath(model_dir.rstrip("/"))), "reference.json")
    if not os.path.exists(path):
        raise SystemExit(f"no --ids given and no {path}: pass --ids FILE (ids, a JSON list, or a JSON with 'ids')")
    return rl.read_ids(path), path


# ----------------------------------------------------------------------------------------
# The main model's rows from a file (lily's), checked against the committed transformers logits
# ----------------------------------------------------------------------------------------

def fixture_reference(model_dir: str) -> tuple[dict, str] | tuple[None, None]:
    path = os.path.join(os.path.dirname(os.path.abspath(model_dir.rstrip("/"))), "reference.json")
    if not os.path.exists(path):
        return None, None
    with open(path) as f:
        return json.load(f), path


def main_embeddings(d: str, g: Geometry) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(embed_tokens [V, H], lm_head [V, H], how) of checkpoint ``d`` in float32, in plain torch:
    read as stored (HF), or dequantized w = scale * q + bias (mlx affine, tools/mlx_format.py)."""
    if rl.mlx_format.is_mlx_checkpoint(d):
        tensors, cfg = rl.mlx_format.load_mlx_checkpoint(d)
        hf = rl.mlx_format.mlx_to_dequantized_hf(tensors, cfg)
        how = "mlx affine dequantized in float32 (tools/mlx_format.py mlx_to_dequantized_hf)"
    else:
        hf = read_tensors(d, "model.")
        hf.update(read_tensors(d, "lm_head."))
        how = "read as stored, upcast to float32"
    embed = next((hf[k] for k in ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight") if k in hf),
                 None)
    if embed is None:
        raise SystemExit(f"{d}: no embed_tokens tensor")
    lm_head = hf.get("lm_head.weight", embed)  # tied when the checkpoint has none
    for name, t in (("embed_tokens", embed), ("lm_head", lm_head)):
        if tuple(t.shape) != (g.vocab, g.H):
            raise SystemExit(f"{d}: {name} is {list(t.shape)}, expected [{g.vocab}, {g.H}]")
    return embed.float(), lm_head.float(), how


def read_rows(path: str, cols: int, what: str) -> torch.Tensor:
    """A float32 little-endian file [rows, cols] -> tensor; the size must be a whole number of rows."""
    raw = bytearray(open(path, "rb").read())
    if len(raw) % (4 * cols):
        raise SystemExit(f"{path}: {len(raw)} bytes is not a whole number of {what} rows of {cols} float32")
    return torch.frombuffer(raw, dtype=torch.float32).reshape(-1, cols).clone()


def sha256_of(path: str) -> str:
    import hashlib
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def run_lily(lily: str, model: str, ids: list[int], out_dir: str) -> tuple[str, list[str]]:
    """`lily logits --backend reference --hidden-out` over ``ids``: (the hidden file, the command)."""
    import subprocess
    hidden = os.path.join(out_dir, "hidden.f32")
    cmd = [lily, "logits", "-m", model, "--backend", "reference", "--ids", ",".join(map(str, ids)),
           "--out", os.path.join(out_dir, "logits.f32"), "--hidden-out", hidden]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return hidden, cmd


def check_rows_give_logits(hidden: torch.Tensor, lm_head: torch.Tensor, want: torch.Tensor) -> dict:
    """h @ lm_head^T against the transformers logits, within the golden bound of the C++ logits tests
    (tests/model/test_golden.cpp): max |diff| <= 1e-3 * max |reference| and the argmax of every row.
    Rows before the final norm, or of another model, fail it (lm_head [V, H] has full column rank,
    so the logits pin the rows down). Returns what it measured; exits when it fails."""
    got = hidden @ lm_head.T
    diff, scale = float((got - want).abs().max()), float(want.abs().max())
    mismatches = int((got.argmax(-1) != want.argmax(-1)).sum())
    result = {"max_abs_diff": diff, "max_abs_reference": scale, "relative": diff / scale,
              "bound": "max |h @ lm_head^T - logits| <= 1e-3 * max |logits| and every argmax equal",
              "argmax_mismatches": mismatches, "rows": int(want.shape[0])}
    if not (diff <= 1e-3 * scale) or mismatches:
        raise SystemExit(f"self-check: the hidden rows @ lm_head differ from the transformers logits by {diff:.3g} "
                         f"(relative {diff / scale:.3g}, bound 1e-3), {mismatches} argmax mismatches: these are not "
                         "the post-norm rows of the model that made the logits")
    return result


def rows_from_file(a, g: Geometry, ids: list[int]) -> dict:
    """The main model from lily's post-norm rows (--hidden or --lily) and the checkpoint's embed / lm_head,
    checked against the committed transformers logits (--main-logits or the fixture's reference.json)."""
    import tempfile
    T = len(ids)
    command = None
    with tempfile.TemporaryDirectory() as tmp:
        path = a.hidden
        if a.lily:
            path, command = run_lily(a.lily, a.model, ids, tmp)
        hidden = read_rows(path, g.H, "hidden")
        digest = sha256_of(path)
    if hidden.shape[0] != T:
        raise SystemExit(f"{a.hidden or 'lily'}: {hidden.shape[0]} hidden rows for {T} ids")
    embed, lm_head, how = main_embeddings(a.model, g)
    logits_path = a.main_logits
    if not logits_path:
        ref, ref_path = fixture_reference(a.model)
        if ref is None or ref.get("ids") != ids:
            raise SystemExit("pass --main-logits FILE (transformers' logits for these ids): the self-check needs them")
        which = "mlx" if rl.mlx_format.is_mlx_checkpoint(a.model) else "hf"
        logits_path = os.path.join(os.path.dirname(ref_path), ref["logits"][which])
    main_logits = read_rows(logits_path, g.vocab, "logits")
    if main_logits.shape[0] != T:
        raise SystemExit(f"{logits_path}: {main_logits.shape[0]} logits rows for {T} ids")
    checks = {}
    if not a.no_self_check:
        checks["post_norm_hidden_times_lm_head_vs_transformers_logits"] = {
            "logits": os.path.relpath(logits_path), **check_rows_give_logits(hidden, lm_head, main_logits)}
        checks["decoder_layer_vs_transformers"] = (
            "not run (no transformers here): this file's decoder layer is the spec's, as written; with "
            "transformers, the path without --hidden compares it with the model's first full-attention layer")
    source = {
        "from": "lily" if command else "file",
        "file": os.path.abspath(a.hidden) if a.hidden else None,
        "sha256": digest,
        "command": " ".join(command[:6]) + " --ids <the ids> --out <tmp> --hidden-out <tmp>" if command else None,
        "what": "the main model's hidden rows AFTER its final norm (model.norm), float32 [T, hidden], from "
                "lily's CPU reference backend (Backend::forward_hidden); transformers did not run here",
        "embed_tokens_and_lm_head": how,
        "checked_by": (f"h @ lm_head^T against {os.path.basename(logits_path)}, transformers' fp32 logits of the same ids "
                       "(committed with the fixture): within 1e-3 of the largest logit, every argmax equal (see "
                       "self_checks)") if not a.no_self_check else "nothing (--no-self-check)",
    }
    return {"hidden": hidden, "main_logits": main_logits, "embed": embed, "lm_head": lm_head,
            "kind": "lily" if command else "file", "checks": checks, "source": source}


def rows_from_transformers(a, g: Geometry, ids: list[int], dtype) -> dict:
    """The main model through transformers, its post-norm rows taken with a hook on the final norm."""
    t0 = time.time()
    model, kind = rl.load_model_from_dir(a.model, dtype=dtype, device=a.device, loader=a.loader)
    log(f"loaded {a.model} via {kind} in {time.time() - t0:.1f}s")
    embed = model.get_input_embeddings().weight.detach()
    lm_head = model.get_output_embeddings().weight.detach()
    full = [i for i, k in enumerate(g.layer_types) if k == "full_attention"]
    check_layer = full[0] if full and not a.no_self_check and kind != "mlx" else None
    hidden, main_logits, layer_io = main_forward(model, ids, check_layer)
    T = len(ids)
    checks = {}
    if not a.no_self_check:
        # The hooked rows are AFTER the final norm: they give the logits through lm_head alone.
        d = max_rel_diff(hidden @ lm_head.T, main_logits)
        checks["post_norm_hidden_times_lm_head_vs_logits"] = d
        if d > (1e-4 if dtype == torch.float32 else 2e-2):
            raise SystemExit(f"self-check: hooked norm output @ lm_head differs from the logits by {d:.3g} (relative)")
        if check_layer is not None:
            # The layer's tensors under the decoder prefix of an HF layout (wrapped or flat).
            for p in (f"model.language_model.layers.{check_layer}.", f"model.layers.{check_layer}."):
                t = read_tensors(a.model, p)
                if t:
                    break
            w = layer_weights(t, p, g, a.device, dtype)
            positions = torch.arange(T, device=hidden.device)
            with torch.no_grad():
                mine = decoder_layer(layer_io[0], w, positions, {"k": None, "v": None}, g)
            d = max_rel_diff(mine, layer_io[1])
            checks[f"decoder_layer_vs_transformers_layer_{check_layer}"] = d
            if d > (1e-4 if dtype == torch.float32 else 3e-2):
                raise SystemExit(f"self-check: this file's decoder layer differs from transformers' layer "
                                 f"{check_layer} by {d:.3g} (relative)")
        else:
            checks["decoder_layer_vs_transformers"] = "skipped (an mlx main model: no HF layer weights to compare)"
    source = {"from": "transformers", "loader": kind,
              "what": "the main model's hidden rows AFTER its final norm, hooked on transformers' model.norm"}
    return {"hidden": hidden, "main_logits": main_logits, "embed": embed, "lm_head": lm_head,
            "kind": kind, "checks": checks, "source": source}


def run_head(main: dict, mtp: dict, ids: list[int], chain: int, g: Geometry):
    """Teacher-forced rows 0..T-2, then ``chain`` chained steps: (logits [T-1+K, V], chain tokens, drafted)."""
    hidden, main_logits, embed, lm_head = main["hidden"], main["main_logits"], main["embed"], main["lm_head"]
    T = len(ids)
    with torch.no_grad():
        dev = hidden.device
        cache = {"k": None, "v": None}
        tokens = torch.tensor(ids, dtype=torch.long, device=dev)
        # Teacher-forced rows 0..T-2: h_i with x_{i+1} at position i.
        tf_logits, _ = mtp_block(hidden[:-1], tokens[1:], torch.arange(T - 1, device=dev), cache, mtp, embed, lm_head, g)
        rows = [tf_logits]
        # The chain: d_0 from the main model's last logits, then each step's argmax.
        chain_tokens, drafted = [], []
        h = hidden[-1:]
        token = int(main_logits[-1].float().argmax())
        for k in range(chain):
            chain_tokens.append(token)
            step_logits, h = mtp_block(h, torch.tensor([token], device=dev), torch.tensor([T - 1 + k], device=dev),
                                       cache, mtp, embed, lm_head, g)
            rows.append(step_logits)
            token = int(step_logits[0].float().argmax())
            drafted.append(token)
        logits = torch.cat(rows).float().cpu()
    assert logits.shape == (T - 1 + chain, g.vocab), logits.shape
    assert torch.isfinite(logits).all(), "non-finite logits"
    assert cache["k"].shape[0] == T - 1 + chain, "the head's cache must hold every row"
    return logits, chain_tokens, drafted


def transformers_version() -> str:
    try:
        return __import__("transformers").__version__
    except ImportError:
        return "not installed (not used)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory of the main model")
    ap.add_argument("--out", required=True, help="float32 LE logits [T-1+K, vocab]")
    ap.add_argument("--ids", help="token ids (default: DIR/../reference.json, the fixture's)")
    ap.add_argument("--mtp", help="directory holding mtp.* (default: --model)")
    ap.add_argument("--chain", type=int, default=3, help="chained draft steps after the ids (default 3)")
    ap.add_argument("--json", help="what was done (default: --out with .json)")
    ap.add_argument("--hidden", help="the main model's post-norm rows, float32 [T, hidden] (lily logits --hidden-out), "
                                     "instead of transformers")
    ap.add_argument("--lily", help="the lily binary: run `lily logits --backend reference --hidden-out` for the rows")
    ap.add_argument("--main-logits", help="with --hidden / --lily: transformers' logits [T, vocab] for the ids, that "
                                          "the rows must give (default: the fixture's, by reference.json)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--loader", default="auto", choices=["auto", "transformers", "manual"])
    ap.add_argument("--no-self-check", action="store_true", help="skip the checks against transformers")
    a = ap.parse_args()
    if a.chain < 0:
        ap.error("--chain must be >= 0")
    if a.hidden and a.lily:
        ap.error("--hidden and --lily both give the main rows: pass one")
    from_file = bool(a.hidden or a.lily)
    if from_file and (a.dtype != "float32" or a.device != "cpu"):
        ap.error("--hidden / --lily compute in float32 on the CPU")
    load_torch()
    rl.set_determinism()
    dtype = getattr(torch, a.dtype)
    ids, ids_from = (rl.read_ids(a.ids), a.ids) if a.ids else default_ids(a.model)
    if len(ids) < 2:
        raise SystemExit("need at least 2 ids")
    with open(os.path.join(a.model, "config.json")) as f:
        g = Geometry(json.load(f))
    mtp_dir = a.mtp or a.model
    log(f"{len(ids)} ids from {ids_from}; main model {a.model} ({'lily rows' if from_file else 'transformers'}); "
        f"mtp.* from {mtp_dir}")

    main_rows = rows_from_file(a, g, ids) if from_file else rows_from_transformers(a, g, ids, dtype)
    checks = main_rows["checks"]
    if checks:
        log("self-checks:", json.dumps(checks))
    mtp = mtp_weights(mtp_dir, g, a.device, dtype)
    logits, chain_tokens, drafted = run_head(main_rows, mtp, ids, a.chain, g)
    logits.contiguous().numpy().astype("<f4").tofile(a.out)
    T = len(ids)
    report = {
        "what": "MTP head reference logits (tools/mtp_reference.py, spec §6)",
        "model": a.model,
        "mtp_dir": mtp_dir,
        "main_loader": main_rows["kind"],
        "main_rows": main_rows["source"],
        "ids_from": os.path.relpath(ids_from) if os.path.exists(ids_from) else ids_from,
        "ids": ids,
        "T": T,
        "vocab_size": g.vocab,
        "hidden_size": g.H,
        "logits": os.path.basename(a.out),
        "shape": [T - 1 + a.chain, g.vocab],
        "dtype": "float32 little-endian, row-major",
        "teacher_forced": {
            "rows": [0, T - 1],
            "row_i": "hidden = main post-norm row i, token = ids[i + 1], position i; predicts ids[i + 2]",
        },
        "chain": {
            "rows": [T - 1, T - 1 + a.chain],
            "first_position": T - 1,
            "tokens": chain_tokens,
            "drafted": drafted,
            "step_k": "hidden = main post-norm row T-1 (k = 0) or m of step k-1, token = tokens[k], position T-1+k",
        },
        "compute": {"dtype": a.dtype, "device": a.device},
        "stats": {
            "logit_std": float(logits.std()),
            "teacher_forced_argmax_first_8": logits[: min(8, T - 1)].argmax(-1).tolist(),
            "main_argmax_last": int(main_rows["main_logits"][-1].float().argmax()),
        },
        "self_checks": checks or "skipped (--no-self-check)",
        "versions": {"torch": torch.__version__, "transformers": transformers_version(),
                     "python": sys.version.split()[0]},
    }
    json_path = a.json or re.sub(r"\.f32$", "", a.out) + ".json"
    with open(json_path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    log(f"wrote {a.out}: [{T - 1 + a.chain}, {g.vocab}] float32 (std {logits.std():.4f}); chain tokens "
        f"{chain_tokens}, drafted {drafted}; {json_path}")


if __name__ == "__main__":
    main()
