"""Health from fake sensors in a real 2-rank training (rank r reads
sys<r>/, health.sysfs_root = .../sys{rank}):
  * throttle: rank 1 heats up, both ranks throttle at the same step, and
    both go back to full speed at the same step once it cools;
  * checkpoint: rank 1 is too hot from the start, the job saves a
    checkpoint and exits 75 after the same step on both ranks, and the run
    resumes once the rank is cool.
Usage: health_run_test.py APIARY"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from obs_util import check, finish, wait_for, write_sensors  # noqa: E402



def command(apiary, tmp, run_dir, action, steps):
    sets = {"run.dir": run_dir, "data.tokenizer": "byte", "model.n_layer": 1,
            "train.batch_size": 2, "train.seq_len": 32, "train.steps": steps,
            "train.log_every": 1, "train.eval_every": 0, "train.eval_batches": 1,
            "metrics.enabled": "false", "health.action": action,
            "health.sysfs_root": os.path.join(tmp, "sys{rank}"), "health.check_every_s": 0,
            "health.max_temp_c": 90, "health.resume_temp_c": 80, "health.pause_s": 0.05,
            "data.cache_dir": os.path.join(tmp, "cache")}
    cmd = [apiary, "launch", "-n", "2", "--", "train"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    return cmd


def log_steps(run_dir, rank, pattern):
    path = os.path.join(run_dir, "logs", f"rank_{rank:05d}.log")
    if not os.path.exists(path):
        return []
    return [int(m.group(1)) for m in re.finditer(pattern, open(path, errors="replace").read())]


def last_step(run_dir):
    steps = log_steps(run_dir, 0, r"step +(\d+)/")
    return steps[-1] if steps else 0


def throttle(apiary, tmp):
    run_dir = os.path.join(tmp, "throttle")
    for r in range(2):
        write_sensors(os.path.join(tmp, f"sys{r}"), temp_c=50)
    job = subprocess.Popen(command(apiary, tmp, run_dir, "throttle", 100000000),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for("training to start", lambda: last_step(run_dir) >= 3, 120)
        write_sensors(os.path.join(tmp, "sys1"), temp_c=95)
        hot = r"step (\d+): a rank is over its health limits"
        wait_for("both ranks to throttle",
                 lambda: all(log_steps(run_dir, r, hot) for r in range(2)), 120)
        at = last_step(run_dir)
        wait_for("a few throttled steps", lambda: last_step(run_dir) >= at + 3, 120)
        write_sensors(os.path.join(tmp, "sys1"), temp_c=85)  # under the limit, not yet cool
        time.sleep(0.5)
        cool = r"step (\d+): every rank within its health limits"
        check(not log_steps(run_dir, 0, cool), "85 C (above health.resume_temp_c) is not cool yet")
        write_sensors(os.path.join(tmp, "sys1"), temp_c=60)
        wait_for("both ranks back to full speed",
                 lambda: all(log_steps(run_dir, r, cool) for r in range(2)), 120)
        job.send_signal(signal.SIGINT)
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    check(job.returncode == 130, f"stopped on request: exit {job.returncode}")
    h0, h1 = log_steps(run_dir, 0, hot), log_steps(run_dir, 1, hot)
    c0, c1 = log_steps(run_dir, 0, cool), log_steps(run_dir, 1, cool)
    check(h0 == h1 and len(h0) == 1, f"both ranks throttle after the same step: {h0} {h1}")
    check(c0 == c1 and len(c0) == 1 and c0[0] > h0[0],
          f"both ranks return to full speed after the same later step: {c0} {c1}")
    rank1 = open(os.path.join(run_dir, "logs", "rank_00001.log")).read()
    check("rank 1: health: hwmon0/coretemp/Package id 0 at 95.0 C exceeds health.max_temp_c"
          in rank1, "rank 1's log names the sensor and the limit")
    check("rank 0: health:" not in open(os.path.join(run_dir, "logs", "rank_00000.log")).read(),
          "rank 0 itself stayed healthy")


def checkpoint(apiary, tmp):
    run_dir = os.path.join(tmp, "stop")
    write_sensors(os.path.join(tmp, "sys0"), temp_c=50)
    write_sensors(os.path.join(tmp, "sys1"), temp_c=99)
    r = subprocess.run(command(apiary, tmp, run_dir, "checkpoint", 50), capture_output=True,
                       text=True, timeout=300)
    out = r.stdout + r.stderr
    check(r.returncode == 75, f"a hot rank stops the job with exit 75 ({r.returncode})")
    check("stopping after step 1 for health" in out, "the job says it stops for health")
    check("rank 1: health: hwmon0/coretemp/Package id 0 at 99.0 C" in out, "... naming the sensor")
    ckpts = os.listdir(os.path.join(run_dir, "ckpt")) if os.path.isdir(
        os.path.join(run_dir, "ckpt")) else []
    check("step_00000001" in ckpts and not any(c.startswith("step_") and c != "step_00000001"
                                                for c in ckpts),
          f"a checkpoint of step 1 was saved: {ckpts}")
    write_sensors(os.path.join(tmp, "sys1"), temp_c=50)
    cmd = command(apiary, tmp, run_dir, "checkpoint", 50)
    cmd = cmd[: cmd.index("train") + 1] + ["--resume", run_dir, "--set", "train.steps=4"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0 and "resuming after step 1" in r.stdout,
          f"the cooled job resumes from it ({r.returncode})")


def main():
    apiary = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="apiary-health-")
    try:
        throttle(apiary, tmp)
        checkpoint(apiary, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
