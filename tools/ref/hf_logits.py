"""Logits of a Hugging Face GPT-2 / LLaMA model directory, in PyTorch float64.

    hf_logits.py HF_DIR TOKENS.safetensors OUT.safetensors

Reads HF_DIR/config.json and HF_DIR/model.safetensors (by hand, with json
and numpy: Debian has neither transformers nor safetensors) and runs the
forward pass of GPT2LMHeadModel or LlamaForCausalLM as transformers defines
it: GPT-2's Conv1D weights (in, out), `transformer.` names, a tied LM head
that is not stored; LLaMA's grouped-query attention and rotate-half RoPE.
The tensor names, shapes and config fields are checked as transformers
would need them: a missing, extra or misshapen tensor is an error. TOKENS
holds "tokens", int32 (B, T); OUT gets "logits", float64 (B, T, V).
tests/cli/hf_test.cc compares them with apiary's.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402
from model_ref import causal_attention, layernorm, rmsnorm, rope  # noqa: E402


class Weights:
    """The file's tensors; each is taken once, and none may be left over."""

    def __init__(self, path):
        self.path = path
        self.left = safetensors_np.load(path)

    def take(self, name, shape):
        if name not in self.left:
            raise SystemExit(f"{self.path}: no tensor '{name}'")
        a = self.left.pop(name)
        if list(a.shape) != list(shape):
            raise SystemExit(f"{self.path}: '{name}' has shape {list(a.shape)}, "
                             f"transformers expects {list(shape)}")
        return torch.tensor(a, dtype=torch.float64)

    def done(self):
        if self.left:
            raise SystemExit(f"{self.path}: tensors transformers would not load: "
                             f"{sorted(self.left)}")


def activation(name):
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    raise SystemExit(f"config.json: activation_function '{name}' not in this reference")


def gpt2(cfg, W, tok):
    B, T = tok.shape
    C, NH, L, V = cfg["n_embd"], cfg["n_head"], cfg["n_layer"], cfg["vocab_size"]
    inner = cfg.get("n_inner") or 4 * C
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    act = activation(cfg.get("activation_function", "gelu_new"))
    HS = C // NH
    wte = W.take("transformer.wte.weight", (V, C))
    x = wte[tok] + W.take("transformer.wpe.weight", (cfg["n_positions"], C))[:T]
    for l in range(L):
        p = f"transformer.h.{l}."

        def conv1d(name, n_in, n_out, h):
            # transformers' Conv1D: y = x W + b with W (in, out).
            return h @ W.take(p + name + ".weight", (n_in, n_out)) + W.take(p + name + ".bias",
                                                                            (n_out,))

        h = layernorm(x, W.take(p + "ln_1.weight", (C,)), W.take(p + "ln_1.bias", (C,)), eps)
        q, k, v = conv1d("attn.c_attn", C, 3 * C, h).split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d("attn.c_proj", C, C, y)
        h = layernorm(x, W.take(p + "ln_2.weight", (C,)), W.take(p + "ln_2.bias", (C,)), eps)
        x = x + conv1d("mlp.c_proj", inner, C, act(conv1d("mlp.c_fc", C, inner, h)))
    x = layernorm(x, W.take("transformer.ln_f.weight", (C,)),
                  W.take("transformer.ln_f.bias", (C,)), eps)
    tied = cfg.get("tie_word_embeddings", True)
    return x @ (wte if tied else W.take("lm_head.weight", (V, C))).T


def llama(cfg, W, tok):
    B, T = tok.shape
    C, NH, L, V = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"],
                   cfg["vocab_size"])
    KVH = cfg.get("num_key_value_heads") or NH
    HS = cfg.get("head_dim") or C // NH
    Fh = cfg["intermediate_size"]
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    if cfg.get("hidden_act", "silu") != "silu" or cfg.get("rope_scaling"):
        raise SystemExit("config.json: only silu and unscaled RoPE are in this reference")
    emb = W.take("model.embed_tokens.weight", (V, C))
    x = emb[tok]
    for l in range(L):
        p = f"model.layers.{l}."

        def linear(name, n_out, n_in, h):
            # torch.nn.Linear: y = x W^T with W (out, in).
            return h @ W.take(p + name + ".weight", (n_out, n_in)).T

        h = rmsnorm(x, W.take(p + "input_layernorm.weight", (C,)), eps)
        q = linear("self_attn.q_proj", NH * HS, C, h).view(B, T, NH, HS)
        k = linear("self_attn.k_proj", KVH * HS, C, h).view(B, T, KVH, HS)
        v = linear("self_attn.v_proj", KVH * HS, C, h).view(B, T, KVH, HS)
        q, k = rope(q, theta), rope(k, theta)
        k = k.repeat_interleave(NH // KVH, dim=2)
        v = v.repeat_interleave(NH // KVH, dim=2)
        y = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + linear("self_attn.o_proj", C, NH * HS, y.transpose(1, 2).reshape(B, T, NH * HS))
        h = rmsnorm(x, W.take(p + "post_attention_layernorm.weight", (C,)), eps)
        g = F.silu(linear("mlp.gate_proj", Fh, C, h)) * linear("mlp.up_proj", Fh, C, h)
        x = x + linear("mlp.down_proj", C, Fh, g)
    x = rmsnorm(x, W.take("model.norm.weight", (C,)), eps)
    tied = cfg.get("tie_word_embeddings", False)
    return x @ (emb if tied else W.take("lm_head.weight", (V, C))).T


def main(hf_dir, tokens_path, out_path):
    torch.set_num_threads(1)
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    W = Weights(os.path.join(hf_dir, "model.safetensors"))
    tok = torch.tensor(safetensors_np.load(tokens_path)["tokens"], dtype=torch.long)
    forward = {"gpt2": gpt2, "llama": llama}.get(cfg.get("model_type"))
    if forward is None:
        raise SystemExit(f"config.json: model_type {cfg.get('model_type')!r} not in this reference")
    arch = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[cfg["model_type"]]
    if cfg.get("architectures") != [arch]:
        raise SystemExit(f"config.json: architectures {cfg.get('architectures')}, not [{arch}]")
    with torch.no_grad():
        logits = forward(cfg, W, tok)
    W.done()
    safetensors_np.save(out_path, {"logits": logits.numpy()})


if __name__ == "__main__":
    main(*sys.argv[1:4])
