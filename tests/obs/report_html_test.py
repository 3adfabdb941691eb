"""`apiary runs show` on two real runs: the terminal summary and plots,
then the --html page rendered by headless Chromium; its screenshot must
show each run's line in each of the three charts (loss, tokens/s, MFU).
Bad input: a directory without metrics.
Usage: report_html_test.py APIARY [KEEP_DIR]"""

import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from obs_util import check, finish  # noqa: E402

COLORS = {"run a": (0x1F, 0x77, 0xB4), "run b": (0xD6, 0x27, 0x28)}  # report_html.cc's first two


def read_png(path):
    """(width, height, rows of (r, g, b) bytes) of an 8-bit RGB or RGBA PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, idat, ihdr = 8, b"", None
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        at += 12 + n
    w, h, depth, ctype = ihdr[:4]
    assert depth == 8 and ctype in (2, 6), f"PNG depth {depth} color type {ctype}"
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif f == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def count_color(png, rgb, x0, x1, tol=40):
    w, h, bpp, rows = png
    n = 0
    for row in rows:
        for x in range(max(0, x0), min(w, x1)):
            r, g, b = row[x * bpp:x * bpp + 3]
            if abs(r - rgb[0]) <= tol and abs(g - rgb[1]) <= tol and abs(b - rgb[2]) <= tol:
                n += 1
    return n


def main():
    apiary = sys.argv[1]
    tmp = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="apiary-report-")
    os.makedirs(tmp, exist_ok=True)
    try:
        runs = []
        for name, lr in (("run a", "2e-3"), ("run b", "5e-4")):
            d = os.path.join(tmp, name)
            shutil.rmtree(d, ignore_errors=True)
            r = subprocess.run(
                [apiary, "train", "--set", f"run.dir={d}", "--set", "data.tokenizer=byte",
                 "--set", "model.n_layer=1", "--set", "train.batch_size=2", "--set",
                 "train.seq_len=32", "--set", "train.steps=60", "--set", "train.log_every=5",
                 "--set", "train.eval_every=20", "--set", "train.eval_batches=1", "--set",
                 "train.warmup_steps=5", "--set", f"train.lr={lr}", "--set",
                 "metrics.enabled=false", "--set", f"data.cache_dir={tmp}/cache"],
                capture_output=True, text=True, timeout=300)
            check(r.returncode == 0, f"{name} trains ({r.stderr[-300:]})")
            runs.append(d)
        html = os.path.join(tmp, "report.html")
        r = subprocess.run([apiary, "runs", "show", *runs, "--html", html], capture_output=True,
                           text=True, timeout=60)
        check(r.returncode == 0, f"runs show exits 0 ({r.stderr[-300:]})")
        out = r.stdout
        check("best eval loss" in out and "run a" in out and "run b" in out, "summary of both runs")
        for title in ("training loss", "throughput (tokens/s)", "MFU (%)"):
            check(title in out, f"terminal plot '{title}'")
        check("* run a   + run b" in out, "terminal legend names both runs")

        shot = os.path.join(tmp, "report.png")
        profile = tempfile.mkdtemp(prefix="apiary-chromium-")
        try:
            r = subprocess.run(
                ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--user-data-dir={profile}", "--hide-scrollbars",
                 "--window-size=1800,440", f"--screenshot={shot}", "file://" + html],
                capture_output=True, text=True, timeout=120)
        finally:
            shutil.rmtree(profile, ignore_errors=True)
        check(r.returncode == 0 and os.path.exists(shot), f"Chromium took a screenshot ({r.stderr[-300:]})")
        png = read_png(shot)
        # Three 560-pixel charts side by side from the 24-pixel margin, 16 apart.
        for i, title in enumerate(("loss", "tokens/s", "MFU")):
            x0 = 24 + i * 576
            for name, rgb in COLORS.items():
                n = count_color(png, rgb, x0, x0 + 560)
                check(n > 150, f"the {title} chart shows {name}'s line ({n} pixels of its color)")

        empty = os.path.join(tmp, "not a run")
        os.makedirs(empty, exist_ok=True)
        r = subprocess.run([apiary, "runs", "show", empty], capture_output=True, text=True)
        check(r.returncode == 1 and "metrics.jsonl: missing" in r.stderr,
              f"a directory without metrics is named ({r.stderr.strip()[:200]})")
    finally:
        if len(sys.argv) <= 2:
            shutil.rmtree(tmp, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
