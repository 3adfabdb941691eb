"""End to end with a real Prometheus (Debian's): `apiary launch` writes the
file-SD targets of a 2-rank training, a Prometheus on loopback scrapes them
with a copy of deploy/'s config (short intervals) and rules (short `for:`,
same expressions); then
  * the loss and tokens/s series of both ranks are there,
  * every expression of the Grafana dashboard and of the rules returns data
    (a rule's comparisons made `bool`, so that it returns its series even
    when it does not fire),
  * stopping rank 1 with SIGSTOP fires ApiaryTrainingStalled (rank 0 waits
    for it) and ApiaryRankUnreachable (rank 1 cannot be scraped),
  * a stop request ends the job cleanly afterwards.
Usage: prometheus_test.py APIARY SOURCE_DIR"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from obs_util import (free_ports, print_log_tails, prom_query, rank_pids, wait_for,  # noqa: E402
                      write_sensors)

import yaml  # noqa: E402


def test_config(src, tmp, targets_glob):
    """deploy/'s prometheus.yml and rules with test intervals."""
    with open(os.path.join(src, "deploy/prometheus/prometheus.yml")) as f:
        text = f.read()
    for old, new in [("scrape_interval: 15s", "scrape_interval: 1s"),
                     ("scrape_timeout: 10s", "scrape_timeout: 900ms"),
                     ("evaluation_interval: 15s", "evaluation_interval: 1s"),
                     ("refresh_interval: 30s", "refresh_interval: 1s"),
                     ("../../runs/prometheus/*.json", targets_glob),
                     ("rules/apiary.rules.yml", os.path.join(tmp, "rules.yml"))]:
        assert old in text, f"deploy/prometheus/prometheus.yml no longer has {old!r}"
        text = text.replace(old, new)
    with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
        f.write(text)
    with open(os.path.join(src, "deploy/prometheus/rules/apiary.rules.yml")) as f:
        rules = f.read()
    # Only the waiting times change: the expressions are the shipped ones.
    rules = re.sub(r"for: \d+[smh]", "for: 1s", rules)
    with open(os.path.join(tmp, "rules.yml"), "w") as f:
        f.write(rules)
    return os.path.join(tmp, "prometheus.yml")


def expressions(src):
    """(where, expr) of every dashboard target and every rule (bool-ified)."""
    out = []
    with open(os.path.join(src, "deploy/grafana/apiary-dashboard.json")) as f:
        dash = json.load(f)
    for p in dash["panels"]:
        for t in p["targets"]:
            expr = t["expr"].replace("$run", ".*").replace("$rank", ".*")
            out.append((f"dashboard panel '{p['title']}' {t['refId']}", expr))
    with open(os.path.join(src, "deploy/prometheus/rules/apiary.rules.yml")) as f:
        rules = yaml.safe_load(f)
    for g in rules["groups"]:
        for r in g["rules"]:
            expr = re.sub(r"(==|!=|>=|<=|>|<)(?!\s*bool)", r"\1 bool", r["expr"])
            out.append((f"rule {r['alert']}", expr))
    return out


def firing(port, name):
    doc = json.loads(subprocess.run(
        ["curl", "-s", f"http://127.0.0.1:{port}/api/v1/alerts"],
        capture_output=True, text=True, check=True).stdout)
    return [a["labels"] for a in doc["data"]["alerts"]
            if a["labels"]["alertname"] == name and a["state"] == "firing"]


def main():
    apiary, src = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="apiary-prom-")
    prom = job = None
    try:
        prom_port = free_ports(1)
        metrics_base = free_ports(2)
        runs = os.path.join(tmp, "runs")
        run_dir = os.path.join(runs, "promrun")
        config = test_config(src, tmp, os.path.join(runs, "prometheus", "*.json"))
        subprocess.run(["promtool", "check", "config", config], check=True,
                       stdout=subprocess.DEVNULL)
        for r in range(2):
            write_sensors(os.path.join(tmp, f"sys{r}"), temp_c=50 + r)
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=open(os.path.join(tmp, "prometheus.log"), "w"), stderr=subprocess.STDOUT)
        wait_for("Prometheus ready", lambda: subprocess.run(
            ["curl", "-sf", f"http://127.0.0.1:{prom_port}/-/ready"],
            capture_output=True).returncode == 0, 60)

        sets = {
            "run.dir": run_dir, "data.tokenizer": "byte", "model.n_layer": 1,
            "train.batch_size": 2, "train.seq_len": 32, "train.steps": 100000000,
            "train.log_every": 5, "train.eval_every": 20, "train.eval_batches": 1,
            "train.ckpt_every": 40, "train.ckpt_keep": 1, "comm.timeout_s": 300,
            "metrics.port_base": metrics_base, "health.sysfs_root": os.path.join(tmp, "sys{rank}"),
            "health.check_every_s": 1, "data.cache_dir": os.path.join(tmp, "cache"),
        }
        cmd = [apiary, "launch", "-n", "2", "--", "train"]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        job = subprocess.Popen(cmd, stdout=open(os.path.join(tmp, "train.log"), "w"),
                               stderr=subprocess.STDOUT)
        targets = os.path.join(runs, "prometheus", "promrun.json")
        wait_for("the launch's scrape targets", lambda: os.path.exists(targets), 30)

        def both(metric):
            res = prom_query(prom_port, metric)
            return res if {x["metric"].get("rank") for x in res} >= {"0", "1"} else None

        for metric in ("apiary_loss", "apiary_tokens_per_second"):
            res = wait_for(f"{metric} of both ranks", lambda: both(metric), 120)
            for x in res:
                assert float(x["value"][1]) > 0, f"{metric} {x}"
            print(f"ok: {metric} of ranks 0 and 1:",
                  ", ".join(f"{x['metric']['rank']}={float(x['value'][1]):.4g}" for x in res))

        missing = []
        for where, expr in expressions(src):
            try:
                wait_for(where, lambda: prom_query(prom_port, expr), 60)
            except AssertionError:
                missing.append(f"{where}: {expr}")
        assert not missing, "expressions without data:\n  " + "\n  ".join(missing)
        print("ok: every dashboard and rule expression returns data")

        pids = rank_pids(run_dir)
        assert set(pids) == {0, 1}, f"rank processes: {pids}"
        os.kill(pids[1], signal.SIGSTOP)
        try:
            stalled = wait_for("ApiaryTrainingStalled firing",
                               lambda: firing(prom_port, "ApiaryTrainingStalled"), 90)
            assert any(a.get("rank") == "0" for a in stalled), stalled
            down = wait_for("ApiaryRankUnreachable firing",
                            lambda: firing(prom_port, "ApiaryRankUnreachable"), 90)
            assert any(a.get("apiary_rank") == "1" for a in down), down
            print("ok: SIGSTOP on rank 1 fires ApiaryTrainingStalled and ApiaryRankUnreachable")
        finally:
            os.kill(pids[1], signal.SIGCONT)
        step = float(prom_query(prom_port, 'apiary_step{rank="0"}')[0]["value"][1])
        wait_for("training to go on", lambda: float(
            prom_query(prom_port, 'apiary_step{rank="0"}')[0]["value"][1]) > step, 60)
        job.send_signal(signal.SIGINT)
        code = job.wait(timeout=120)
        assert code == 130, f"launch exited {code}, expected 130 after a stop request"
        job = None
        print("1 passed, 0 failed")
    except BaseException:
        print_log_tails(tmp, ("train.log", "prometheus.log"))
        raise
    finally:
        for p in (job, prom):
            if p and p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
