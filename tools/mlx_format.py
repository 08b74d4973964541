"""MLX (mlx-lm) checkpoint format helpers for Qwen3.6-35B-A3B (model_type qwen3_5_moe).

Written from the behaviour described in docs/spec (spec §5b) and the mlx / mlx-lm sources:

* ``quantize_affine`` reproduces MLX's GPU affine quantizer (Metal ``affine_quantize`` /
  CUDA ``affine_quantize.cu``): all arithmetic in fp32, per group of ``group_size`` inputs
  ``w_min = min(w)``, ``w_max = max(0, max(w))`` (the kernels start the max reduction at
  0), ``scale = max((w_max - w_min) / (2^bits - 1), 1e-7)``, the edge with the larger
  magnitude becomes the bias (the scale is negated when that edge is the max), the scale is
  snapped so that the edge is exactly ``q0 * scale`` (``q0 = round(edge / scale)``),
  ``q = min(round((w - bias) / scale), 2^bits - 1)`` with round-half-away-from-zero (Metal /
  CUDA ``round``), and only the *stored* scale / bias are rounded to the weight dtype (bf16).
* Packing: little-endian uint32 words of ``32 / bits`` codes; code ``j`` of word ``w`` is
  input column ``(32 / bits) * w + j`` and sits in bits ``[bits*j, bits*j + bits)``.
* ``hf_to_mlx`` mirrors mlx-lm ``qwen3_5_moe.Model.sanitize`` + ``convert`` (cast to the
  config dtype except ``A_log``) + ``quantize_model`` (4-bit g64, 8-bit g64 for paths ending
  in ``mlp.gate`` / ``shared_expert_gate``) + ``save_config``.

Only torch / numpy are needed (no safetensors / mlx): the safetensors reader / writer
below is a minimal implementation of the documented file format, so that U32 tensors
work with any torch / safetensors version.
"""

from __future__ import annotations

import copy
import json
import os
import re
import struct
from typing import Any, Iterable

import numpy as np
import torch

# ----------------------------------------------------------------------------------------
# safetensors I/O (format: u64 LE header length, JSON header, raw little-endian data)
# ----------------------------------------------------------------------------------------

_HAS_U32 = hasattr(torch, "uint32")

_ST_DTYPES = {
    # name: (numpy dtype used for raw bytes, torch dtype to produce)
    "F32": (np.float32, torch.float32),
    "F16": (np.float16, torch.float16),
    "BF16": (np.int16, torch.bfloat16),  # raw bits, re-viewed as bf16
    "F64": (np.float64, torch.float64),
    "I64": (np.int64, torch.int64),
    "I32": (np.int32, torch.int32),
    "I16": (np.int16, torch.int16),
    "I8": (np.int8, torch.int8),
    "U8": (np.uint8, torch.uint8),
    "BOOL": (np.bool_, torch.bool),
    "U32": (np.int32, None),  # raw bits, re-viewed as uint32 when torch has it
}


def _torch_to_st(t: torch.Tensor) -> tuple[str, bytes]:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return "BF16", t.view(torch.int16).numpy().tobytes()
    if _HAS_U32 and t.dtype == torch.uint32:
        return "U32", t.view(torch.int32).numpy().tobytes()
    names = {
        torch.float32: "F32", torch.float16: "F16", torch.float64: "F64",
        torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
        torch.uint8: "U8", torch.bool: "BOOL",
    }
    if t.dtype not in names:
        raise TypeError(f"unsupported dtype {t.dtype}")
    return names[t.dtype], t.numpy().tobytes()


