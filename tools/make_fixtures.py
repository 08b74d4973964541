#!/usr/bin/env python3
"""Golden test checkpoints + reference logits for lily (Qwen3.6-35B-A3B architecture, tiny).

    python3 tools/make_fixtures.py --out DIR [--variant a|b] [--seed N] [--device cpu|cuda]

Writes (see tests/fixtures/models/README.md):
  DIR/hf-fused/        config.json, generation_config.json, 3 safetensors shards + index
                       (published names: fused 3-D experts, model.visual.*, per-expert mtp.*)
  DIR/hf-per-expert/   same values, single model.safetensors, mlp.experts.{e}.*_proj.weight
  DIR/mlx-q4/          mlx-lm 4-bit g64 conversion (8-bit routers / shared-expert gates)
  DIR/reference.json   ids, greedy continuations, stats, versions
  DIR/logits-hf.f32    float32 LE [T, vocab]: fp32 transformers forward of the HF weights
  DIR/logits-mlx.f32   float32 LE [T, vocab]: same forward on the dequantized mlx weights

Needs torch + transformers (5.x with qwen3_5_moe) + numpy. Runs on CPU in well under a
minute for variant a. Exit status 1 if a fatal self-check fails (files are written first).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlx_format  # noqa: E402
import reference_logits as rl  # noqa: E402

T_IDS = 150
GREEDY_PROMPT = 20
GREEDY_NEW = 16

FATAL: list[str] = []
WARN: list[str] = []


def log(*a):
    print("[fix]", *a, flush=True)


def fatal(msg):
    FATAL.append(msg)
    print("[fix] FAIL:", msg, flush=True)


def warn(msg):
    WARN.append(msg)
    print("[fix] WARNING:", msg, flush=True)


# ----------------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------------

def text_config(variant: str) -> dict:
    if variant == "a":
        H, L, nq, nkv, hk, hv, E, k, I, Is, V = 128, 4, 2, 1, 2, 4, 8, 2, 64, 64, 384
    else:
        H, L, nq, nkv, hk, hv, E, k, I, Is, V = 256, 8, 4, 2, 4, 8, 16, 4, 128, 128, 500
    return {
        "model_type": "qwen3_5_moe_text",
        "dtype": "bfloat16",
        "vocab_size": V,
        "hidden_size": H,
        "num_hidden_layers": L,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)],
        "full_attention_interval": 4,
        "num_attention_heads": nq,
        "num_key_value_heads": nkv,
        "head_dim": 256,
        "attn_output_gate": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_num_key_heads": hk,
        "linear_num_value_heads": hv,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "mamba_ssm_dtype": "float32",
        "num_experts": E,
        "num_experts_per_tok": k,
        "moe_intermediate_size": I,
        "shared_expert_intermediate_size": Is,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "partial_rotary_factor": 0.25,
        "tie_word_embeddings": False,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": 1,
        "eos_token_id": 1,
        "pad_token_id": None,
    }


def full_config(variant: str) -> dict:
    import transformers
    tc = text_config(variant)
    V = tc["vocab_size"]
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": tc,
        "vision_config": {
            "model_type": "qwen3_5_moe_vision",
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "in_channels": 3,
            "patch_size": 4,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "out_hidden_size": tc["hidden_size"],
            "num_position_embeddings": 16,
            "hidden_act": "gelu_pytorch_tanh",
            "initializer_range": 0.02,
        },
        # inside the tiny vocab; only used with images, never here
        "image_token_id": V - 4,
        "video_token_id": V - 3,
        "vision_start_token_id": V - 6,
        "vision_end_token_id": V - 5,
        "tie_word_embeddings": False,
        "transformers_version": transformers.__version__,
    }


def generation_config() -> dict:
    import transformers
    return {
        "bos_token_id": 1,
        "do_sample": True,
        "eos_token_id": [2, 1],
        "pad_token_id": 1,
        "temperature": 1.0,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": transformers.__version__,
    }


# ----------------------------------------------------------------------------------------
# random weights
# ----------------------------------------------------------------------------------------

_ZC_NORM_SUFFIXES = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
                     "k_norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")


def init_tensor(name: str, shape, gen: torch.Generator) -> torch.Tensor:
    def normal(std, mean=0.0):
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32) * std + mean

    if name.startswith("model.visual."):
        if len(shape) == 1:
            if "norm" in name and name.endswith(".weight"):
                return normal(0.1, 1.0)
            return normal(0.02)
        if name.endswith("pos_embed.weight"):
            return normal(0.02)
        fan_in = math.prod(shape[1:])
        return normal(1.0 / math.sqrt(fan_in))
    if name.endswith("A_log"):
        return torch.log(torch.rand(tuple(shape), generator=gen, dtype=torch.float32) * 15.0 + 1.0)
    if name.endswith("dt_bias"):
        return normal(0.5)
    if name.endswith("conv1d.weight"):
        return normal(0.3)
    if name.endswith("linear_attn.norm.weight"):
        return normal(0.1, 1.0)
    if len(shape) == 1:  # every other 1-D tensor is a zero-centred RMSNorm gain
        return normal(0.1)
    if name.endswith("embed_tokens.weight"):
        return normal(1.0)
    if name == "lm_head.weight":
        return normal(1.5 / math.sqrt(shape[-1]))
    # linear weights [out, in] and fused experts [E, out, in]: unit-gain init
    return normal(1.0 / math.sqrt(shape[-1]))


def storage_dtype(name: str, variant: str) -> torch.dtype:
    # Qwen3.5 stores A_log and the gated norm in F32; Qwen3.6 in BF16 (spec §5a)
    if variant == "a" and (name.endswith("linear_attn.A_log") or name.endswith("linear_attn.norm.weight")):
        return torch.float32
    return torch.bfloat16


def mtp_shapes(tc: dict) -> list[tuple[str, tuple]]:
    H, E, I, Is = tc["hidden_size"], tc["num_experts"], tc["moe_intermediate_size"], tc["shared_expert_intermediate_size"]
    nq, nkv, dh = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    p = "mtp.layers.0."
    out = [
        ("mtp.fc.weight", (H, 2 * H)),
        ("mtp.pre_fc_norm_embedding.weight", (H,)),
        ("mtp.pre_fc_norm_hidden.weight", (H,)),
        ("mtp.norm.weight", (H,)),
        (p + "input_layernorm.weight", (H,)),
        (p + "post_attention_layernorm.weight", (H,)),
        (p + "self_attn.q_proj.weight", (2 * nq * dh, H)),
        (p + "self_attn.k_proj.weight", (nkv * dh, H)),
        (p + "self_attn.v_proj.weight", (nkv * dh, H)),
        (p + "self_attn.o_proj.weight", (H, nq * dh)),
        (p + "self_attn.q_norm.weight", (dh,)),
        (p + "self_attn.k_norm.weight", (dh,)),
        (p + "mlp.gate.weight", (E, H)),
        (p + "mlp.shared_expert.gate_proj.weight", (Is, H)),
        (p + "mlp.shared_expert.up_proj.weight", (Is, H)),
        (p + "mlp.shared_expert.down_proj.weight", (H, Is)),
        (p + "mlp.shared_expert_gate.weight", (1, H)),
    ]
    for e in range(E):
        out += [(p + f"mlp.experts.{e}.gate_proj.weight", (I, H)),
                (p + f"mlp.experts.{e}.up_proj.weight", (I, H)),
                (p + f"mlp.experts.{e}.down_proj.weight", (H, I))]
    return out


# ----------------------------------------------------------------------------------------
# writers
# ----------------------------------------------------------------------------------------

def write_json(path, obj, indent=2):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent)
        f.write("\n")


def split_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Main-layer fused experts -> per-expert (what transformers' save_pretrained writes)."""
    out = {}
    for k, v in state.items():
        if k.endswith(".mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            I = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = v[e, :I].contiguous()
                out[f"{pre}{e}.up_proj.weight"] = v[e, I:].contiguous()
        elif k.endswith(".mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    return out


def shard_of(name: str, n_layers: int) -> int:
    if name.startswith("mtp."):
        return 3
    if name.startswith("model.visual.") or "embed_tokens" in name:
        return 1
    if ".layers." in name:
        li = int(name.split(".layers.")[1].split(".")[0])
        return 1 if li < n_layers // 2 else 2
    return 2  # final norm, lm_head


def save_hf_fused(d, state, cfg, gcfg):
    os.makedirs(d, exist_ok=True)
    n_layers = cfg["text_config"]["num_hidden_layers"]
    shards: dict[int, dict] = {1: {}, 2: {}, 3: {}}
    for k, v in state.items():
        shards[shard_of(k, n_layers)][k] = v
    n = len(shards)
    weight_map = {}
    total = 0
    for i, sh in shards.items():
        fn = f"model-{i:05d}-of-{n:05d}.safetensors"
        mlx_format.write_safetensors(os.path.join(d, fn), sh, {"format": "pt"})
        for k, v in sh.items():
            weight_map[k] = fn
            total += v.numel() * v.element_size()
    write_json(os.path.join(d, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    write_json(os.path.join(d, "config.json"), cfg)
    write_json(os.path.join(d, "generation_config.json"), gcfg)


def save_hf_per_expert(d, state, cfg, gcfg):
    os.makedirs(d, exist_ok=True)
    mlx_format.write_safetensors(os.path.join(d, "model.safetensors"), split_experts(state), {"format": "pt"})
    write_json(os.path.join(d, "config.json"), cfg)
    write_json(os.path.join(d, "generation_config.json"), gcfg)


# ----------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------

def same_tensors(a: dict, b: dict, what: str) -> bool:
    if set(a) != set(b):
        fatal(f"{what}: key sets differ: only-left {sorted(set(a) - set(b))[:5]} only-right {sorted(set(b) - set(a))[:5]}")
        return False
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or tuple(x.shape) != tuple(y.shape):
            fatal(f"{what}: {k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}")
            return False
        if x.dtype.is_floating_point:
            eq = torch.equal(x.view(-1).view(torch.int16) if x.dtype == torch.bfloat16 else x,
                             y.view(-1).view(torch.int16) if y.dtype == torch.bfloat16 else y)
        else:
            eq = torch.equal(mlx_format._as_int32_bits(x) if x.dtype != torch.int64 else x,
                             mlx_format._as_int32_bits(y) if y.dtype != torch.int64 else y)
        if not eq:
            fatal(f"{what}: {k}: values differ")
            return False
    log(f"ok: {what}: {len(a)} tensors bit-identical")
    return True


def check_roundtrip(hf_text: dict, mlx_tensors: dict, mlx_cfg: dict):
    """mlx_to_dequantized_hf(hf_to_mlx(x)) is within 4-bit quantization error of x."""
    deq = mlx_format.mlx_to_dequantized_hf(mlx_tensors, mlx_cfg)
    if set(deq) != set(hf_text):
        fatal(f"round trip key sets differ: {sorted(set(deq) ^ set(hf_text))[:8]}")
        return
    q = mlx_cfg["quantization"]
    worst = 0.0
    n_q = 0
    for k, x in hf_text.items():
        x = x.float()
        y = deq[k]
        if tuple(x.shape) != tuple(y.shape):
            fatal(f"round trip {k}: shape {tuple(y.shape)} vs {tuple(x.shape)}")
            continue
        # the mlx module path holding this tensor
        if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"):
            base = "language_model.model." + k[len("model.language_model."):].replace("experts.", "switch_mlp.")
            if k.endswith("gate_up_proj"):
                I = x.shape[1] // 2
                parts = [(x[:, :I], y[:, :I], base.replace("gate_up_proj", "gate_proj")),
                         (x[:, I:], y[:, I:], base.replace("gate_up_proj", "up_proj"))]
            else:
                parts = [(x, y, base)]
        else:
            mk = ("language_model.model." + k[len("model.language_model."):]) if k.startswith("model.language_model.") \
                else "language_model." + k
            parts = [(x, y, mk[:-len(".weight")] if mk.endswith(".weight") else mk)]
        for xo, yo, path in parts:
            if path + ".scales" in mlx_tensors:
                gs, _ = mlx_format.quant_params_for(path, q)
                sc = mlx_tensors[path + ".scales"].float().abs()
                err = (xo - yo).abs().reshape(*sc.shape, gs)
                bound = 1.6 * sc[..., None] + 1e-6
                ratio = float((err / bound).max())
                worst = max(worst, ratio)
                n_q += 1
                if ratio > 1.0:
                    fatal(f"round trip {path}: error {float(err.max()):.3g} exceeds 1.6*scale (ratio {ratio:.2f})")
            elif mlx_format._is_norm_key(path + ".weight"):
                err = float((xo - yo).abs().max())
                if err > 0.01:
                    fatal(f"round trip norm {k}: {err}")
            elif k.endswith("A_log") and hf_text[k].dtype == torch.float32:
                if not torch.equal(xo, yo):
                    fatal(f"round trip {k}: A_log not kept exactly")
            else:
                ref = hf_text[k].to(torch.bfloat16).float()
                if not torch.equal(ref, yo):
                    fatal(f"round trip {k}: not equal to bf16 of the original (max {float((ref - yo).abs().max())})")
    log(f"ok: mlx round trip: {n_q} quantized tensors, worst error / (1.6*scale) = {worst:.3f}")
    return deq


def logits_compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a - b).abs()
    return {
        "max_abs_diff": float(d.max()),
        "rms_diff": float(d.pow(2).mean().sqrt()),
        "rms_ref": float(a.pow(2).mean().sqrt()),
        "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).float().mean()),
    }


class RouterProbe:
    def __init__(self, model):
        self.hits: dict[str, list[torch.Tensor]] = {}
        self.handles = []
        for name, m in model.named_modules():
            if type(m).__name__.endswith("TopKRouter"):
                self.handles.append(m.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def f(_m, _inp, out):
            self.hits.setdefault(name, []).append(out[2].detach().cpu())
        return f

    def close(self):
        for h in self.handles:
            h.remove()


# ----------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", default="a", choices=["a", "b"])
    ap.add_argument("--seed", type=int, default=None, help="default: 1234 (a) / 5678 (b)")
    ap.add_argument("--device", default="cpu", help="device for the fp32 reference forwards (default cpu)")
    ap.add_argument("--force", action="store_true", help="overwrite existing DIR contents")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else (1234 if a.variant == "a" else 5678)
    t_start = time.time()

    import transformers
    import numpy
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {numpy.__version__}; "
        f"variant {a.variant}, seed {seed}, device {a.device}")
    rl.set_determinism()
    torch.manual_seed(seed)

    out = os.path.abspath(a.out)
    for sub in ("hf-fused", "hf-per-expert", "mlx-q4"):
        p = os.path.join(out, sub)
        if os.path.exists(p):
            if not a.force and os.listdir(p):
                log(f"{p} exists; replacing it (pass --force to silence)")
            shutil.rmtree(p)
    os.makedirs(out, exist_ok=True)

    cfg = full_config(a.variant)
    tc = cfg["text_config"]
    gcfg = generation_config()
    V, L, E = tc["vocab_size"], tc["num_hidden_layers"], tc["num_experts"]

    # ---- model + random weights
    log("building fp32 model ...")
    model = rl.build_model(cfg, dtype=torch.float32, device="cpu")
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    sd_keys = set(model.state_dict().keys())
    if sd_keys != set(params):
        warn(f"state_dict keys != parameters: {sorted(sd_keys ^ set(params))[:6]}")
    stored: dict[str, torch.Tensor] = {}
    for name, p in params.items():
        w = init_tensor(name, tuple(p.shape), gen)
        stored[name] = w.to(storage_dtype(name, a.variant)).contiguous()
    for name, shape in mtp_shapes(tc):
        stored[name] = init_tensor(name, shape, gen).to(torch.bfloat16).contiguous()
    n_model = sum(v.numel() for k, v in stored.items() if not k.startswith("mtp."))
    log(f"{len(params)} model tensors ({n_model / 1e6:.2f} M values), {len(stored) - len(params)} mtp tensors")
    rl.load_state_into(model, {k: v.float() for k, v in stored.items()}, allow_missing_prefixes=())
    model = model.to(a.device)

    ids = torch.randint(0, V, (T_IDS,), generator=gen).tolist()

    # ---- reference forward (fp32)
    log("fp32 forward (hf weights) ...")
    probe = RouterProbe(model)
    logits_hf = rl.forward_logits(model, ids)
    probe.close()
    if not torch.isfinite(logits_hf).all():
        fatal("non-finite hf logits")
    std = float(logits_hf.std())
    log(f"logits-hf: shape {tuple(logits_hf.shape)}, mean {float(logits_hf.mean()):.4f}, std {std:.4f}, "
        f"min {float(logits_hf.min()):.3f}, max {float(logits_hf.max()):.3f}; "
        f"distinct argmax {len(set(logits_hf.argmax(-1).tolist()))}/{T_IDS}")
    if std < 0.3:
        fatal(f"logit std {std:.3f} too small")
    elif std < 0.5:
        warn(f"logit std {std:.3f} < 0.5")
    router_stats = {}
    for name, hs in probe.hits.items():
        idx = torch.cat([h.reshape(-1) for h in hs])
        counts = torch.bincount(idx, minlength=E).tolist()
        router_stats[name] = counts
        used = sum(c > 0 for c in counts)
        share = max(counts) / max(1, sum(counts))
        log(f"router {name}: expert hits {counts}")
        if used < E // 2 or share > 0.6:
            fatal(f"router {name} is degenerate: {used}/{E} experts used, max share {share:.2f}")
    if len(router_stats) != L:
        warn(f"router probe saw {len(router_stats)} routers, expected {L}")

    log("greedy decode (hf, with cache) ...")
    greedy_hf = rl.greedy_decode(model, ids[:GREEDY_PROMPT], GREEDY_NEW)
    log(f"greedy_hf: {greedy_hf}")
    # consistency: teacher-forced full forward must reproduce the cached decode's argmaxes
    tf = rl.forward_logits(model, ids[:GREEDY_PROMPT] + greedy_hf[:-1])
    tf_arg = tf[GREEDY_PROMPT - 1:].argmax(-1).tolist()
    if tf_arg != greedy_hf:
        top2 = tf[GREEDY_PROMPT - 1:].topk(2, dim=-1).values
        warn(f"cached decode != teacher-forced argmax: {tf_arg} (top-2 gaps {(top2[:, 0] - top2[:, 1]).tolist()})")
    else:
        log("ok: cached greedy decode matches the teacher-forced full forward")
    greedy_generate = None
    try:
        g = model.generate(torch.tensor([ids[:GREEDY_PROMPT]], device=a.device), max_new_tokens=GREEDY_NEW,
                           min_new_tokens=GREEDY_NEW, do_sample=False, pad_token_id=0)
        greedy_generate = g[0, GREEDY_PROMPT:].tolist()
        if greedy_generate != greedy_hf:
            warn(f"model.generate gives {greedy_generate} != manual loop {greedy_hf}")
        else:
            log("ok: model.generate agrees with the manual greedy loop")
    except Exception as e:  # noqa: BLE001
        warn(f"model.generate failed (non-fatal): {e!r}"[:400])

    # ---- write HF layouts
    log("writing hf-fused / hf-per-expert ...")
    save_hf_fused(os.path.join(out, "hf-fused"), stored, cfg, gcfg)
    save_hf_per_expert(os.path.join(out, "hf-per-expert"), stored, cfg, gcfg)

    # ---- mlx conversion + reference
    log("converting to mlx 4-bit ...")
    mlx_tensors, mlx_cfg = mlx_format.hf_to_mlx(stored, cfg, generation_config=gcfg)
    mlx_format.save_mlx_checkpoint(os.path.join(out, "mlx-q4"), mlx_tensors, mlx_cfg, generation_config=gcfg)
    n_q = sum(1 for k in mlx_tensors if k.endswith(".scales"))
    log(f"mlx: {len(mlx_tensors)} tensors, {n_q} quantized modules, "
        f"8-bit overrides {sum(1 for k in mlx_cfg['quantization'] if '.' in k)}")

    hf_text = {k: v for k, v in stored.items() if not k.startswith(("mtp.", "model.visual."))}
    deq = check_roundtrip(hf_text, mlx_tensors, mlx_cfg)
    logits_mlx = None
    greedy_mlx = None
    if deq is not None:
        log("fp32 forward (dequantized mlx weights) ...")
        mmodel = rl.build_model(mlx_cfg, dtype=torch.float32, device="cpu")
        rl.load_state_into(mmodel, deq)
        mmodel = mmodel.to(a.device)
        logits_mlx = rl.forward_logits(mmodel, ids)
        if not torch.isfinite(logits_mlx).all():
            fatal("non-finite mlx logits")
        greedy_mlx = rl.greedy_decode(mmodel, ids[:GREEDY_PROMPT], GREEDY_NEW)
        del mmodel
    else:
        fatal("no mlx reference (round trip failed)")

    # ---- logits files
    T = len(ids)
    logits_hf.contiguous().numpy().astype("<f4").tofile(os.path.join(out, "logits-hf.f32"))
    if logits_mlx is not None:
        logits_mlx.contiguous().numpy().astype("<f4").tofile(os.path.join(out, "logits-mlx.f32"))
        cmp_mlx = logits_compare(logits_hf, logits_mlx)
        log(f"mlx vs hf logits: {cmp_mlx}")
    else:
        cmp_mlx = None

    ref = {
        "variant": a.variant,
        "seed": seed,
        "vocab_size": V,
        "T": T,
        "ids": ids,
        "logits": {"hf": "logits-hf.f32", "mlx": "logits-mlx.f32", "shape": [T, V], "dtype": "float32",
                   "byte_order": "little", "positions": "0..T-1, one forward pass, no cache"},
        "reference": "transformers Qwen3_5MoeForConditionalGeneration, float32 weights (bf16 checkpoint upcast), "
                     "attn_implementation=eager, experts_implementation=eager, device " + a.device,
        "greedy_prompt_len": GREEDY_PROMPT,
        "greedy_prompt": ids[:GREEDY_PROMPT],
        "greedy_hf": greedy_hf,
        "greedy_mlx": greedy_mlx,
        "greedy_generate_hf": greedy_generate,
        "layouts": {
            "hf-fused": "3 shards + index; fused mlp.experts.gate_up_proj [E,2I,H] / down_proj [E,H,I]; "
                        "model.visual.*; mtp.* with per-expert experts",
            "hf-per-expert": "single model.safetensors; mlp.experts.{e}.{gate,up,down}_proj.weight; same values",
            "mlx-q4": "mlx-lm convert -q (affine, 4-bit, g64; mlp.gate and shared_expert_gate 8-bit g64)",
        },
        "storage_dtypes": {"A_log": "F32" if a.variant == "a" else "BF16",
                           "linear_attn.norm.weight": "F32" if a.variant == "a" else "BF16",
                           "other": "BF16 (mlx: U32 codes + BF16 scales/biases, A_log kept as stored)"},
        "stats": {
            "logits_hf_std": std,
            "logits_hf_mean": float(logits_hf.mean()),
            "mlx_vs_hf": cmp_mlx,
            "router_expert_hits": router_stats,
        },
        "config": {k: tc[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                      "linear_num_key_heads", "linear_num_value_heads", "num_experts",
                                      "num_experts_per_tok", "moe_intermediate_size",
                                      "shared_expert_intermediate_size", "layer_types")},
        "eos_token_id": gcfg["eos_token_id"],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "numpy": numpy.__version__, "python": sys.version.split()[0]},
    }
    write_json(os.path.join(out, "reference.json"), ref)

    # ---- self-checks on what was written
    log("self-checks ...")
    same_tensors(mlx_format.read_checkpoint_dir(os.path.join(out, "hf-fused")), stored, "hf-fused read back")
    pe = mlx_format.read_checkpoint_dir(os.path.join(out, "hf-per-expert"))
    same_tensors(pe, split_experts(stored), "hf-per-expert read back")
    same_tensors(rl.fuse_per_expert(pe), stored, "hf-per-expert fused back")
    same_tensors(mlx_format.read_checkpoint_dir(os.path.join(out, "mlx-q4")), mlx_tensors, "mlx-q4 read back")
    with open(os.path.join(out, "logits-hf.f32"), "rb") as f:
        back = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(T, V)
    if not torch.equal(back, logits_hf):
        fatal("logits-hf.f32 read back differs")

    tol = 2e-3
    for sub in ("hf-fused", "hf-per-expert"):
        d = os.path.join(out, sub)
        try:
            m2, kind = rl.load_model_from_dir(d, dtype=torch.float32, device=a.device, loader="transformers")
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            warn(f"transformers from_pretrained({sub}) FAILED (non-fatal, files are written): {e!r}"[:600])
            continue
        # the loaded parameters must be exactly the stored values
        own = {k: v.detach().cpu() for k, v in m2.named_parameters()}
        bad = [k for k in own if k in stored and not torch.equal(own[k], stored[k].float())]
        missing = [k for k in stored if not k.startswith("mtp.") and k not in own]
        if bad or missing:
            fatal(f"from_pretrained({sub}): {len(bad)} params differ (e.g. {bad[:3]}), missing {missing[:3]}")
        l2 = rl.forward_logits(m2, ids)
        c = logits_compare(logits_hf, l2)
        if c["max_abs_diff"] > tol:
            fatal(f"from_pretrained({sub}) logits differ from the reference: {c}")
        else:
            log(f"ok: from_pretrained({sub}) reproduces logits-hf (max abs diff {c['max_abs_diff']:.3g})")
        del m2

    # the standalone tool on the mlx dir must reproduce logits-mlx
    if logits_mlx is not None:
        try:
            m3, _ = rl.load_model_from_dir(os.path.join(out, "mlx-q4"), dtype=torch.float32, device=a.device)
            c = logits_compare(logits_mlx, rl.forward_logits(m3, ids))
            if c["max_abs_diff"] > tol:
                fatal(f"reference_logits on mlx-q4 differs from logits-mlx: {c}")
            else:
                log("ok: reference_logits.load_model_from_dir(mlx-q4) reproduces logits-mlx")
            del m3
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            fatal(f"loading mlx-q4 back failed: {e!r}"[:600])

    # ---- summary
    total = 0
    for root, _, files in os.walk(out):
        for fn in sorted(files):
            p = os.path.join(root, fn)
            sz = os.path.getsize(p)
            total += sz
            log(f"  {os.path.relpath(p, out):60s} {sz:>10,d}")
    log(f"total {total / 1e6:.2f} MB in {out}; {time.time() - t_start:.1f}s")
    for w in WARN:
        log("warning:", w)
    if FATAL:
        for f_ in FATAL:
            log("FATAL:", f_)
        sys.exit(1)
    log("all self-checks passed")


if __name__ == "__main__":
    main()
