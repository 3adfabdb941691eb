"""PyTorch peer for `apiary bench train`: the same GPT-2 / LLaMA shapes, the same
step (forward, backward, AdamW) on random tokens, in fp32 or under bf16 autocast
(PyTorch's own mixed precision on CPU: matmuls in bf16 through oneDNN, fp32
master weights and optimizer). Prints one JSON object. With --device cuda the
same eager step runs on the GPU (scripts/device-check.sh's peer), timed with
the device synchronised at the end of each step.

usage: bench_torch.py --preset gpt2-124m --batch 4 --seq 256 --threads 2 --steps 5 [--precision bf16]
       [--device cuda]
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    # name: (arch, L, C, NH, KVH, F, V, maxT, tied)
    "gpt2-124m": ("gpt2", 12, 768, 12, 12, 3072, 50257, 1024, True),
    "gpt2-350m": ("gpt2", 24, 1024, 16, 16, 4096, 50257, 1024, True),
    "tiny": ("gpt2", 4, 192, 6, 6, 768, 256, 256, True),
    "llama-60m": ("llama", 8, 512, 8, 8, 1376, 32000, 256, False),
}


class Block(nn.Module):
    def __init__(self, arch, C, NH, KVH, Fh):
        super().__init__()
        self.arch, self.NH, self.KVH = arch, NH, KVH
        hs = C // NH
        if arch == "gpt2":
            self.n1, self.n2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv = nn.Linear(C, 3 * C)
            self.proj = nn.Linear(C, C)
            self.fc = nn.Linear(C, Fh)
            self.fc2 = nn.Linear(Fh, C)
        else:
            self.n1 = nn.Parameter(torch.ones(C))
            self.n2 = nn.Parameter(torch.ones(C))
            self.qkv = nn.Linear(C, C + 2 * KVH * hs, bias=False)
            self.proj = nn.Linear(C, C, bias=False)
            self.fc = nn.Linear(C, 2 * Fh, bias=False)
            self.fc2 = nn.Linear(Fh, C, bias=False)

    def norm(self, n, x):
        if self.arch == "gpt2":
            return n(x)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * n

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.NH
        h = self.norm(self.n1, x)
        qkv = self.qkv(h)
        q = qkv[..., :C].view(B, T, self.NH, hs).transpose(1, 2)
        k = qkv[..., C:C + self.KVH * hs].view(B, T, self.KVH, hs).transpose(1, 2)
        v = qkv[..., C + self.KVH * hs:].view(B, T, self.KVH, hs).transpose(1, 2)
        if self.KVH != self.NH:
            k = k.repeat_interleave(self.NH // self.KVH, dim=1)
            v = v.repeat_interleave(self.NH // self.KVH, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        h = self.norm(self.n2, x)
        if self.arch == "gpt2":
            h = F.gelu(self.fc(h), approximate="tanh")
        else:
            a, b = self.fc(h).chunk(2, dim=-1)
            h = F.silu(a) * b
        return x + self.fc2(h)


class Model(nn.Module):
    def __init__(self, arch, L, C, NH, KVH, Fh, V, maxT, tied):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(maxT, C) if arch == "gpt2" else None
        self.blocks = nn.ModuleList(Block(arch, C, NH, KVH, Fh) for _ in range(L))
        self.nf = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        if tied:
            self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.nf(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt2-124m")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    p = PRESETS[a.preset]
    model = Model(*p).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    V = p[6]
    idx = torch.randint(0, V, (a.batch, a.seq)).to(a.device)
    tgt = torch.randint(0, V, (a.batch, a.seq)).to(a.device)
    times = []
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(idx, tgt)
        loss.backward()
        opt.step()
        if a.device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
    step = statistics.median(times)
    print(json.dumps({"peer": f"pytorch {torch.__version__}", "preset": a.preset,
                      "precision": a.precision, "device": a.device,
                      "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else "",
                      "params": sum(q.numel() for q in model.parameters()), "batch": a.batch, "seq": a.seq, "threads": a.threads,
                      "step_time_s": step, "tokens_per_s": a.batch * a.seq / step,
                      "final_loss": loss.item()}))


if __name__ == "__main__":
    main()