def write_safetensors(path: str, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None,
                      u32_keys: Iterable[str] = ()) -> None:
    """Write a .safetensors file. Keys in ``u32_keys`` holding int32 tensors are tagged U32
    (used when torch has no uint32 dtype)."""
    u32_keys = set(u32_keys)
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        dt, raw = _torch_to_st(t)
        if name in u32_keys and dt == "I32":
            dt = "U32"
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a .safetensors file -> (tensors, metadata). U32 comes back as torch.uint32 when
    available, else as int32 with the same bits."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    meta = header.pop("__metadata__", {}) or {}
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in _ST_DTYPES:
            raise TypeError(f"{path}: {name}: unsupported dtype {dt}")
        npdt, tdt = _ST_DTYPES[dt]
        s, e = info["data_offsets"]
        arr = np.frombuffer(data, dtype=npdt, count=(e - s) // np.dtype(npdt).itemsize, offset=base + s)
        t = torch.from_numpy(arr.copy()).reshape(info["shape"])
        if dt == "BF16":
            t = t.view(torch.bfloat16)
        elif dt == "U32" and _HAS_U32:
            t = t.view(torch.uint32)
        out[name] = t
    return out, meta


def read_checkpoint_dir(d: str) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (index-sharded or single model.safetensors)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    files: list[str]
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(x for x in os.listdir(d) if x.endswith(".safetensors"))
    out: dict[str, torch.Tensor] = {}
    for fn in files:
        t, _ = read_safetensors(os.path.join(d, fn))
        for k in t:
            if k in out:
                raise ValueError(f"duplicate tensor {k} in {d}")
        out.update(t)
    return out


def _as_int32_bits(wq: torch.Tensor) -> torch.Tensor:
    if _HAS_U32 and wq.dtype == torch.uint32:
        return wq.view(torch.int32)
    if wq.dtype == torch.int32:
        return wq
    if wq.dtype == torch.int64:
        return torch.where(wq >= 2**31, wq - 2**32, wq).to(torch.int32)
    raise TypeError(f"packed weights must be uint32/int32, got {wq.dtype}")


def _int32_to_u32(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint32) if _HAS_U32 else t


# ----------------------------------------------------------------------------------------
# affine quantization
# ----------------------------------------------------------------------------------------

def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    t = torch.trunc(x)
    frac = x - t  # exact in floating point
    return t + torch.where(frac.abs() >= 0.5, torch.sign(x), torch.zeros_like(x))


def quantize_affine(w: torch.Tensor, group_size: int = 64, bits: int = 4):
    """MLX affine quantization of ``w`` [..., in] along the last axis.

    Returns (wq uint32 [..., in*bits/32], scales [..., in/group], biases [..., in/group]);
    scales / biases have w's dtype when it is a float16/bfloat16/float32 dtype (MLX keeps the
    weight dtype), so pass bf16 weights to get bf16 scales as in mlx-lm checkpoints.
    """
    if bits not in (2, 4, 8):
        raise ValueError("bits must be 2, 4 or 8")
    if w.ndim < 2:
        raise ValueError("quantize needs at least 2 dims")
    in_dim = w.shape[-1]
    if in_dim % group_size:
        raise ValueError(f"last dim {in_dim} not divisible by group size {group_size}")
    out_dtype = w.dtype if w.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32
    lead = tuple(w.shape[:-1])
    g = w.detach().to(torch.float32).reshape(-1, in_dim // group_size, group_size)
    n_bins = float((1 << bits) - 1)
    w_min = g.amin(dim=-1)
    w_max = torch.clamp(g.amax(dim=-1), min=0.0)  # the GPU kernels start the max at 0
    scale = torch.clamp((w_max - w_min) / n_bins, min=1e-7)
    side = w_min.abs() > w_max.abs()
    scale = torch.where(side, scale, -scale)
    edge = torch.where(side, w_min, w_max)
    q0 = _round_half_away(edge / scale)
    at_zero = q0 == 0
    scale = torch.where(at_zero, scale, edge / torch.where(at_zero, torch.ones_like(q0), q0))
    bias = torch.where(at_zero, torch.zeros_like(edge), edge)
    q = _round_half_away((g - bias[..., None]) / scale[..., None])
    q = torch.clamp(q, 0.0, n_bins).to(torch.int64)  # [rows, groups, group_size]
    per = 32 // bits
    q = q.reshape(-1, in_dim // per, per)
    shifts = (torch.arange(per, dtype=torch.int64) * bits)
    packed = (q << shifts).sum(dim=-1)  # < 2^32
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    wq = _int32_to_u32(packed.reshape(*lead, in_dim // per))
    scales = scale.reshape(*lead, in_dim // group_size).to(out_dtype)
    biases = bias.reshape(*lead, in_dim // group_size).to(out_dtype)
    return wq, scales, biases


def unpack_codes(wq: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """uint32 [..., n] -> int64 codes [..., n * 32/bits] (low bits first)."""
    w = _as_int32_bits(wq).to(torch.int64) & 0xFFFFFFFF
    per = 32 // bits
    shifts = torch.arange(per, dtype=torch.int64) * bits
    codes = (w[..., None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(*w.shape[:-1], w.shape[-1] * per)


def dequantize_affine(wq: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                      group_size: int = 64, bits: int = 4) -> torch.Tensor:
    """w = scale * q + bias, in float32."""
    q = unpack_codes(wq, bits).to(torch.float32)
    in_dim = q.shape[-1]
    if scales.shape[-1] * group_size != in_dim:
        raise ValueError(f"shape mismatch: codes {tuple(q.shape)} scales {tuple(scales.shape)} g{group_size} b{bits}")
    q = q.reshape(*q.shape[:-1], in_dim // group_size, group_size)
    w = q * scales.to(torch.float32)[..., None] + biases.to(torch.float32)[..., None]
    return w.reshape(*q.shape[:-2], in_dim)


# ----------------------------------------------------------------------------------------
# HF <-> MLX conversion
# ----------------------------------------------------------------------------------------

# zero-centred RMSNorm weights (stored as w in HF, as 1+w in MLX); linear_attn.norm is NOT one
_NORM_SUFFIXES = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)

# modules that are nn.Linear / nn.Embedding / SwitchLinear in mlx-lm's qwen3_5(_moe) model
_QUANT_MODULE_RE = re.compile(
    r"(embed_tokens|lm_head|in_proj_qkv|in_proj_z|in_proj_a|in_proj_b|out_proj|"
    r"q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|mlp\.gate|shared_expert_gate)$"
)

_MLX_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def text_config_of(config: dict) -> dict:
    return config.get("text_config", config)


def _is_norm_key(k: str) -> bool:
    return any(k.endswith(s) for s in _NORM_SUFFIXES)


def _normalize_experts(w: dict, prefix: str, num_experts: int) -> None:
    fused_gu = f"{prefix}.experts.gate_up_proj"
    fused_d = f"{prefix}.experts.down_proj"
    stacked = [f"{prefix}.switch_mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    per = [f"{prefix}.experts.{e}.{n}.weight" for e in range(num_experts) for n in ("gate_proj", "up_proj", "down_proj")]
    has_fused = fused_gu in w or fused_d in w
    has_stacked = any(k in w for k in stacked)
    has_per = any(k in w for k in per)
    if has_fused + has_stacked + has_per == 0:
        return
    if has_fused + has_stacked + has_per != 1:
        raise ValueError(f"mixed MoE expert layouts at {prefix}")
    if has_fused:
        gu = w.pop(fused_gu)
        mid = gu.shape[-2] // 2
        w[stacked[0]] = gu[..., :mid, :].contiguous()
        w[stacked[1]] = gu[..., mid:, :].contiguous()
        w[stacked[2]] = w.pop(fused_d)
    elif has_per:
        missing = [k for k in per if k not in w]
        if missing:
            raise ValueError(f"incomplete per-expert weights at {prefix}: {missing[0]}")
        for i, n in enumerate(("gate_proj", "up_proj", "down_proj")):
            w[stacked[i]] = torch.stack([w.pop(f"{prefix}.experts.{e}.{n}.weight") for e in range(num_experts)])


def quant_params_for(path: str, quantization: dict) -> tuple[int, int]:
    """(group_size, bits) used for module ``path`` under an mlx config 'quantization' dict."""
    ov = quantization.get(path)
    if isinstance(ov, dict):
        return int(ov.get("group_size", quantization["group_size"])), int(ov.get("bits", quantization["bits"]))
    return int(quantization["group_size"]), int(quantization["bits"])


def hf_to_mlx(hf_tensors: dict[str, torch.Tensor], config: dict, generation_config: dict | None = None,
              group_size: int = 64, bits: int = 4):
    """What ``mlx_lm.convert --quantize`` (defaults: affine, 4-bit, g64) produces for a
    qwen3_5_moe HF checkpoint. Returns (mlx_tensors, mlx_config)."""
    tc = text_config_of(config)
    n_layers = int(tc["num_hidden_layers"])
    n_exp = int(tc["num_experts"])
    tie = bool(tc.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))

    # --- outer sanitize: drop vision, rename prefixes
    w: dict[str, torch.Tensor] = {}
    for k, v in hf_tensors.items():
        if k.startswith("vision_tower") or k.startswith("model.visual"):
            continue
        if k.startswith("model.language_model.mtp."):
            k = k.replace("model.language_model.", "language_model.", 1)
        elif k.startswith("model.language_model"):
            k = k.replace("model.language_model", "language_model.model", 1)
        elif not k.startswith("language_model."):
            k = "language_model." + k
        w[k] = v
    for i in range(n_layers):
        _normalize_experts(w, f"language_model.model.layers.{i}.mlp", n_exp)
    for i in range(int(tc.get("mtp_num_hidden_layers", 0) or 0)):
        _normalize_experts(w, f"language_model.mtp.layers.{i}.mlp", n_exp)

    # --- inner sanitize
    unsanitized_conv = any("conv1d.weight" in k and v.shape[-1] != 1 for k, v in w.items())
    w = {k: v for k, v in w.items() if "mtp." not in k}
    if tie:
        w.pop("language_model.lm_head.weight", None)
    for k in list(w):
        v = w[k]
        if "conv1d.weight" in k and v.shape[-1] != 1:
            w[k] = v.movedim(2, 1).contiguous()
        if unsanitized_conv and _is_norm_key(k) and v.ndim == 1:
            w[k] = (v.to(torch.float32) + 1.0).to(v.dtype)  # MLX adds in the stored dtype

    # --- cast (mlx_lm.convert: dtype from config torch_dtype / text_config dtype; A_log kept)
    dtype_name = config.get("torch_dtype") or tc.get("dtype") or config.get("dtype")
    if dtype_name in _MLX_DTYPES:
        dt = _MLX_DTYPES[dtype_name]
        for k in list(w):
            if k.endswith("A_log"):
                continue
            if w[k].is_floating_point():
                w[k] = w[k].to(dt)

    # --- quantize
    quantization: dict[str, Any] = {"group_size": group_size, "bits": bits, "mode": "affine"}
    out: dict[str, torch.Tensor] = {}
    for k in _mlx_param_order(w):
        v = w[k]
        path = k[: -len(".weight")] if k.endswith(".weight") else None
        if path is not None and _QUANT_MODULE_RE.search(path) and v.shape[-1] % group_size == 0 and v.ndim >= 2:
            gs, b = group_size, bits
            if path.endswith("mlp.gate") or path.endswith("shared_expert_gate"):
                gs, b = 64, 8
                quantization[path] = {"group_size": 64, "bits": 8}
            wq, sc, bi = quantize_affine(v, gs, b)
            out[path + ".weight"] = wq
            out[path + ".scales"] = sc
            out[path + ".biases"] = bi
        else:
            out[k] = v

    # --- config (load_config merges generation_config eos; save_config drops vision_config)
    cfg = copy.deepcopy(config)
    if generation_config and generation_config.get("eos_token_id", False):
        cfg["eos_token_id"] = generation_config["eos_token_id"]
    cfg["quantization"] = quantization
    cfg["quantization_config"] = copy.deepcopy(quantization)
    cfg.pop("_name_or_path", None)
    cfg.pop("vision_config", None)
    cfg = dict(sorted(cfg.items()))
    return out, cfg


def _mlx_param_order(w: dict) -> list[str]:
    def key(k: str):
        return [int(p) if p.isdigit() else p for p in k.split(".")]
    return sorted(w, key=lambda k: [(0, x) if isinstance(x, int) else (1, x) for x in key(k)])


def mlx_to_dequantized_hf(mlx_tensors: dict[str, torch.Tensor], mlx_config: dict) -> dict[str, torch.Tensor]:
    """Dequantize an mlx-lm checkpoint back to float32 HF names (fused experts, conv1d
    [C,1,K], zero-centred norms shifted back by -1 in float32). No vision / MTP keys."""
    quantization = mlx_config.get("quantization") or mlx_config.get("quantization_config")
    w: dict[str, torch.Tensor] = {}
    done = set()
    for k, v in mlx_tensors.items():
        if k.endswith(".scales"):
            path = k[: -len(".scales")]
            if quantization is None:
                raise ValueError("quantized tensors but no quantization config")
            gs, b = quant_params_for(path, quantization)
            w[path + ".weight"] = dequantize_affine(mlx_tensors[path + ".weight"], v,
                                                    mlx_tensors[path + ".biases"], gs, b)
            done.update({path + ".weight", path + ".scales", path + ".biases"})
    for k, v in mlx_tensors.items():
        if k in done:
            continue
        w[k] = v.to(torch.float32)

    hf: dict[str, torch.Tensor] = {}
    for k, v in w.items():
        if k.startswith("vision_tower") or "mtp." in k:
            continue
        if "conv1d.weight" in k and v.ndim == 3 and v.shape[-1] == 1:
            v = v.movedim(2, 1).contiguous()
        if _is_norm_key(k) and v.ndim == 1:
            v = v - 1.0
        if k.startswith("language_model.model."):
            nk = "model.language_model." + k[len("language_model.model."):]
        elif k.startswith("language_model."):
            nk = k[len("language_model."):]
        else:
            nk = k
        hf[nk] = v
    for k in [k for k in hf if ".switch_mlp.gate_proj.weight" in k]:
        pre = k[: -len(".switch_mlp.gate_proj.weight")]
        g = hf.pop(k)
        u = hf.pop(pre + ".switch_mlp.up_proj.weight")
        d = hf.pop(pre + ".switch_mlp.down_proj.weight")
        hf[pre + ".experts.gate_up_proj"] = torch.cat([g, u], dim=-2).contiguous()
        hf[pre + ".experts.down_proj"] = d.contiguous()
    return hf


def save_mlx_checkpoint(out_dir: str, mlx_tensors: dict[str, torch.Tensor], mlx_config: dict,
                        generation_config: dict | None = None) -> None:
    """Write config.json (sorted keys, indent 4), model.safetensors (metadata format=mlx) and
    model.safetensors.index.json as mlx-lm's save does; optionally generation_config.json."""
    os.makedirs(out_dir, exist_ok=True)
    u32 = [k for k, v in mlx_tensors.items() if k.endswith(".weight") and (k[:-7] + ".scales") in mlx_tensors]
    write_safetensors(os.path.join(out_dir, "model.safetensors"), mlx_tensors, {"format": "mlx"}, u32_keys=u32)
    total = sum(v.numel() * v.element_size() for v in mlx_tensors.values())
    n_params = 0
    quantization = mlx_config.get("quantization", {})
    for k, v in mlx_tensors.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        if k in u32:
            _, b = quant_params_for(k[:-7], quantization)
            n_params += v.numel() * 32 // b
        else:
            n_params += v.numel()
    index = {"metadata": {"total_size": total, "total_parameters": n_params},
             "weight_map": {k: "model.safetensors" for k in sorted(mlx_tensors)}}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=4)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(dict(sorted(mlx_config.items())), f, indent=4)
    if generation_config is not None:
        with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
            json.dump(generation_config, f, indent=2)


def load_mlx_checkpoint(d: str) -> tuple[dict[str, torch.Tensor], dict]:
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return read_checkpoint_dir(d), cfg


def is_mlx_checkpoint(d: str) -> bool:
    try:
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
    except OSError:
        return False
    return "quantization" in cfg or ("quantization_config" in cfg and "group_size" in cfg["quantization_config"])
