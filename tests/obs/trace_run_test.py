"""Traces of a real 2-rank training (tensor parallel, so layers have
communication inside them): every rank's file parses, every span nests on
its thread, the spans the summary relies on are there, the summary's parts
add up to the step time within 1%, `trace merge` puts both ranks on one
timeline; and bad input gets clear errors (a trace range beyond the run, a
truncated trace file, a directory without traces).
Usage: trace_run_test.py APIARY"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from obs_util import check, finish  # noqa: E402



def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def train(apiary, run_dir, cache, steps, profile, extra=()):
    sets = {"run.dir": run_dir, "data.tokenizer": "byte", "model.n_layer": 2, "model.n_head": 4,
            "train.batch_size": 2, "train.seq_len": 32, "train.steps": steps,
            "train.log_every": 2, "train.eval_every": 6, "train.eval_batches": 1,
            "train.ckpt_every": 6, "parallel.tp": 2, "metrics.enabled": "false",
            "profile.steps": profile, "data.cache_dir": cache}
    cmd = [apiary, "launch", "-n", "2", "--", "train"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return run(cmd + list(extra), timeout=300)


def nests(spans):
    """Spans of one thread as (begin_ns, end_ns): each inside the open one or after it."""
    stack = []
    for b, e, name in sorted(spans, key=lambda s: (s[0], -s[1])):
        while stack and stack[-1][1] <= b:
            stack.pop()
        if stack and e > stack[-1][1]:
            return f"'{name}' [{b}, {e}] overlaps '{stack[-1][2]}' [{stack[-1][0]}, {stack[-1][1]}]"
        stack.append((b, e, name))
    return None


def main():
    apiary = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="apiary-trace-")
    try:
        cache = os.path.join(tmp, "cache")
        run_dir = os.path.join(tmp, "run")
        r = train(apiary, run_dir, cache, 10, "5-7")
        check(r.returncode == 0, f"2-rank traced training exits 0 ({r.returncode}: {r.stdout[-2000:]})")
        files = sorted(os.listdir(os.path.join(run_dir, "trace")))
        check(files == ["rank_00000.json", "rank_00001.json"], f"one trace file per rank: {files}")
        for f in files:
            doc = json.load(open(os.path.join(run_dir, "trace", f)))
            spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
            by_thread = {}
            for e in spans:
                b = round(e["ts"] * 1000)
                by_thread.setdefault(e["tid"], []).append((b, b + round(e["dur"] * 1000), e["name"]))
            bad = [f"tid {t}: {nests(s)}" for t, s in by_thread.items() if nests(s)]
            check(not bad, f"{f}: every span nests on its thread {bad[:3]}")
            names = {e["name"] for e in spans}
            cats = {e["cat"] for e in spans}
            steps = sorted(e["args"]["step"] for e in spans if e["cat"] == "step")
            check(steps == [5, 6, 7], f"{f}: step spans of steps 5-7: {steps}")
            want = {"block forward 0", "block forward 1", "block backward 0", "block backward 1",
                    "embedding forward", "head", "data wait", "optimizer", "checkpoint", "eval",
                    "tp wait"}
            check(want <= names, f"{f}: spans {sorted(want - names)} missing")
            check({"compute", "comm", "wait", "data", "optimizer", "checkpoint"} <= cats,
                  f"{f}: kinds {sorted(cats)}")
            comm = [e for e in spans if e["cat"] == "comm"]
            check(comm and all("bytes" in e["args"] and "algorithm" in e["args"] for e in comm),
                  f"{f}: every collective span has bytes and algorithm ({len(comm)} spans)")

        s = run([apiary, "trace", "summary", run_dir, "--json"])
        check(s.returncode == 0, f"trace summary --json exits 0 ({s.stdout[-500:]})")
        summary = json.loads(s.stdout)
        for rk in summary["ranks"]:
            parts = rk["parts_s"]
            check(rk["steps"] == 3, f"rank {rk['rank']}: 3 steps summarised")
            check(abs(parts - rk["step_s"]) <= 0.01 * rk["step_s"],
                  f"rank {rk['rank']}: parts {parts:.6f} s add up to the step {rk['step_s']:.6f} s")
            check(rk["compute_s"] > 0 and rk["exposed_comm_s"] > 0 and rk["comm_s"] > 0,
                  f"rank {rk['rank']}: compute, exposed and total communication measured")
        layers = {l["layer"]: l for l in summary["layers"]}
        check({"embedding", "block 0", "block 1", "head"} <= set(layers), f"layers {sorted(layers)}")
        check(layers["block 0"]["exposed_comm_s"] > 0,
              "block 0: tensor-parallel communication exposed inside the layer")
        text = run([apiary, "trace", "summary", run_dir]).stdout
        check("per layer" in text and "comm/comp" in text, "text summary has both tables")

        m = run([apiary, "trace", "merge", run_dir])
        merged = json.load(open(os.path.join(run_dir, "trace", "merged.json")))
        pids = {e["pid"] for e in merged["traceEvents"]}
        check(m.returncode == 0 and pids == {0, 1}, f"merge: both ranks on one timeline ({pids})")

        # Bad input.
        r = train(apiary, os.path.join(tmp, "beyond"), cache, 10, "9-12")
        check(r.returncode != 0 and "goes beyond the run's train.steps = 10" in r.stdout + r.stderr,
              "a trace range beyond the run is refused before training")
        check(not os.path.exists(os.path.join(tmp, "beyond")), "... and nothing was written")
        path = os.path.join(run_dir, "trace", "rank_00001.json")
        text = open(path).read()
        open(path, "w").write(text[: len(text) // 3])
        m = run([apiary, "trace", "merge", run_dir])
        check(m.returncode == 1 and "rank_00001.json: not a complete trace" in m.stdout + m.stderr,
              f"a truncated trace file is named: {(m.stdout + m.stderr).strip()[:300]}")
        s = run([apiary, "trace", "summary", tmp])
        check(s.returncode == 1 and "no trace files" in s.stdout + s.stderr,
              "a directory without traces is named")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
