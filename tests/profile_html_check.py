#!/usr/bin/env python3
"""trainc profile --html on a tiny CPU run, opened in headless Chromium.

Usage: profile_html_check.py TRAINC SCRATCH_DIR

Then tools/lab_table.py --html of two tiny CPU stages: its table, the
stages' timelines, findings and reflection, opened in Chromium the same way;
and its timeline's lanes for 13 streams (a lane each for the compute stream
and the 7 busiest, one for the rest).

Checks the page: every section's SVG present (in the file and in Chromium's
DOM dump), nothing it would fetch (no src/href/url( outside the page, a CSP
of default-src 'none'), no console error, and a screenshot that is not blank
(the PNG decoded with zlib, its pixels' spread). The CPU's GPU-only figures
say "not measured on the CPU".
Exit 0: passed, 1: failed, 77: skipped (no chromium: apt-get install chromium)."""
import contextlib
import io
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

TINY = ["data.source=synthetic", "data.image_size=16", "data.synthetic_train=64", "data.synthetic_test=8",
        "train.batch=4", "model.name=simplenet", "run.log_every=1000"]
SECTIONS = {"timeline": "rect", "layers": "rect", "roofline": "circle", "run": "rect"}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def png_pixels(path):
    """(width, height, bytes per pixel, rows of raw bytes) of an 8-bit RGB(A) PNG, unfiltered."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: not a PNG")
    at, idat, width, height, bpp = 8, b"", 0, 0, 0
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + n]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            if depth != 8 or colour not in (2, 6):
                fail(f"{path}: PNG depth {depth} colour type {colour}, want 8-bit RGB or RGBA")
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        at += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def check_page(html):
    for section, shape in SECTIONS.items():
        m = re.search(rf'<section id="{section}">(.*?)</section>', html, re.S)
        if not m or "<svg" not in m.group(1) or f"<{shape}" not in m.group(1):
            fail(f"section {section}: no <svg> with a <{shape}>")
    if not re.search(r'<section id="findings">.*<li class="finding">', html, re.S):
        fail("the diagnosis has no finding")
    if "default-src 'none'" not in html:
        fail("no Content-Security-Policy default-src 'none'")
    outside = re.findall(r'(?:src|href)\s*=\s*["\']?[a-z]+:|url\(|@import|<script|<link|<img', html, re.I)
    if outside:
        fail(f"the page refers outside itself: {outside[:3]}")
    for what in ("GPU utilisation", "GPU power"):
        if not re.search(what + r".{0,400}not measured on the CPU", html, re.S):
            fail(f"{what}: not said to be not measured on the CPU")


def rejects(page, why):
    """check_page must fail on page (a check that cannot fail is no check)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            check_page(page)
    except SystemExit:
        return
    fail(f"check_page passed a page with {why}")


def check_lab(trainc, scratch):
    """lab_table.py --html on two tiny CPU stages: the page's sections; returns its path."""
    page = os.path.join(scratch, "lab.html")
    cmd = [sys.executable, "tools/lab_table.py", "--trainc", trainc, "--configs", "configs/cpu.ini,configs/cpu.ini",
           "--diagnose-steps", "2:3", "--html", page, "--csv", os.path.join(scratch, "lab.csv"), "--svg",
           os.path.join(scratch, "lab.svg"), "--report", os.path.join(scratch, "lab.md")]
    for s in TINY + ["run.device=cpu", "run.max_steps=8"]:
        cmd += ["--set", s]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        fail(f"{' '.join(cmd)} exited {run.returncode}: {run.stderr[-2000:]}")
    html = open(page, encoding="utf-8").read()
    timelines = re.search(r'<section id="timelines">(.*?)</section>', html, re.S)
    if not timelines or timelines.group(1).count('<svg class="timeline"') != 2 or "<rect" not in timelines.group(1):
        fail("the lab page: not two stages' timelines with boxes")
    if html.count("<li>") < 1 or "<table>" not in html:
        fail("the lab page: no table or no finding")
    reflection = re.search(r'<section id="reflection">(.*?)</section>', html, re.S)
    if not reflection or "biggest bottleneck" not in reflection.group(1) or "gained most" not in reflection.group(1):
        fail("the lab page: no reflection")
    if re.search(r'(?:src|href)\s*=\s*["\']?[a-z]+:|url\(|<script|<link|<img', html, re.I):
        fail("the lab page refers outside itself")
    return page


