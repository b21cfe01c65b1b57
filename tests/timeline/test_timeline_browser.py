"""issue 16: the timeline page in a real browser (Debian's chromium, headless): no console
message or uncaught error, plotly drew its SVG, and the screenshot is not blank. Skips when
chromium is not installed (``.ci/run`` installs it)."""

import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from reports.cli_engine import EXAMPLES_DIR
from reports.timeline import write_timeline
from reports.trace_player import run_trace
from reports.traces import parse_traces
from tests.fakes.fake_port import FakeStagePort

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run installs it)"
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=5000",
    "--window-size=1200,700",
)
ERROR_HOOK = (
    "<script>window.__errors=[];var __ce=console.error;console.error=function(){"
    "window.__errors.push(Array.from(arguments).join(' '));__ce.apply(console,arguments)};"
    "window.addEventListener('error',function(e){window.__errors.push(String(e.message))});"
    "window.addEventListener('load',function(){document.documentElement.setAttribute("
    "'data-errors',JSON.stringify(window.__errors))});</script>"
)


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )


def png_colours(path: Path) -> int:
    """Distinct pixel colours of an 8-bit RGB/RGBA non-interlaced PNG (what chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, header
    bpp = 4 if colour_type == 6 else 3
    raw, stride = zlib.decompress(idat), width * bpp
    prev, colours, i = bytearray(stride), set(), 0
    for _ in range(height):
        ftype, line = raw[i], bytearray(raw[i + 1 : i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 255
            elif ftype == 2:
                line[x] = (line[x] + b) & 255
            elif ftype == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colours.update(bytes(line[x : x + 3]) for x in range(0, stride, bpp * 4))  # every 4th pixel
        prev = line
    return len(colours)


async def cafe_events(tmp_path):
    ports = [FakeStagePort(0, "thinker", token_delay_s=0.004), FakeStagePort(1, "talker", token_delay_s=0.004)]
    config = EngineConfig(max_tokens=12, talker_max_tokens=12, flush_interval_s=0.005)
    engine = await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db", ports, config=config)
    async with engine:
        await run_trace(engine, parse_traces([EXAMPLES_DIR / "cafe.jsonl"]), speed=25.0)
        return await engine.store.read_stream("cafe-order")


async def test_cafe_timeline_renders_in_headless_chromium(tmp_path):
    page = tmp_path / "cafe.html"
    write_timeline(await cafe_events(tmp_path), page)
    hooked = tmp_path / "cafe-hooked.html"
    hooked.write_text(page.read_text().replace("<head>", "<head>" + ERROR_HOOK, 1))
    dom = chromium(tmp_path, hooked, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console  # the page logs nothing: no error, no warning
    marker = dom.stdout.split('data-errors="', 1)
    assert len(marker) == 2, "the load hook did not run"
    assert json.loads(marker[1].split('"', 1)[0].replace("&quot;", '"')) == []
    assert 'class="main-svg"' in dom.stdout and "cafe-order" in dom.stdout  # plotly drew the figure
    shot = tmp_path / "cafe.png"
    run = chromium(tmp_path, page, f"--screenshot={shot}")
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    assert [line for line in run.stderr.splitlines() if ":CONSOLE" in line] == []
    assert png_colours(shot) >= 8  # a blank (or error) page has one or two
