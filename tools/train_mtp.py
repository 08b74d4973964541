#!/usr/bin/env python3
"""Train an MTP head (multi-token prediction, spec §6) for lily-tiny, on the CPU, in plain torch.

lily-tiny (models/lily-tiny) was trained without one. This script gives it one, with the main
model frozen: the head learns to predict x_{i+2} from h_i (the main model's hidden row i AFTER
its final norm) and x_{i+1}, on the same kind of text lily-tiny was trained on.

    # 1. data: synthetic conversations (tools/synth_conversations.py, seeds lily-tiny's training
    #    never used; rendered by an interpreter with jinja2, --render-python), tokenized by
    #    `lily tokenize`, with the post-norm rows h_i and the main model's greedy token after each
    #    row: from lily itself (`lily logits --backend reference --hidden-out`, --rows lily), or
    #    from tools/train_tiny.py's torch module on the dequantized weights (--rows torch), checked
    #    against lily's rows on --check-lily conversations (relative 1e-4, the same greedy tokens)
    nice -n 10 /usr/bin/python3 tools/train_mtp.py data --lily build/lily --out /tmp/mtp-data \\
        --examples 700 --seed 777 --max-len 448 --rows lily
    nice -n 10 /usr/bin/python3 tools/train_mtp.py data --lily build/lily --out /tmp/mtp-data2 \\
        --examples 3000 --seed 778 --max-len 448 --rows torch --threads 1 --check-lily 24
    # 2. train the head (30 minutes), write it beside lily-tiny
    nice -n 10 /usr/bin/python3 tools/train_mtp.py train --data /tmp/mtp-data,/tmp/mtp-data2 \\
        --out models/lily-tiny --budget 1800 --threads 1

Speed: Debian's torch links the reference BLAS (about 4 GFLOP/s a core here); a training step
then takes about 30 s. OpenBLAS from Debian, unpacked for this process only (nothing installed),
makes it about 20 times faster:

    apt-get download libopenblas0-pthread && dpkg -x libopenblas0-pthread_*.deb /tmp/openblas
    export LD_LIBRARY_PATH=/tmp/openblas/usr/lib/x86_64-linux-gnu/openblas-pthread OPENBLAS_NUM_THREADS=1

The head (the HF names of spec §4: mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden,
mtp.layers.0.*, a full-attention MoE decoder layer, mtp.norm) shares the main model's
embed_tokens and lm_head (dequantized from the 4-bit checkpoint, frozen). Its forward is
tools/mtp_reference.py's, batched; `train` first checks that the batched forward equals
mtp_reference.mtp_block on one conversation (relative 1e-5), then trains:

  step 1 (teacher-forced): row i takes (h_i, x_{i+1}) at position i, predicts x_{i+2};
  step 2 (chained): row i takes (m_i, x_{i+2}) at position i+1, m_i step 1's output, attending to
          step 1's keys at positions 0..i and its own, predicts x_{i+3} (what a chained draft does).

The loss of each step is the mean of two cross-entropies at the positions where the model writes
(the assistant turns, as lily-tiny's own loss): against the text's token and against the main
model's greedy token there (they differ where lily-tiny errs; acceptance counts the latter).
The decoder layer starts from the main model's last full-attention layer, fc from [I/2, I/2].
AdamW, cosine decay over the wall-clock budget, fp32. Quantization-aware in the last 15% of the
time (fake 4-bit affine g64, straight-through), since the head is stored 4-bit.

Stored (`--out DIR`, lily-tiny's directory): DIR/mtp.safetensors, the head in the mlx layout of
the main checkpoint (norms stored as 1 + w; matrices 4-bit affine g64 as mlx writes them, the
router and shared_expert_gate bf16; experts stacked as switch_mlp), and its names added to
DIR/model.safetensors.index.json, so that lily loads the head with the model. The main weights
are not touched. DIR/mtp_train_log.txt is the log.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mlx_format  # noqa: E402
import mtp_reference as mr  # noqa: E402

mr.torch = torch  # mtp_reference imports torch lazily (its --help needs none)
ENDOFTEXT = "<|endoftext|>"
LOG_LINES: list[str] = []


def log(*a):
    line = " ".join(str(x) for x in a)
    LOG_LINES.append(line)
    print("[train-mtp]", line, flush=True)


# ----------------------------------------------------------------------------------------
# 1. Data: conversations -> ids, loss mask; lily's post-norm rows and greedy tokens
# ----------------------------------------------------------------------------------------

def tokenize_all(lily: str, model: str, texts: list[str]) -> list[list[int]]:
    """Each text's ids by lily's tokenizer, in one process: the texts joined by <|endoftext|>
    (an added token: the pieces on either side are tokenized apart), cut at its id."""
    for t in texts:
        if ENDOFTEXT in t:
            raise ValueError("a text holds <|endoftext|>: cannot use it as the separator")
    r = subprocess.run([lily, "tokenize", "-m", model], input=ENDOFTEXT.join(texts), capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"lily tokenize failed: {r.stderr[-1000:]}")
    ids = [int(x) for x in r.stdout.split()]
    sep = json.load(open(os.path.join(model, "tokenizer.json")))
    sep = next(a["id"] for a in sep["added_tokens"] if a["content"] == ENDOFTEXT)
    out, cur = [], []
    for i in ids:
        if i == sep:
            out.append(cur)
            cur = []
        else:
            cur.append(i)
    out.append(cur)
    if len(out) != len(texts):
        raise SystemExit(f"lily tokenize: {len(out)} pieces for {len(texts)} texts")
    return out


def lily_rows(lily: str, model: str, ids: list[int], tmp: str, H: int, V: int) -> tuple[np.ndarray, np.ndarray]:
    """(post-norm rows [T, H] float32, the main model's greedy token after each row [T]) from lily."""
    lp, hp = os.path.join(tmp, "l.f32"), os.path.join(tmp, "h.f32")
    cmd = [lily, "logits", "-m", model, "--backend", "reference", "--ids", ",".join(map(str, ids)), "--out", lp,
           "--hidden-out", hp]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"lily logits failed: {r.stderr[-1000:]}")
    logits = np.fromfile(lp, dtype="<f4").reshape(len(ids), V)
    return np.fromfile(hp, dtype="<f4").reshape(len(ids), H), logits.argmax(-1).astype(np.int32)


