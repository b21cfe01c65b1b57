"""Test fakes of the stage-port boundary: :mod:`.fake_port` (a scripted engine, for fast rule
tests and benchmarks of the ledger's own overhead; never a stand-in for vLLM's behaviour) and
:mod:`.faults` (fault injection around any port)."""
