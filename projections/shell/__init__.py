"""The projections' I/O shell: the runner that reads the store and drives the pure folds, the
read-model tables, the checkpoint codec, the 2-process rebuild and the consistency check.

Nothing in ``projections/`` outside this package does I/O (tests/test_layering.py checks it):
the folds are pure functions of the events they are given (issue 23, step 2)."""