def run_chromium(chromium, html_path, scratch):
    shot = os.path.splitext(html_path)[0] + ".png"
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
            "--user-data-dir=" + os.path.join(scratch, "chromium-profile"), "--window-size=1200,1600"]
    url = "file://" + os.path.abspath(html_path)
    dom = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    if dom.returncode != 0:
        fail(f"chromium --dump-dom exited {dom.returncode}: {dom.stderr[-2000:]}")
    shot_run = subprocess.run(base + ["--screenshot=" + shot, url], capture_output=True, text=True, timeout=120)
    if shot_run.returncode != 0 or not os.path.exists(shot):
        fail(f"chromium --screenshot exited {shot_run.returncode}: {shot_run.stderr[-2000:]}")
    for log in (dom.stderr, shot_run.stderr):
        bad = [line for line in log.splitlines() if "CONSOLE" in line or "Refused to" in line
               or "Content Security Policy" in line]
        if bad:
            fail("console: " + "; ".join(bad[:5]))
    return dom.stdout, shot


def check_screenshot(shot):
    width, height, bpp, rows = png_pixels(shot)
    values = [row[i] for row in rows[::8] for i in range(0, width * bpp, bpp * 8)]
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    dark = sum(v < 128 for v in values) / len(values)
    if var < 50 or dark < 0.001:
        fail(f"the screenshot ({width}x{height}) looks blank: variance {var:.1f}, dark share {dark:.4f}")
    print(f"screenshot {width}x{height}: variance {var:.0f}, dark share {dark:.3f}")


def check_lab_lanes():
    """lab_table.py's lanes: the compute stream (the least busy) and 12 others, stream k busy k us."""
    sys.path.insert(0, "tools")
    import lab_table
    names = {(0, 1): "host: steps"}
    names.update({(0, 100 + k): f"stream {k}" + (" (compute)" if k == 0 else "") for k in range(13)})
    boxes = [(0, 100 + k, "a_kernel", "kernel", 0.0, float(k or 0.5)) for k in range(13)]
    rows, labels, shared = lab_table.lane_rows(names, boxes)
    want_shared = {(0, 100 + k) for k in range(1, 6)}
    if shared != want_shared or labels[-1] != "other streams (5)" or "stream 0 (compute)" not in labels:
        fail(f"lab_table.lane_rows: shared {sorted(shared)}, labels {labels}")
    if len(labels) != 10 or len({rows[k] for k in want_shared}) != 1:
        fail(f"lab_table.lane_rows: {len(labels)} rows, the shared streams' rows {[rows[k] for k in want_shared]}")
    svg = lab_table.timeline_svg((names, boxes, 20.0), 20.0)
    if "<title>stream 3: a_kernel" not in svg or "<title>stream 9: a_kernel" in svg:
        fail("lab_table.timeline_svg: the shared lane's boxes are not named by stream, or a kept one's are")
    print("lab_table's lanes: 13 streams in 9 rows, 5 in the shared one")


def main():
    trainc = sys.argv[1]
    os.makedirs(sys.argv[2], exist_ok=True)
    # a folder of this run's own: Chromium refuses a profile folder another instance holds (the seed sweep runs
    # this test beside itself)
    scratch = tempfile.mkdtemp(prefix="run-", dir=sys.argv[2])
    html_path = os.path.join(scratch, "profile.html")
    cmd = [trainc, "profile", "--config", "configs/cpu.ini", "--device", "cpu", "--steps", "2:3", "--html",
           html_path]
    for s in TINY:
        cmd += ["--set", s]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        fail(f"{' '.join(cmd)} exited {run.returncode}: {run.stderr[-2000:]}")
    head = run.stdout.split("\n\n")[0]
    if not head.startswith("== summary ==") or "not measured on the CPU" not in head or "top finding" not in head:
        fail(f"the text's summary: {head!r}")
    html = open(html_path, encoding="utf-8").read()
    check_page(html)
    rejects(html.replace("</body>", '<img src="https://example.com/x.png"></body>'), "an outside image")
    rejects(html.replace('<section id="roofline">', '<section id="gone">'), "no roofline")
    rejects(html.replace("not measured on the CPU", "0%"), "the CPU's GPU figures as 0%")
    lab = check_lab(trainc, scratch)
    check_lab_lanes()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("SKIP: no chromium on PATH (apt-get install chromium); the page itself passed its checks")
        sys.exit(77)
    dom, shot = run_chromium(chromium, html_path, scratch)
    for section, shape in SECTIONS.items():
        if not re.search(rf'<section id="{section}">.*?<svg.*?<{shape}', dom, re.S):
            fail(f"Chromium's DOM: section {section} has no <svg> with a <{shape}>")
    check_screenshot(shot)
    lab_dom, lab_shot = run_chromium(chromium, lab, scratch)
    if lab_dom.count('class="timeline"') != 2:
        fail("Chromium's DOM of the lab page: not two timelines")
    check_screenshot(lab_shot)
    print("PASS: the profile's page and the lab's, their DOM in Chromium and their screenshots")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
