from projections.projector import Projector


def project(builder, until=None):
    """Fold the builder's log (optionally up to a position) and return the Projector."""
    events = builder.stored if until is None else [s for s in builder.stored if s.position <= until]
    return Projector().apply_all(events)


def leak_tuples(projector, **kw):
    return [(f.session_id, f.stage_id, f.request_id, f.kind) for f in projector.leaks(**kw)]


def turn(projector, response_id):
    matches = [t for t in projector.turn_tables if t.response_id == response_id]
    assert len(matches) == 1, f"expected exactly one table for {response_id}, got {len(matches)}"
    return matches[0]
