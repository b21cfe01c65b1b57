"""The README's embedding example runs as written (live vLLM, tiny model)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.fixtures import VLLM_SKIP, vllm_available

ROOT = Path(__file__).parents[2]


@pytest.mark.vllm
def test_embed_example_runs_and_audits_clean(tmp_path, tiny_model_dir):
    if not vllm_available():
        pytest.skip(VLLM_SKIP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_LOGGING", "PYTHONWARNINGS", "TORCH_"))}
    env["PYTHONPATH"] = str(ROOT)  # the example's own log settings, as a user runs it
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "embed.py"), "--db", f"sqlite+aiosqlite:///{tmp_path}/embed.db"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("assistant: ") == 2
    assert "audit: clean" in result.stdout
    assert result.stdout.count("[RequestE2EStats") == 2  # the tables its comment promises, per turn
    noise = [line for line in result.stderr.splitlines() if line.strip()]  # no vLLM warnings, bars or kills
    assert noise == [], "\n".join(noise[:30])
