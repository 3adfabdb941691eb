"""Prometheus on the head host of the test cluster (cluster.sh) scraping
every rank on every host, and the shipped alert rules firing, checked
through Prometheus's HTTP API. Two hosts; `apiary launch -n 4 --hosts
10.213.0.1:2,10.213.0.2:2` on h1 trains dp 4 with metrics.address =
0.0.0.0 and writes the file-SD targets; Debian's Prometheus runs inside h1
with deploy/'s config and rules (test intervals: 1 s, `for: 1s`, the
expressions as shipped) and reaches h2's ranks over the bridge. Then
  * `up` is 1 for all four ranks, and `apiary_rank_info` names h1 for
    ranks 0, 1 and h2 for ranks 2, 3,
  * rank 3 stopped (SIGSTOP) stalls the others: ApiaryTrainingStalled fires
    for ranks on both hosts and ApiaryRankUnreachable for rank 3; after
    SIGCONT the run goes on,
  * h2 crashes (cluster.sh crash): ApiaryHostDown fires for its address
    and ApiaryRankUnreachable for ranks 2 and 3.
Usage: prometheus_cluster_test.py APIARY SOURCE_DIR (as root; 77: skipped)"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = os.path.join(HERE, "cluster.sh")
sys.path.insert(0, os.path.join(HERE, "..", "obs"))
from obs_util import print_log_tails, wait_for  # noqa: E402


def cluster(*args, check=True):
    r = subprocess.run(["bash", CLUSTER, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"cluster.sh {' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout


def main():
    apiary, src = os.path.abspath(sys.argv[1]), sys.argv[2]
    if os.geteuid() != 0:
        print("prometheus_cluster_test: skipped: needs root (network namespaces)")
        sys.exit(77)
    if not shutil.which("prometheus"):
        print("prometheus_cluster_test: skipped: no prometheus (Debian: apt install prometheus)")
        sys.exit(77)
    from prometheus_test import test_config  # deploy/'s config and rules, test intervals

    tmp = tempfile.mkdtemp(prefix="apiary-prom-cluster-")
    os.environ["APIARY_CLUSTER_ID"] = f"p{os.getpid() & 0xfffff:x}"
    os.environ["APIARY_CLUSTER_DIR"] = os.path.join(tmp, "cluster")
    prom = job = None
    prom_port = 9090  # inside h1: its own loopback, nothing else there

    def api(path):
        out = cluster("exec", "h1", "curl", "-sf", "--max-time", "5",
                      f"http://127.0.0.1:{prom_port}{path}")
        return json.loads(out)

    def query(expr):
        import urllib.parse
        doc = api("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def firing(name):
        return [a["labels"] for a in api("/api/v1/alerts")["data"]["alerts"]
                if a["labels"]["alertname"] == name and a["state"] == "firing"]

    try:
        cluster("up", "2")
        runs = os.path.join(tmp, "runs")
        run_dir = os.path.join(runs, "promrun")
        config = test_config(src, tmp, os.path.join(runs, "prometheus", "*.json"))
        prom = subprocess.Popen(
            ["bash", CLUSTER, "exec", "h1", "prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=open(os.path.join(tmp, "prometheus.log"), "w"), stderr=subprocess.STDOUT)
        wait_for("Prometheus ready", lambda: cluster(
            "exec", "h1", "curl", "-sf", f"http://127.0.0.1:{prom_port}/-/ready", check=False), 60)

        sets = {
            "run.dir": run_dir, "data.tokenizer": "byte", "model.preset": "tiny",
            "model.n_layer": 2, "model.n_embd": 64, "model.n_head": 2, "parallel.dp": 4,
            "train.batch_size": 1, "train.seq_len": 32, "train.steps": 100000000,
            "train.log_every": 5, "train.eval_every": 100000000, "train.threads": 1,
            "comm.timeout_s": 3600, "metrics.address": "0.0.0.0", "metrics.port_base": 9400,
            "data.cache_dir": os.path.join(tmp, "cache"),
        }
        launcher = ["--mca", "plm_rsh_agent", os.path.join(HERE, "rsh-agent.sh"),
                    "--mca", "btl", "tcp,self,vader",
                    "--mca", "btl_tcp_if_include", "10.213.0.0/24",
                    "--mca", "oob_tcp_if_include", "10.213.0.0/24",
                    "--oversubscribe", "--bind-to", "none"]
        cmd = ["bash", CLUSTER, "exec", "h1", apiary, "launch", "-n", "4",
               "--hosts", "10.213.0.1:2,10.213.0.2:2"]
        cmd += [f"--launcher-arg={a}" for a in launcher]
        cmd += ["--", "train"]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        job = subprocess.Popen(cmd, stdout=open(os.path.join(tmp, "train.log"), "w"),
                               stderr=subprocess.STDOUT, start_new_session=True)

        # Every rank on every host scraped, each saying where it runs.
        t0 = time.time()
        ups = wait_for("up == 1 for the 4 ranks", lambda: (
            lambda r: r if len(r) == 4 and all(x["value"][1] == "1" for x in r) else None)(
                query('up{job="apiary"}')), 300)
        print("ok: scraped", ", ".join(sorted(
            f"rank {x['metric']['apiary_rank']} at {x['metric']['instance']}" for x in ups)),
            f"({time.time() - t0:.0f} s after the launch)")
        info = wait_for("apiary_rank_info of 4 ranks",
                        lambda: (lambda r: r if len(r) == 4 else None)(query("apiary_rank_info")),
                        120)
        hosts = {x["metric"]["rank"]: x["metric"]["host"] for x in info}
        assert hosts == {"0": "h1", "1": "h1", "2": "h2", "3": "h2"}, hosts
        for x in ups:
            want = "10.213.0.1" if x["metric"]["apiary_rank"] in ("0", "1") else "10.213.0.2"
            assert x["metric"]["instance"].startswith(want + ":"), x["metric"]
            assert x["metric"]["apiary_host"] == want, x["metric"]
        print("ok: apiary_rank_info: ranks 0, 1 on h1, ranks 2, 3 on h2")
        wait_for("a few steps", lambda: all(
            float(x["value"][1]) >= 3 for x in query("apiary_step")) and
            len(query("apiary_step")) == 4, 300)

        # A stalled rank: rank 3 (on h2) stopped; the others wait for it.
        pids = {}
        for p in os.listdir("/proc"):
            try:
                env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
                cmdline = open(f"/proc/{p}/cmdline", "rb").read()
            except OSError:
                continue
            if run_dir.encode() in cmdline and cmdline.split(b"\0")[0].endswith(b"apiary"):
                for e in env:
                    if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                        pids[int(e.split(b"=")[1])] = int(p)
        assert set(pids) == {0, 1, 2, 3}, pids
        t0 = time.time()
        os.kill(pids[3], signal.SIGSTOP)
        try:
            stalled = wait_for("ApiaryTrainingStalled", lambda: (
                lambda a: a if {"0", "1", "2"} <= {x.get("rank") for x in a} else None)(
                    firing("ApiaryTrainingStalled")), 180)
            t_stalled = time.time() - t0
            down = wait_for("ApiaryRankUnreachable for rank 3",
                            lambda: [a for a in firing("ApiaryRankUnreachable")
                                     if a.get("apiary_rank") == "3"], 120)
            t_down = time.time() - t0
            assert all(a.get("apiary_rank") == "3" for a in firing("ApiaryRankUnreachable"))
            assert not firing("ApiaryHostDown"), firing("ApiaryHostDown")
            print(f"ok: rank 3 stopped: ApiaryTrainingStalled for ranks "
                  f"{sorted(x['rank'] for x in stalled)} after {t_stalled:.0f} s, "
                  f"ApiaryRankUnreachable for rank 3 ({down[0]['instance']}) after {t_down:.0f} s;"
                  " no ApiaryHostDown (rank 2 still answers)")
        finally:
            os.kill(pids[3], signal.SIGCONT)
        step = max(float(x["value"][1]) for x in query("apiary_step"))
        wait_for("training to go on", lambda: min(
            float(x["value"][1]) for x in query("apiary_step")) > step, 300)
        print("ok: after SIGCONT every rank steps again")

        # A dead host: h2 crashes (its link down, every process in it killed).
        t0 = time.time()
        cluster("crash", "h2")
        host = wait_for("ApiaryHostDown for h2",
                        lambda: [a for a in firing("ApiaryHostDown")
                                 if a.get("apiary_host") == "10.213.0.2"], 180)
        t_host = time.time() - t0
        ranks = wait_for("ApiaryRankUnreachable for ranks 2, 3", lambda: (
            lambda a: a if {"2", "3"} <= {x.get("apiary_rank") for x in a} else None)(
                firing("ApiaryRankUnreachable")), 120)
        # (mpirun then ends the job, h1's ranks with it: their alerts follow.)
        print(f"ok: h2 crashed: ApiaryHostDown for {host[0]['apiary_host']} after {t_host:.0f} s,"
              f" ApiaryRankUnreachable for ranks "
              f"{sorted({x['apiary_rank'] for x in ranks})}; hosts down by then: "
              f"{sorted({x['apiary_host'] for x in firing('ApiaryHostDown')})}")
        print("1 passed, 0 failed")
    except BaseException:
        print_log_tails(tmp, ("train.log", "prometheus.log"))
        raise
    finally:
        if job and job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        cluster("down", check=False)  # ends Prometheus and every rank in the hosts
        if prom:
            prom.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