_RENDER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import synth_conversations as sc
template = sc.make_template()
json.dump([sc.segments(template, ex) for ex in sc.generate(int(sys.argv[2]), int(sys.argv[3]))], sys.stdout)
"""


def render_segments(python: str, seed: int, n: int) -> list[list[tuple[str, bool]]]:
    """tools/synth_conversations.py's conversations cut into (text, is_loss) segments, rendered by
    ``python`` (it needs jinja2, which the torch interpreter here may lack)."""
    r = subprocess.run([python, "-c", _RENDER, HERE, str(seed), str(n)], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"rendering the conversations with {python} failed (it needs jinja2; --render-python "
                         f"names another interpreter):\n{r.stderr[-1500:]}")
    return [[(t, bool(f)) for t, f in segs] for segs in json.loads(r.stdout)]


def lily_rows_all(a, seqs: list[list[int]], g) -> list[tuple[np.ndarray, np.ndarray]]:
    """lily_rows of every sequence, --jobs lily processes at a time."""
    from concurrent.futures import ThreadPoolExecutor
    t0, done = time.time(), [0]

    def one(k):
        with tempfile.TemporaryDirectory() as tmp:
            r = lily_rows(a.lily, a.model, seqs[k], tmp, g.H, g.vocab)
        done[0] += 1
        if done[0] % 50 == 0:
            log(f"  {done[0]}/{len(seqs)} conversations through lily, {time.time() - t0:.0f}s")
        return r

    with ThreadPoolExecutor(a.jobs) as pool:
        return list(pool.map(one, range(len(seqs))))


def torch_main_model(model: str):
    """lily-tiny as tools/train_tiny.py's torch module (its forward was checked against transformers
    when it was trained), loaded with the 4-bit weights dequantized (w = scale * q + bias)."""
    try:
        import jinja2  # noqa: F401
    except ImportError:  # train_tiny imports synth_conversations, which wants jinja2 only to render
        import types
        for name in ("jinja2", "jinja2.exceptions", "jinja2.ext", "jinja2.sandbox"):
            sys.modules[name] = types.ModuleType(name)
        sys.modules["jinja2.sandbox"].ImmutableSandboxedEnvironment = None
    import train_tiny
    if not hasattr(F, "scaled_dot_product_attention"):  # torch < 2.0 (Debian's 1.13)
        def sdpa(q, k, v, is_causal=True, scale=None):
            s = (q @ k.transpose(-1, -2)) * scale
            L = q.shape[-2]
            s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
            return torch.softmax(s, -1) @ v
        F.scaled_dot_product_attention = sdpa
    tensors, cfg = mlx_format.load_mlx_checkpoint(model)
    hf = mlx_format.mlx_to_dequantized_hf({k: v for k, v in tensors.items() if not k.startswith("mtp.")}, cfg)
    m = train_tiny.TinyQwen(cfg["text_config"])
    m.load_state_dict({k: v.reshape(p.shape) for (k, p), v in
                       zip(m.state_dict().items(), (train_tiny.from_published(hf)[k] for k in m.state_dict()))})
    return m.eval()


def torch_rows(m, seqs: list[list[int]], batch_tokens: int = 8192) -> list[tuple[np.ndarray, np.ndarray]]:
    """(post-norm rows [T, H], greedy token after each row [T]) of each sequence, batched by length
    (padding after the end: the forward is causal, so the real rows do not see it)."""
    out: list = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    with torch.no_grad():
        i = 0
        while i < len(order):
            L = len(seqs[order[i]])
            j = i
            while j < len(order) and len(seqs[order[j]]) * (j - i + 1) <= batch_tokens:
                L = len(seqs[order[j]])
                j += 1
            j = max(j, i + 1)
            L = max(len(seqs[order[k]]) for k in range(i, j))
            ids = torch.zeros(j - i, L, dtype=torch.long)
            for r, k in enumerate(order[i:j]):
                ids[r, : len(seqs[k])] = torch.tensor(seqs[k])
            t1 = time.time()
            h = m.hidden(ids)
            log(f"  rows of {j - i} x {L} tokens in {time.time() - t1:.1f}s")
            greedy = m.logits(h).argmax(-1)
            for r, k in enumerate(order[i:j]):
                n = len(seqs[k])
                out[k] = (h[r, :n].numpy(), greedy[r, :n].numpy().astype(np.int32))
            i = j
    return out


def check_rows_against_lily(a, seqs, rows, g, n: int):
    """The torch rows of the first n sequences against lily's (`lily logits --backend reference
    --hidden-out`): relative 1e-4 of the largest value, greedy tokens equal at 99.9% of positions."""
    worst, differ, total = 0.0, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(min(n, len(seqs))):
            h, greedy = lily_rows(a.lily, a.model, seqs[k], tmp, g.H, g.vocab)
            worst = max(worst, float(np.abs(h - rows[k][0]).max() / np.abs(h).max()))
            differ += int((greedy != rows[k][1]).sum())
            total += len(greedy)
    log(f"check: torch rows vs lily's on {min(n, len(seqs))} conversations ({total} tokens): relative {worst:.2e}, "
        f"greedy tokens differ at {differ}")
    if worst > 1e-4 or differ > total // 1000:
        raise SystemExit("the torch rows are not lily's: not writing the data")
    return {"conversations": min(n, len(seqs)), "tokens": total, "relative": worst, "greedy_differ": differ}


def make_data(a):
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    g = mr.Geometry(cfg)
    convs = render_segments(a.render_python, a.seed, a.examples)  # (segment text, loss flag) lists
    t0 = time.time()
    pieces = tokenize_all(a.lily, a.model, [s for segs in convs for s, _ in segs])
    log(f"{len(convs)} conversations (seed {a.seed}), {len(pieces)} segments tokenized in {time.time() - t0:.1f}s")
    seqs, losses, k = [], [], 0
    for segs in convs:
        ids, loss = [], []
        for _, is_loss in segs:
            ids += pieces[k]
            loss += [is_loss] * len(pieces[k])
            k += 1
        seqs.append(ids[: a.max_len])
        losses.append(loss[: a.max_len])
    t0 = time.time()
    log(f"{sum(map(len, seqs))} tokens; rows from {a.rows}")
    if a.rows == "lily":
        rows = lily_rows_all(a, seqs, g)
        check = "the rows are lily's (lily logits --backend reference --hidden-out)"
    else:
        torch.set_num_threads(a.threads)
        rows = torch_rows(torch_main_model(a.model), seqs)
        log(f"torch rows of {sum(map(len, seqs))} tokens in {time.time() - t0:.0f}s")
        check = check_rows_against_lily(a, seqs, rows, g, a.check_lily)
    offsets = np.cumsum([0] + [len(s) for s in seqs])
    os.makedirs(a.out, exist_ok=True)
    np.savez(os.path.join(a.out, "data.npz"), ids=np.concatenate([np.array(s, np.int32) for s in seqs]),
             loss=np.concatenate([np.array(m, np.bool_) for m in losses]),
             hidden=np.concatenate([r[0].astype(np.float16) for r in rows]),
             greedy=np.concatenate([r[1] for r in rows]), offsets=offsets)
    with open(os.path.join(a.out, "data.json"), "w") as f:
        json.dump({"seed": a.seed, "conversations": len(seqs), "tokens": int(offsets[-1]), "rows": a.rows,
                   "check": check}, f, indent=1)
    log(f"wrote {a.out}/data.npz: {offsets[-1]} tokens of {len(seqs)} conversations "
        f"({sum(map(sum, losses))} in assistant turns)")


# ----------------------------------------------------------------------------------------
# 2. The head: parameters (HF layout, zero-centred norms as w), batched forward
# ----------------------------------------------------------------------------------------

def main_tensors(model: str) -> dict[str, torch.Tensor]:
    tensors, cfg = mlx_format.load_mlx_checkpoint(model)
    return mlx_format.mlx_to_dequantized_hf({k: v for k, v in tensors.items() if not k.startswith("mtp.")}, cfg)


def init_head(main: dict, g: mr.Geometry, seed: int) -> dict:
    """The head's parameters: layers.0 from the main model's last full-attention layer, fc = [I/2, I/2]
    plus a little noise, norms w = 0 (gain 1)."""
    last_full = max(i for i, k in enumerate(g.layer_types) if k == "full_attention")
    p = f"model.language_model.layers.{last_full}."
    lw = mr.layer_weights(main, p, g, "cpu", torch.float32)
    torch.manual_seed(seed)
    H = g.H
    eye = torch.eye(H)
    params = {
        "fc": torch.cat([eye, eye], 1) * 0.5 + torch.randn(H, 2 * H) * (0.02 / math.sqrt(H)),
        "pre_fc_norm_embedding": torch.zeros(H),
        "pre_fc_norm_hidden": torch.zeros(H),
        "norm": main["model.language_model.norm.weight"].clone().float(),
        "input_layernorm": lw["input_layernorm"].clone(),
        "post_attention_layernorm": lw["post_attention_layernorm"].clone(),
    }
    for k, v in lw["attn"].items():
        params["attn." + k] = v.clone()
    moe = lw["moe"]
    for k in ("router", "shared_gate", "shared_up", "shared_down", "shared_expert_gate"):
        params["moe." + k] = moe[k].clone()
    for k in ("gate", "up", "down"):
        params["moe." + k] = torch.stack([x.clone() for x in moe[k]])  # [E, rows, cols]
    for v in params.values():
        v.requires_grad_(True)
    return params


def fake_quant(w: torch.Tensor) -> torch.Tensor:
    """Fake 4-bit affine g64 (mlx's quantizer), straight-through."""
    wq, s, b = mlx_format.quantize_affine(w.detach(), 64, 4)
    return w + (mlx_format.dequantize_affine(wq, s, b, 64, 4) - w).detach()


QUANTIZED = ("fc", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "moe.gate", "moe.up", "moe.down",
             "moe.shared_gate", "moe.shared_up", "moe.shared_down")


def as_reference(params: dict, qat: bool = False) -> dict:
    """The head in mtp_reference's dict form (what mtp_block takes)."""
    p = {k: (fake_quant(v) if qat and k in QUANTIZED else v) for k, v in params.items()}
    return {
        "fc": p["fc"], "pre_fc_norm_embedding": p["pre_fc_norm_embedding"],
        "pre_fc_norm_hidden": p["pre_fc_norm_hidden"], "norm": p["norm"],
        "layer": {
            "input_layernorm": p["input_layernorm"], "post_attention_layernorm": p["post_attention_layernorm"],
            "attn": {k: p["attn." + k] for k in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")},
            "moe": {k: p["moe." + k] for k in ("router", "gate", "up", "down", "shared_gate", "shared_up",
                                                "shared_down", "shared_expert_gate")},
        },
    }


def qkv(x, a, positions, g):
    """x [N, H] normed rows at positions [N] -> q [N, nq, d], gate, k [N, nkv, d], v; RoPE'd."""
    N = x.shape[0]
    qg = (x @ a["q_proj"].T).view(N, g.nq, 2 * g.d)
    q, gate = qg[..., : g.d], qg[..., g.d:]
    k = (x @ a["k_proj"].T).view(N, g.nkv, g.d)
    v = (x @ a["v_proj"].T).view(N, g.nkv, g.d)
    q = mr.rope(mr.rms_norm_zc(q, a["q_norm"], g.eps), positions, g.rotary, g.theta)
    k = mr.rope(mr.rms_norm_zc(k, a["k_norm"], g.eps), positions, g.rotary, g.theta)
    return q, gate, k, v


def attend(q, gate, keys, values, mask, g, self_kv=None):
    """Gated attention of q [B, L, nq, d] over keys / values [B, S, nkv, d] where mask [L, S] (and
    each row's own self_kv key / value, for a chained step), before o_proj: [B, L, nq * d]."""
    B, L = q.shape[:2]
    rep = g.nq // g.nkv
    K, Vv = keys.repeat_interleave(rep, 2), values.repeat_interleave(rep, 2)
    s = torch.einsum("blnd,bsnd->bnls", q, K) / math.sqrt(g.d)
    s = s.masked_fill(~mask[None, None], float("-inf"))
    if self_kv is not None:
        ks, vs = (t.repeat_interleave(rep, 2) for t in self_kv)
        s = torch.cat([s, (torch.einsum("blnd,blnd->bnl", q, ks) / math.sqrt(g.d))[..., None]], -1)
    p = torch.softmax(s, -1)
    o = torch.einsum("bnls,bsnd->blnd", p[..., : K.shape[1]], Vv)
    if self_kv is not None:
        o = o + p[..., -1].permute(0, 2, 1)[..., None] * vs
    return (o * torch.sigmoid(gate)).reshape(B, L, g.nq * g.d)


def head_input(w, embed, hidden, tokens, g):
    e = mr.rms_norm_zc(embed[tokens], w["pre_fc_norm_embedding"], g.eps)
    return torch.cat([e, mr.rms_norm_zc(hidden, w["pre_fc_norm_hidden"], g.eps)], -1) @ w["fc"].T


def layer_tail(u, o, w, g):
    """The rest of the decoder layer and the head's norm for rows u [N, H] with attention o [N, nq*d]."""
    lw = w["layer"]
    u = u + o @ lw["attn"]["o_proj"].T
    u = u + mr.sparse_moe(mr.rms_norm_zc(u, lw["post_attention_layernorm"], g.eps), lw["moe"], g)
    return mr.rms_norm_zc(u, w["norm"], g.eps)


def scatter(rows, mask, shape):
    out = torch.zeros(*shape, dtype=rows.dtype)
    out[mask] = rows
    return out


def head_steps(w, embed, lm_head, hidden, tok1, tok2, g, rows1, rows2=None):
    """Step 1 (hidden [B, L, H] = h_i, tok1 = x_{i+1}, position i) and, with rows2, the chained step 2
    (m_i, tok2 = x_{i+2}, position i+1), each computed past the attention only at its rows (masks
    [B, L]): returns [step 1 logits [rows1.sum(), V], (step 2 logits [rows2.sum(), V])], row-major.
    Every row's keys are computed (the rows wanted attend to them)."""
    B, L, H = hidden.shape
    lw, a = w["layer"], w["layer"]["attn"]
    pos = torch.arange(L)
    causal = pos[None, :] <= pos[:, None]
    u = head_input(w, embed, hidden, tok1, g).reshape(B * L, H)
    q, gate, k, v = qkv(mr.rms_norm_zc(u, lw["input_layernorm"], g.eps), a, pos.repeat(B), g)
    view = lambda t: t.view(B, L, *t.shape[1:])
    sel = rows1 | rows2 if rows2 is not None else rows1
    o = attend(view(q), view(gate), view(k), view(v), causal, g)
    m = layer_tail(u.view(B, L, H)[sel], o[sel], w, g)  # [N, H]
    out = [m[rows1[sel]] @ lm_head.T]
    if rows2 is not None:
        u2 = head_input(w, embed, m[rows2[sel]], tok2[rows2], g)  # [N2, H]
        q2, gate2, k2, v2 = qkv(mr.rms_norm_zc(u2, lw["input_layernorm"], g.eps), a, pos.expand(B, L)[rows2] + 1, g)
        full = lambda t: scatter(t, rows2, (B, L, *t.shape[1:]))
        o2 = attend(full(q2), full(gate2), view(k), view(v), causal, g, self_kv=(full(k2), full(v2)))
        out.append(layer_tail(u2, o2[rows2], w, g) @ lm_head.T)  # step 1's keys 0..i, then its own
    return out


def check_against_reference(w, embed, lm_head, hidden, ids, g):
    """The batched forward (both steps) against mtp_reference.mtp_block on one sequence: step 1 is its
    teacher-forced pass; step 2 at row i is a chained step after its rows 0..i."""
    T = hidden.shape[0]
    with torch.no_grad():
        every = torch.ones(1, T - 2, dtype=torch.bool)
        got1, got2 = head_steps(w, embed, lm_head, hidden[None, : T - 2], ids[None, 1: T - 1], ids[None, 2:T], g,
                                every, every)
        got2 = got2[None]
        want1, m = mr.mtp_block(hidden[: T - 2], ids[1: T - 1], torch.arange(T - 2), {"k": None, "v": None}, w, embed,
                                lm_head, g)
        d1 = float((got1 - want1).abs().max() / want1.abs().max())
        worst2 = 0.0
        for i in (0, T // 3, T - 3):
            cache = {"k": None, "v": None}
            mr.mtp_block(hidden[: i + 1], ids[1: i + 2], torch.arange(i + 1), cache, w, embed, lm_head, g)
            want2, _ = mr.mtp_block(m[i: i + 1], ids[i + 2: i + 3], torch.tensor([i + 1]), cache, w, embed, lm_head, g)
            worst2 = max(worst2, float((got2[0, i] - want2[0]).abs().max() / want2.abs().max()))
    log(f"self-check: batched step 1 vs mtp_reference.mtp_block {d1:.2e}, chained step 2 {worst2:.2e} (relative)")
    if d1 > 1e-5 or worst2 > 1e-5:
        raise SystemExit("self-check failed: the training forward is not mtp_reference's")


# ----------------------------------------------------------------------------------------
# 3. Training
# ----------------------------------------------------------------------------------------

class Data:
    """The data directories' conversations: validation from the first one's (fixed by the seed),
    training from the rest of them and every further directory's."""

    def __init__(self, paths: list[str], heldout_frac: float, seed: int):
        ids, loss, greedy, hidden, seqs_of = [], [], [], [], []
        base = 0
        for path in paths:
            z = np.load(os.path.join(path, "data.npz"))
            ids.append(z["ids"]), loss.append(z["loss"]), greedy.append(z["greedy"]), hidden.append(z["hidden"])
            off = z["offsets"]
            seqs_of.append([(base + int(off[i]), base + int(off[i + 1])) for i in range(len(off) - 1)
                            if off[i + 1] - off[i] >= 4])
            base += int(off[-1])
        self.ids, self.loss, self.greedy = np.concatenate(ids), np.concatenate(loss), np.concatenate(greedy)
        self.hidden = torch.from_numpy(np.concatenate(hidden))  # float16 [N, H]
        first = seqs_of[0]
        random.Random(seed).shuffle(first)
        n_val = max(1, int(len(first) * heldout_frac))
        self.val, self.train = first[:n_val], first[n_val:] + [s for more in seqs_of[1:] for s in more]

    def batch(self, seqs: list[tuple[int, int]]):
        """Padded [B, L] tensors for sequences (begin, end): hidden rows, x_{i+1}, x_{i+2}, targets
        x_{i+2}, x_{i+3} (text and main-greedy), and the loss masks of steps 1 and 2."""
        L = max(e - b for b, e in seqs) - 2
        B, H = len(seqs), self.hidden.shape[1]
        hid = torch.zeros(B, L, H)
        z = lambda: torch.zeros(B, L, dtype=torch.long)
        t1, t2, y1, y2, gy1, gy2 = z(), z(), z(), z(), z(), z()
        m1, m2 = torch.zeros(B, L, dtype=torch.bool), torch.zeros(B, L, dtype=torch.bool)
        for r, (b, e) in enumerate(seqs):
            n = e - b - 2  # rows i = 0 .. n-1 have x_{i+2}
            ids, loss, greedy = self.ids[b:e], self.loss[b:e], self.greedy[b:e]
            hid[r, :n] = self.hidden[b: b + n].float()
            t1[r, :n] = torch.from_numpy(ids[1: n + 1].astype(np.int64))
            t2[r, :n] = y1[r, :n] = torch.from_numpy(ids[2: n + 2].astype(np.int64))
            gy1[r, :n] = torch.from_numpy(greedy[1: n + 1].astype(np.int64))  # main's token after row i+1
            m1[r, :n] = torch.from_numpy(loss[2: n + 2])
            y2[r, : n - 1] = torch.from_numpy(ids[3: n + 2].astype(np.int64))
            gy2[r, : n - 1] = torch.from_numpy(greedy[2: n + 1].astype(np.int64))
            m2[r, : n - 1] = torch.from_numpy(loss[3: n + 2])
        return hid, t1, t2, (y1, gy1, m1), (y2, gy2, m2)


def step_loss(lg, y, gy, mask):
    """lg: the logits of the rows of mask, row-major."""
    return 0.5 * (F.cross_entropy(lg, y[mask]) + F.cross_entropy(lg, gy[mask])), \
        (lg.argmax(-1) == gy[mask]).float().mean()


def batches(seqs, tokens_per_batch: int, rng: random.Random):
    """Sequences grouped by length into batches of about tokens_per_batch tokens."""
    order = sorted(seqs, key=lambda s: s[1] - s[0])
    out, cur, longest = [], [], 0
    for s in order:
        longest = max(longest, s[1] - s[0])
        if cur and longest * (len(cur) + 1) > tokens_per_batch:
            out.append(cur)
            cur, longest = [], s[1] - s[0]
        cur.append(s)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def evaluate(w, embed, lm_head, data: Data, g, tokens_per_batch):
    accs, losses, n = [0.0, 0.0], [0.0, 0.0], [0, 0]
    with torch.no_grad():
        for bt in batches(data.val, tokens_per_batch, random.Random(0)):
            hid, t1, t2, s1, s2 = data.batch(bt)
            outs = head_steps(w, embed, lm_head, hid, t1, t2, g, s1[2], s2[2])
            for k, (lg, (y, gy, m)) in enumerate(zip(outs, (s1, s2))):
                cnt = int(m.sum())
                if cnt:
                    loss, acc = step_loss(lg, y, gy, m)
                    losses[k] += float(loss) * cnt
                    accs[k] += float(acc) * cnt
                    n[k] += cnt
    return [losses[k] / max(n[k], 1) for k in range(2)], [accs[k] / max(n[k], 1) for k in range(2)]


def train(a):
    torch.set_num_threads(a.threads)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    g = mr.Geometry(cfg)
    main = main_tensors(a.model)
    embed = main["model.language_model.embed_tokens.weight"].float()
    lm_head = main["lm_head.weight"].float()
    paths = a.data.split(",")
    data = Data(paths, a.heldout_frac, a.seed)
    log(f"data: {len(data.train)} training / {len(data.val)} validation conversations, {len(data.ids)} tokens")
    params = init_head(main, g, a.seed)
    b, e = data.val[0]
    check_against_reference(as_reference(params), embed, lm_head, data.hidden[b:e].float(),
                            torch.from_numpy(data.ids[b:e].astype(np.int64)), g)
    opt = torch.optim.AdamW(params.values(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    loss0, acc0 = evaluate(as_reference(params), embed, lm_head, data, g, a.batch_tokens)
    log(f"start: validation loss {loss0[0]:.3f} / {loss0[1]:.3f}, greedy agreement {acc0[0]:.3f} / {acc0[1]:.3f}")
    rng = random.Random(a.seed)
    t0, step, epoch = time.time(), 0, 0
    done = False
    l2 = acc2 = torch.tensor(float("nan"))
    while not done:
        epoch += 1
        if a.more_data and os.path.exists(os.path.join(a.more_data, "data.npz")) and a.more_data not in paths:
            paths.append(a.more_data)  # written by a `data` run beside this one
            data = Data(paths, a.heldout_frac, a.seed)
            log(f"epoch {epoch}: added {a.more_data}: {len(data.train)} training conversations, {len(data.ids)} tokens")
        for bt in batches(data.train, a.batch_tokens, rng):
            frac = (time.time() - t0) / a.budget
            if frac >= 1:
                done = True
                break
            lr = a.lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            for grp in opt.param_groups:
                grp["lr"] = lr
            hid, t1, t2, s1, s2 = data.batch(bt)
            w = as_reference(params, qat=frac > 0.85)
            chained = a.chain_weight > 0 and bool(s2[2].any())
            if not s1[2].any():
                continue
            outs = head_steps(w, embed, lm_head, hid, t1, t2, g, s1[2], s2[2] if chained else None)
            l1, acc1 = step_loss(outs[0], *s1)
            loss = l1
            if chained:
                l2, acc2 = step_loss(outs[1], *s2)
                loss = loss + a.chain_weight * l2
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
            opt.step()
            step += 1
            if step % 5 == 0:
                log(f"step {step} epoch {epoch} {time.time() - t0:.0f}s lr {lr:.2e} loss {float(l1):.3f}"
                    f"{f' / {float(l2):.3f}' if a.chain_weight > 0 else ''} agreement {float(acc1):.3f}"
                    f"{f' / {float(acc2):.3f}' if a.chain_weight > 0 else ''}")
            if step % a.eval_every == 0:
                vl, va = evaluate(as_reference(params, qat=frac > 0.85), embed, lm_head, data, g, a.batch_tokens)
                log(f"  validation: loss {vl[0]:.3f} / {vl[1]:.3f}, greedy agreement {va[0]:.3f} / {va[1]:.3f}")
    vl, va = evaluate(as_reference(params, qat=True), embed, lm_head, data, g, a.batch_tokens)
    log(f"done: {step} steps, {epoch} epochs, {time.time() - t0:.0f}s; validation (4-bit weights): loss "
        f"{vl[0]:.3f} / {vl[1]:.3f}, greedy agreement of steps 1 / 2 {va[0]:.3f} / {va[1]:.3f}")
    export(params, g, a.out)
    with open(os.path.join(a.out, "mtp_train_log.txt"), "w") as f:
        f.write("\n".join(LOG_LINES) + "\n")


# ----------------------------------------------------------------------------------------
# 4. Export: mtp.* in the main checkpoint's mlx layout, added to its index
# ----------------------------------------------------------------------------------------

def export(params: dict, g: mr.Geometry, out: str):
    p = {k: v.detach().float() for k, v in params.items()}
    L = "mtp.layers.0."
    shift = lambda w: (w + 1.0).to(torch.bfloat16)  # mlx stores the zero-centred gains as 1 + w
    t: dict[str, torch.Tensor] = {
        "mtp.pre_fc_norm_embedding.weight": shift(p["pre_fc_norm_embedding"]),
        "mtp.pre_fc_norm_hidden.weight": shift(p["pre_fc_norm_hidden"]),
        "mtp.norm.weight": shift(p["norm"]),
        L + "input_layernorm.weight": shift(p["input_layernorm"]),
        L + "post_attention_layernorm.weight": shift(p["post_attention_layernorm"]),
        L + "self_attn.q_norm.weight": shift(p["attn.q_norm"]),
        L + "self_attn.k_norm.weight": shift(p["attn.k_norm"]),
        L + "mlp.gate.weight": p["moe.router"].to(torch.bfloat16),
        L + "mlp.shared_expert_gate.weight": p["moe.shared_expert_gate"].to(torch.bfloat16),
    }
    quantized = {"mtp.fc": p["fc"], L + "self_attn.q_proj": p["attn.q_proj"], L + "self_attn.k_proj": p["attn.k_proj"],
                 L + "self_attn.v_proj": p["attn.v_proj"], L + "self_attn.o_proj": p["attn.o_proj"],
                 L + "mlp.switch_mlp.gate_proj": p["moe.gate"], L + "mlp.switch_mlp.up_proj": p["moe.up"],
                 L + "mlp.switch_mlp.down_proj": p["moe.down"],
                 L + "mlp.shared_expert.gate_proj": p["moe.shared_gate"],
                 L + "mlp.shared_expert.up_proj": p["moe.shared_up"],
                 L + "mlp.shared_expert.down_proj": p["moe.shared_down"]}
    for name, w in quantized.items():
        wq, s, b = mlx_format.quantize_affine(w.to(torch.bfloat16), 64, 4)
        t[name + ".weight"], t[name + ".scales"], t[name + ".biases"] = wq, s, b
    u32 = [k for k in t if k.endswith(".weight") and k[:-7] + ".scales" in t]
    path = os.path.join(out, "mtp.safetensors")
    mlx_format.write_safetensors(path, t, {"format": "mlx", "what": "lily-tiny's MTP head (tools/train_mtp.py)"},
                                 u32_keys=u32)
    index_path = os.path.join(out, "model.safetensors.index.json")
    index = json.load(open(index_path))
    wm = {k: v for k, v in index["weight_map"].items() if not k.startswith("mtp.")}
    wm.update({k: "mtp.safetensors" for k in t})
    index["weight_map"] = dict(sorted(wm.items()))
    with open(index_path, "w") as f:
        json.dump(index, f, indent=4)
    log(f"wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB, {len(t)} tensors) and its names in {index_path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="conversations through lily: post-norm rows and greedy tokens")
    d.add_argument("--lily", required=True, help="the lily binary")
    d.add_argument("--model", default=os.path.join(HERE, "..", "models", "lily-tiny"))
    d.add_argument("--out", required=True)
    d.add_argument("--examples", type=int, default=3000)
    d.add_argument("--seed", type=int, default=777, help="of the conversations (lily-tiny's training used others)")
    d.add_argument("--max-len", type=int, default=640)
    d.add_argument("--render-python", default="python3", help="an interpreter with jinja2 (renders the chat template)")
    d.add_argument("--jobs", type=int, default=2, help="lily processes at a time (--rows lily)")
    d.add_argument("--rows", default="lily", choices=["torch", "lily"],
                   help="the post-norm rows from lily (its reference backend, about 130 tokens/s a process on the "
                        "shared 2 cores) or from train_tiny.py's torch module (slower there: 40 tokens/s), checked "
                        "against lily's on --check-lily conversations")
    d.add_argument("--check-lily", type=int, default=24)
    d.add_argument("--threads", type=int, default=2)
    t = sub.add_parser("train", help="train the head, write it beside the model")
    t.add_argument("--data", required=True, help="data directories, comma separated (validation: the first's)")
    t.add_argument("--more-data", help="a data directory still being written: added once its data.npz exists")
    t.add_argument("--model", default=os.path.join(HERE, "..", "models", "lily-tiny"))
    t.add_argument("--out", required=True, help="the model directory to store the head in (lily-tiny's)")
    t.add_argument("--budget", type=float, default=2100, help="training seconds (default 35 minutes)")
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--batch-tokens", type=int, default=6144)
    t.add_argument("--chain-weight", type=float, default=0.5, help="weight of the chained step's loss (0: off)")
    t.add_argument("--eval-every", type=int, default=40, help="steps between validations")
    t.add_argument("--heldout-frac", type=float, default=0.03)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.cmd == "data":
        make_data(a)
    else:
        train(a)


if __name__ == "__main__":
    main()
