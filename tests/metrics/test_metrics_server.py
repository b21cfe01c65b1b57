"""Issue 22 part B: ``/metrics`` answers every scrape under load (uvicorn, a real backlog) and
keeps serving after the engine closed when its caller owns the server."""

from __future__ import annotations

import http.client
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine_bridge.prometheus import LedgerMetrics
from tests.logbuilder import LogBuilder
from tests.metrics.test_metrics_fold import opened, turn

SCRAPERS = 64
SCRAPES_EACH = 20
BOUND_S = 120.0
SCRAPE_TIMEOUT_S = 5.0
"""Half Prometheus's default scrape_timeout (10 s). Under 64 scrapers the old
``start_http_server`` (wsgiref, backlog 5) made the slowest scrape take 9.9 s (SYN
retransmits after dropped connections); uvicorn answered every one in 0.1 s (2-core VM)."""


def scrape(port: int, timeout_s: float = 30.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def folded() -> LedgerMetrics:
    b = LogBuilder()
    opened(b)
    turn(b, 0, "stop", t0=10.0, audio_at=0.3)
    return LedgerMetrics().apply_all(b.stored)


def test_64_concurrent_scrapers_are_all_answered():
    metrics = folded()
    port = metrics.serve(0)
    expected = metrics.exposition()
    try:

        def scraper(_: int) -> list[tuple[int, bool]]:
            out = []
            for _ in range(SCRAPES_EACH):
                try:
                    status, body = scrape(port, SCRAPE_TIMEOUT_S)
                except OSError:  # refused, reset or timed out: not answered
                    status, body = 0, ""
                out.append((status, body == expected))
            return out

        started = time.monotonic()
        with ThreadPoolExecutor(SCRAPERS) as pool:
            results = [r for rs in pool.map(scraper, range(SCRAPERS)) for r in rs]
        elapsed = time.monotonic() - started
    finally:
        metrics.close()
    assert len(results) == SCRAPERS * SCRAPES_EACH
    assert all(status == 200 for status, _ in results), sorted({s for s, _ in results})
    assert all(same for _, same in results)  # the whole exposition, not a truncated one
    assert elapsed < BOUND_S, elapsed


def test_the_server_listens_on_loopback_only_by_default_and_close_stops_it():
    metrics = folded()
    port = metrics.serve(0)
    assert metrics._server.addr == "127.0.0.1"
    assert scrape(port)[0] == 200
    metrics.close()
    with pytest.raises(OSError):
        scrape(port)


def test_a_caller_owned_server_outlives_the_metrics_close():
    metrics = folded()
    server = metrics.start_server(0)
    try:
        metrics.close()  # what SessionEngine.aclose calls
        status, body = scrape(server.port)
        assert status == 200 and 'finished_reason="stop",model_name="smollm2"} 1.0' in body
    finally:
        server.close()
