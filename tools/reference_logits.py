#!/usr/bin/env python3
"""Reference logits from transformers for a qwen3_5_moe checkpoint.

    python3 tools/reference_logits.py --model DIR --ids FILE --out FILE.f32
        [--dtype float32|bfloat16] [--device cpu|cuda] [--loader auto|transformers|manual]

DIR is an HF layout (fused 3-D experts or per-expert, sharded or not) or an mlx-lm 4-bit
layout (config.json has "quantization"); mlx weights are dequantized to float32
(tools/mlx_format.mlx_to_dequantized_hf) and loaded into a fresh transformers model.
FILE holds token ids separated by spaces / commas / newlines, or a JSON list (or a JSON
object with an "ids" list, e.g. a fixture's reference.json).
Writes float32 little-endian logits [T, vocab] (one forward pass over all T ids, eager
attention, eager experts, positions 0..T-1).

Also imported by tools/make_fixtures.py for its model helpers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlx_format  # noqa: E402


def log(*a):
    print("[ref]", *a, flush=True)


def set_determinism():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        torch.set_float32_matmul_precision("highest")
    except Exception:
        pass
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
    except Exception:
        pass


def _config_classes():
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration
    return Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration


def make_config(config_dict: dict):
    """transformers config object from a config.json dict (nested or flat text config)."""
    Qwen3_5MoeConfig, _ = _config_classes()
    d = dict(config_dict)
    for k in ("quantization", "quantization_config", "transformers_version", "architectures", "eos_token_id",
              "bos_token_id", "pad_token_id"):
        d.pop(k, None)
    if "text_config" not in d:
        # flattened text-only export (some mlx configs): wrap it
        tc = {k: v for k, v in config_dict.items() if k not in ("model_type", "quantization", "quantization_config")}
        tc["model_type"] = "qwen3_5_moe_text"
        d = {"text_config": tc, "tie_word_embeddings": tc.get("tie_word_embeddings", False)}
    d["model_type"] = "qwen3_5_moe"
    if "vision_config" not in d:
        # mlx-lm drops vision_config; the transformers default would build a 27-block ViT
        d["vision_config"] = {"model_type": "qwen3_5_moe_vision", "depth": 1, "hidden_size": 32,
                              "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
                              "num_position_embeddings": 16,
                              "out_hidden_size": d["text_config"]["hidden_size"]}
    return Qwen3_5MoeConfig.from_dict(d)


def build_model(config_dict: dict, dtype=torch.float32, device="cpu"):
    """A fresh Qwen3_5MoeForConditionalGeneration with eager attention / eager experts."""
    _, Cls = _config_classes()
    cfg = make_config(config_dict)
    kw = dict(attn_implementation="eager", experts_implementation="eager", dtype=dtype)
    try:
        model = Cls._from_config(cfg, **kw)
    except TypeError:
        kw.pop("experts_implementation")
        model = Cls._from_config(cfg, **kw)
    _force_eager(model)
    return model.to(device).eval()


def _force_eager(model):
    for c in [model.config] + [getattr(model.config, n, None) for n in ("text_config", "vision_config")]:
        if c is None:
            continue
        for attr in ("_attn_implementation", "_experts_implementation"):
            try:
                setattr(c, attr, "eager")
            except Exception:
                pass
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception as e:  # noqa: BLE001
            log("note: set_experts_implementation failed:", repr(e)[:200])


_PER_EXPERT_RE = re.compile(r"^(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def fuse_per_expert(state: dict[str, torch.Tensor], skip_prefixes=("mtp.",)) -> dict[str, torch.Tensor]:
    """Convert per-expert keys of the main layers to fused gate_up_proj / down_proj."""
    groups: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    out = {}
    for k, v in state.items():
        m = _PER_EXPERT_RE.match(k)
        if m and not k.startswith(skip_prefixes):
            groups.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = v
        else:
            out[k] = v
    for pre, ex in groups.items():
        n = max(ex) + 1
        if sorted(ex) != list(range(n)):
            raise ValueError(f"{pre}: missing experts")
        g = torch.stack([ex[e]["gate_proj"] for e in range(n)])
        u = torch.stack([ex[e]["up_proj"] for e in range(n)])
        out[pre + ".experts.gate_up_proj"] = torch.cat([g, u], dim=1).contiguous()
        out[pre + ".experts.down_proj"] = torch.stack([ex[e]["down_proj"] for e in range(n)]).contiguous()
    return out


def load_state_into(model, state: dict[str, torch.Tensor], allow_missing_prefixes=("model.visual.",)):
    """Copy ``state`` (HF names, fused experts) into ``model``; MTP keys are ignored. Raises
    if a text parameter is missing or a shape differs."""
    own = dict(model.named_parameters())
    missing = [k for k in own if k not in state and not k.startswith(allow_missing_prefixes)]
    if missing:
        raise KeyError(f"{len(missing)} parameters missing from checkpoint, e.g. {missing[:5]}")
    unexpected = [k for k in state if k not in own and not k.startswith("mtp.")]
    if unexpected:
        raise KeyError(f"{len(unexpected)} unexpected tensors, e.g. {unexpected[:5]}")
    with torch.no_grad():
        for k, p in own.items():
            if k not in state:
                continue
            v = state[k]
            if tuple(v.shape) != tuple(p.shape):
                raise ValueError(f"{k}: checkpoint shape {tuple(v.shape)} != model {tuple(p.shape)}")
            p.copy_(v.to(device=p.device, dtype=p.dtype))


@torch.no_grad()
def forward_logits(model, ids: list[int]) -> torch.Tensor:
    """float32 logits [T, vocab] for one sequence, positions 0..T-1, no cache."""
    dev = next(model.parameters()).device
    x = torch.tensor([ids], dtype=torch.long, device=dev)
    pos = torch.arange(len(ids), device=dev)[None]
    out = model(input_ids=x, position_ids=pos, use_cache=False)
    return out.logits[0].float().cpu()


@torch.no_grad()
def greedy_decode(model, prompt: list[int], n_new: int) -> list[int]:
    """Greedy continuation with the model's own cache: one prefill, then 1-token steps."""
    dev = next(model.parameters()).device
    x = torch.tensor([prompt], dtype=torch.long, device=dev)
    pos = torch.arange(len(prompt), device=dev)[None]
    out = model(input_ids=x, position_ids=pos, use_cache=True)
    cache = out.past_key_values
    nxt = int(out.logits[0, -1].float().argmax())
    gen = [nxt]
    p = len(prompt)
    while len(gen) < n_new:
        out = model(input_ids=torch.tensor([[nxt]], device=dev), position_ids=torch.tensor([[p]], device=dev),
                    past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        nxt = int(out.logits[0, -1].float().argmax())
        gen.append(nxt)
        p += 1
    return gen


def read_ids(path: str) -> list[int]:
    with open(path) as f:
        s = f.read().strip()
    if s.startswith("[") or s.startswith("{"):
        j = json.loads(s)
        if isinstance(j, dict):
            j = j["ids"]
        return [int(x) for x in j]
    return [int(x) for x in re.split(r"[\s,]+", s) if x]


def load_model_from_dir(d: str, dtype=torch.float32, device="cpu", loader="auto"):
    """(model, kind) for an HF (fused / per-expert) or mlx 4-bit directory."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    if mlx_format.is_mlx_checkpoint(d):
        log("mlx layout: dequantizing", d)
        tensors, mcfg = mlx_format.load_mlx_checkpoint(d)
        state = mlx_format.mlx_to_dequantized_hf(tensors, mcfg)
        model = build_model(mcfg, dtype=dtype, device=device)
        load_state_into(model, state)
        return model, "mlx"
    if loader in ("auto", "transformers"):
        try:
            _, Cls = _config_classes()
            kw = dict(dtype=dtype, attn_implementation="eager", experts_implementation="eager")
            try:
                model = Cls.from_pretrained(d, **kw)
            except TypeError:
                kw.pop("experts_implementation")
                model = Cls.from_pretrained(d, **kw)
            _force_eager(model)
            return model.to(device).eval(), "hf-transformers"
        except Exception as e:  # noqa: BLE001
            if loader == "transformers":
                raise
            log("from_pretrained failed, falling back to the manual loader:", repr(e)[:500])
    state = fuse_per_expert(mlx_format.read_checkpoint_dir(d))
    model = build_model(cfg, dtype=dtype, device=device)
    load_state_into(model, state)
    return model, "hf-manual"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--loader", default="auto", choices=["auto", "transformers", "manual"])
    a = ap.parse_args()
    set_determinism()
    ids = read_ids(a.ids)
    log(f"{len(ids)} ids from {a.ids}")
    t0 = time.time()
    model, kind = load_model_from_dir(a.model, dtype=getattr(torch, a.dtype), device=a.device, loader=a.loader)
    log(f"loaded {a.model} via {kind} in {time.time() - t0:.1f}s")
    logits = forward_logits(model, ids)
    vocab = model.config.text_config.vocab_size
    assert logits.shape == (len(ids), vocab), logits.shape
    assert torch.isfinite(logits).all(), "non-finite logits"
    logits.contiguous().numpy().astype("<f4").tofile(a.out)
    log(f"wrote {a.out}: [{len(ids)}, {vocab}] float32; std {logits.std():.4f}; "
        f"argmax[:8] {logits.argmax(-1)[:8].tolist()}")


if __name__ == "__main__":
    main()
