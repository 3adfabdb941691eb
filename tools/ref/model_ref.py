"""PyTorch reference for apiary's GPT-2 and LLaMA, dense or with mixture-of-experts
blocks (tests/model/model_ref_test.cc).

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


def expert_mlp(cfg, P, q, x):
    # One expert (or the shared ones) of apiary's MoE block: no biases.
    if cfg["arch"] == "gpt2":
        return F.gelu(x @ P[q + "c_fc.weight"].T, approximate="tanh") @ P[q + "c_proj.weight"].T
    g = F.silu(x @ P[q + "gate_proj.weight"].T) * (x @ P[q + "up_proj.weight"].T)
    return g @ P[q + "down_proj.weight"].T


def moe_mlp(cfg, P, p, h):
    """apiary's MoE block (src/model/moe.cc, src/kernels/cpu/moe.cc) on h (B, T, C).

    Returns the output and the router terms of the objective: the balance
    and z losses times their coefficients, and for the sigmoid router a
    zero-valued term whose gradient for the selection bias is f_e - 1/E.
    """
    B, T, C = h.shape
    N = B * T
    E, K = cfg["n_expert"], cfg["n_expert_active"]
    x = h.reshape(N, C)
    logits = x @ P[p + "gate.weight"].T
    sigmoid = cfg["moe_router"] == "sigmoid"
    probs = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)
    # Choices: by sigmoid score + bias, or by logit; ties to the lower index
    # (argmax returns the first maximum).
    score = (probs + P[p + "gate.e_score_correction_bias"]) if sigmoid else logits
    score = score.detach().clone()
    chosen = []
    for _ in range(K):
        idx = torch.argmax(score, dim=-1)
        chosen.append(idx)
        score[torch.arange(N), idx] = -math.inf
    expert = torch.stack(chosen, dim=1)  # (N, K)
    sel = probs.gather(1, expert)
    gate = sel if K == 1 else sel / sel.sum(dim=1, keepdim=True)
    if cfg["moe_dropless"]:
        cap = N
    else:
        cap = min(N, max(1, math.ceil(cfg["moe_capacity_factor"] * N * K / E)))
    count, routed = [0] * E, [0] * E
    keep = torch.zeros(N, K, dtype=torch.bool)
    for j in range(K):
        for t in range(N):
            e = int(expert[t, j])
            routed[e] += 1
            if count[e] < cap:
                keep[t, j] = True
                count[e] += 1
    out = torch.zeros(N, C, dtype=h.dtype)
    for e in range(E):
        mask = (expert == e) & keep
        tok, j = mask.nonzero(as_tuple=True)
        if len(tok) == 0:
            continue
        y = expert_mlp(cfg, P, p + f"experts.{e}.", x[tok])
        out = out.index_add(0, tok, gate[tok, j].unsqueeze(1) * y)
    if cfg["n_shared_expert"] > 0:
        out = out + expert_mlp(cfg, P, p + "shared_experts.", x)
    f = torch.tensor(routed, dtype=h.dtype) / (N * K)
    Pe = (probs / probs.sum(dim=1, keepdim=True) if sigmoid else probs).mean(dim=0)
    aux = E * (f * Pe).sum()
    z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
    term = cfg["moe_aux_loss_coef"] * aux + cfg["moe_z_loss_coef"] * z
    if sigmoid:
        b = P[p + "gate.e_score_correction_bias"]
        pull = (b * (f - 1.0 / E)).sum()
        term = term + pull - pull.detach()
    return out.view(B, T, C), term


def is_moe(cfg, l):
    return cfg.get("n_expert", 0) > 0 and l >= cfg.get("moe_dense_layers", 0)


def forward(cfg, P, tok):
    B, T = tok.shape
    C, NH, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    HS = C // NH
    eps = cfg["norm_eps"]
    router = 0.0  # the MoE blocks' router terms, summed
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
            if is_moe(cfg, l):
                y, term = moe_mlp(cfg, P, p + "mlp.", h)
                x, router = x + y, router + term
                continue
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
            if is_moe(cfg, l):
                y, term = moe_mlp(cfg, P, p + "mlp.", h)
                x, router = x + y, router + term
                continue
            g = F.silu(h @ P[p + "mlp.gate_proj.weight"].T) * (h @ P[p + "mlp.up_proj.weight"].T)
            x = x + g @ P[p + "mlp.down_proj.weight"].T
        x = rmsnorm(x, P["model.norm.weight"], eps)
        head = P["model.embed_tokens.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    return x @ head.T, router


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
        # The cross-entropy, and the objective apiary differentiates: the
        # router terms weigh as the loss of the micro-batch's N tokens does,
        # i.e. N / (counted targets) against the mean cross-entropy.
        logits, router = forward(cfg, P, tokens[step])
        t = targets[step].reshape(-1)
        loss = F.cross_entropy(logits.reshape(-1, V), t, ignore_index=-1)
        objective = loss + router * (t.numel() / (t >= 0).sum().item())
        return logits, loss, objective

    out = {}
    logits, loss, objective = loss_of(0)
    objective.backward()
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
        _, loss, objective = loss_of(step)
        objective.backward()
        if cfg["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(P.values()), cfg["grad_clip"])
        opt.step()
        losses.append(loss.item())
    out["losses"] = np.array(losses)
    safetensors_np.save(os.path.join(d, "ref.safetensors"), out)


if __name__ == "__main__":
    main(sys.argv[1])
