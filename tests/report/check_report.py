#!/usr/bin/env python3
"""The HTML report in a real browser: Debian's headless Chromium renders the page that
`tinygpt verify --html` wrote; every plot and table must be in the rendered DOM, every inline SVG
must be well-formed XML, the page must log no console errors and weigh under 1 MB; a screenshot
is saved for people to look at. Usage: check_report.py REPORT.html SCREENSHOT.png [MARKDOWN.md]
"""
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

REQUIRED = ["verdict", "drift-plot", "fault-plots", "drift-table", "detection-matrix", "mutation-score",
            "checks-table", "golden-table", "bench-table", "bench-chart", "provenance"]


def main(html, png, md=None):
    problems = []
    size = os.path.getsize(html)
    if size >= 1 << 20:
        problems.append("the page is %d bytes, over 1 MB" % size)
    text = open(html, encoding="utf-8").read()
    for i, svg in enumerate(re.findall(r"<svg\b.*?</svg>", text, flags=re.S)):
        try:
            ET.fromstring(svg)
        except ET.ParseError as e:
            problems.append("inline SVG %d is not well-formed: %s" % (i, e))
    if re.search(r"<script|https?://(?!www\.w3\.org/2000/svg)", text):
        problems.append("the page is not self-contained (a script or a network address)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("chromium is not installed (ci/install.sh installs it)")
        return 1
    base = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
            "--v=0", "--user-data-dir=" + os.path.join(os.path.dirname(os.path.abspath(png)), "chromium-profile")]
    url = "file://" + os.path.abspath(html)
    dom = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    if dom.returncode != 0:
        problems.append("chromium --dump-dom exited %d" % dom.returncode)
    for ident in REQUIRED:
        if 'id="%s"' % ident not in dom.stdout:
            problems.append("the rendered page has no #%s" % ident)
    shot = subprocess.run(base + ["--window-size=1240,3000", "--screenshot=" + os.path.abspath(png), url],
                          capture_output=True, text=True, timeout=120)
    console = [l for l in (dom.stderr + shot.stderr).splitlines()
               if "CONSOLE" in l and re.search(r"error|uncaught", l, re.I)]
    problems += ["console: " + l for l in console]
    if not os.path.exists(png) or os.path.getsize(png) < 10000:
        problems.append("no screenshot at %s" % png)
    if md:
        first = open(md, encoding="utf-8").readline()
        if not re.match(r"\*\*(PASS|FAIL)\*\* tinygpt ", first):
            problems.append("the Markdown's first line is not the verdict: %r" % first)
    for p in problems:
        print("FAIL " + p)
    if not problems:
        print("report ok: %d bytes, %d plots, every section rendered, screenshot %s" %
              (size, text.count("<svg"), png))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
