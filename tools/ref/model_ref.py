"""PyTorch reference for apiary's GPT-2 and LLaMA (tests/model/model_ref_test.cc).

Reads DIR/config.json, DIR/params.safetensors (apiary's initial parameters,
by apiary's names) and DIR/batch.safetensors (tokens and targets, one batch
per step); writes DIR/ref.safetensors with, for the first batch, the logits,
the loss and every parameter's gradient, and the losses of `steps` AdamW
steps. Everything runs in float64 so the reference is not itself the source
of disagreement with apiary's float32.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402


def layernorm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def causal_attention(q, k, v):
    # q (B, NH, T, HS); k, v (B, NH, T, HS) after repeating kv heads.
    T, hs = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf"))
    return torch.softmax(att, dim=-1) @ v


def rope(x, theta):
    # x (B, T, H, HS); Hugging Face LLaMA's rotate-half convention, angles in float64.
    B, T, H, hs = x.shape
    half = hs // 2
    inv = 1.0 / (theta ** (np.arange(0, half, dtype=np.float64) * 2 / hs))
    inv = inv.astype(np.float32).astype(np.float64)
    ang = torch.tensor(np.outer(np.arange(T, dtype=np.float64), inv))
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def forward(cfg, P, tok):
    B, T = tok.shape
    C, NH, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    HS = C // NH
    eps = cfg["norm_eps"]
    if cfg["arch"] == "gpt2":
        x = P["wte.weight"][tok] + P["wpe.weight"][:T]
        for l in range(L):
            p = f"h.{l}."
            h = layernorm(x, P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
            qkv = h @ P[p + "attn.c_attn.weight"].T + P[p + "attn.c_attn.bias"]
            q, k, v = qkv.split(C, dim=-1)
            q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
            y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
            x = x + y @ P[p + "attn.c_proj.weight"].T + P[p + "attn.c_proj.bias"]
            h = layernorm(x, P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
            f = F.gelu(h @ P[p + "mlp.c_fc.weight"].T + P[p + "mlp.c_fc.bias"], approximate="tanh")
            x = x + f @ P[p + "mlp.c_proj.weight"].T + P[p + "mlp.c_proj.bias"]
        x = layernorm(x, P["ln_f.weight"], P["ln_f.bias"], eps)
        head = P["wte.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    else:
        KVH = cfg["n_kv_head"]
        G = NH // KVH
        x = P["model.embed_tokens.weight"][tok]
        for l in range(L):
            p = f"model.layers.{l}."
            h = rmsnorm(x, P[p + "input_layernorm.weight"], eps)
            q = (h @ P[p + "self_attn.q_proj.weight"].T).view(B, T, NH, HS)
            k = (h @ P[p + "self_attn.k_proj.weight"].T).view(B, T, KVH, HS)
            v = (h @ P[p + "self_attn.v_proj.weight"].T).view(B, T, KVH, HS)
            q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
            k = k.repeat_interleave(G, dim=2)
            v = v.repeat_interleave(G, dim=2)
            y = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            y = y.transpose(1, 2).reshape(B, T, C)
            x = x + y @ P[p + "self_attn.o_proj.weight"].T
            h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps)
            g = F.silu(h @ P[p + "mlp.gate_proj.weight"].T) * (h @ P[p + "mlp.up_proj.weight"].T)
            x = x + g @ P[p + "mlp.down_proj.weight"].T
        x = rmsnorm(x, P["model.norm.weight"], eps)
        head = P["model.embed_tokens.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    return x @ head.T


def main(d):
    torch.set_num_threads(1)
    cfg = json.load(open(os.path.join(d, "config.json")))
    params = safetensors_np.load(os.path.join(d, "params.safetensors"))
    batch = safetensors_np.load(os.path.join(d, "batch.safetensors"))
    P = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    tokens = torch.tensor(batch["tokens"], dtype=torch.long)    # (steps, B, T)
    targets = torch.tensor(batch["targets"], dtype=torch.long)  # (steps, B, T)
    V = cfg["vocab_size"]

    def loss_of(step):
        logits = forward(cfg, P, tokens[step])
        loss = F.cross_entropy(logits.reshape(-1, V), targets[step].reshape(-1), ignore_index=-1)
        return logits, loss

    out = {}
    logits, loss = loss_of(0)
    loss.backward()
    out["logits"] = logits.detach().numpy()
    out["loss"] = np.array([loss.item()])
    for k, p in P.items():
        out["grad." + k] = p.grad.numpy().copy()
        p.grad = None

    decay = [p for k, p in P.items() if p.dim() >= 2]
    no_decay = [p for k, p in P.items() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    losses = []
    for step in range(cfg["steps"]):
        opt.zero_grad()
        _, loss = loss_of(step)
        loss.backward()
        if cfg["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(P.values()), cfg["grad_clip"])
        opt.step()
        losses.append(loss.item())
    out["losses"] = np.array(losses)
    safetensors_np.save(os.path.join(d, "ref.safetensors"), out)


if __name__ == "__main__":
    main(sys.argv[1])
