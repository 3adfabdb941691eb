"""Helpers shared by the observability tests: free loopback ports, a fake
sysfs sensor tree, rank processes of a launched job, HTTP queries."""

import json
import os
import re
import socket
import time
import urllib.parse
import urllib.request


def free_ports(n):
    """A base port p with p .. p+n-1 all free on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        socks = []
        try:
            for i in range(n):
                t = socket.socket()
                t.bind(("127.0.0.1", base + i))
                socks.append(t)
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no run of free ports")


def write_sensors(root, temp_c=45.0, mhz=2000, max_mhz=3000, throttle=0):
    """A sysfs-like tree with one hwmon chip, one thermal zone, one CPU."""
    files = {
        "class/hwmon/hwmon0/name": "coretemp",
        "class/hwmon/hwmon0/temp1_label": "Package id 0",
        "class/hwmon/hwmon0/temp1_input": str(int(temp_c * 1000)),
        "class/thermal/thermal_zone0/type": "x86_pkg_temp",
        "class/thermal/thermal_zone0/temp": str(int(temp_c * 1000) - 1000),
        "devices/system/cpu/cpu0/cpufreq/scaling_cur_freq": str(mhz * 1000),
        "devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq": str(max_mhz * 1000),
        "devices/system/cpu/cpu0/thermal_throttle/core_throttle_count": str(throttle),
    }
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, path)


def rank_pids(run_dir):
    """{rank: pid} of the `apiary train` processes training in run_dir."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if b"train" not in cmd or not any(run_dir.encode() in a for a in cmd):
            continue
        if not cmd[0].endswith(b"apiary"):
            continue
        for e in env:
            m = re.match(rb"OMPI_COMM_WORLD_RANK=(\d+)$", e)
            if m:
                out[int(m.group(1))] = int(pid)
    return out


def http_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


def prom_query(port, expr):
    q = urllib.parse.urlencode({"query": expr})
    doc = http_json(f"http://127.0.0.1:{port}/api/v1/query?{q}")
    if doc.get("status") != "success":
        raise RuntimeError(f"query {expr!r} failed: {doc}")
    return doc["data"]["result"]


def wait_for(what, fn, timeout):
    """Polls fn() until it returns something truthy; fails after timeout s."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # a server still starting
            last = e
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def print_log_tails(folder, names, lines=40):
    """The last lines of each log in folder that exists, for a failed test."""
    for log in names:
        p = os.path.join(folder, log)
        if os.path.exists(p):
            print(f"---- {log} (last {lines} lines)")
            print("".join(open(p, errors="replace").readlines()[-lines:]))


FAILED = []


def check(cond, what):
    """Records one expectation; finish() reports them all."""
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAILED.append(what)


def finish():
    """The closing line ctest and CI read, and the exit code."""
    print(f"{0 if FAILED else 1} passed, {1 if FAILED else 0} failed")
    raise SystemExit(1 if FAILED else 0)
