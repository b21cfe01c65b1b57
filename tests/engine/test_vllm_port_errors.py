"""``VllmStagePort._map_error`` (hostile pass): the message of a mapped vLLM error can reach a
client (``FailTurn`` → ``error``), so it names the stage and not the engine request id; the id
stays the error's ``request_id`` and goes to the operator's log. vLLM's real exception classes
are used; the engine is a fake (no engine is started)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine_bridge.ports import EngineDead, PromptTooLong, StagePortError
from engine_bridge.vllm_port import VllmStagePort

vllm_exceptions = pytest.importorskip("vllm.exceptions")
engine_exceptions = pytest.importorskip("vllm.v1.engine.exceptions")

REQUEST_ID = "duplex-s.UzE.i.0.e.0.r.stage0_t3"


def _port() -> VllmStagePort:
    fake_engine = SimpleNamespace(get_tokenizer=lambda: None)
    v = SimpleNamespace(
        EngineDeadError=engine_exceptions.EngineDeadError, VLLMValidationError=vllm_exceptions.VLLMValidationError
    )
    return VllmStagePort(
        fake_engine, v, stage_id=0, name="thinker", model_dir=Path("."), max_model_len=1024, finished=OrderedDict()
    )


@pytest.mark.parametrize(
    ("error", "kind", "says"),
    [
        (engine_exceptions.EngineDeadError(), EngineDead, "stage 0 (thinker): engine dead: EngineCore encountered"),
        (
            vllm_exceptions.VLLMValidationError(
                "This model's maximum context length is 1024 tokens. However, your request has 1100 input tokens."
            ),
            PromptTooLong,
            "stage 0 (thinker): This model's maximum context length is 1024 tokens. However, your request has 1100",
        ),
        (
            engine_exceptions.EngineGenerateError(f"generate of {REQUEST_ID} failed"),
            StagePortError,
            "stage 0 (thinker): EngineGenerateError: generate of <request> failed",  # vLLM's text named it
        ),
    ],
    ids=["engine dead", "context length", "other"],
)
def test_a_mapped_error_names_no_engine_request_id_and_logs_it(
    caplog: pytest.LogCaptureFixture, error: BaseException, kind: type, says: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="engine_bridge.vllm_port"):
        mapped = _port()._map_error(error, REQUEST_ID)
    assert type(mapped) is kind
    assert str(mapped).startswith(says), str(mapped)
    assert REQUEST_ID not in str(mapped) and "duplex-s." not in str(mapped)
    assert mapped.request_id == REQUEST_ID
    logged = [r.getMessage() for r in caplog.records if r.name == "engine_bridge.vllm_port"]
    assert len(logged) == 1 and f"request {REQUEST_ID!r} failed" in logged[0] and "stage 0 (thinker)" in logged[0]
