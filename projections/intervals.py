"""Every interval the tables print, defined once (DOMAIN §5.3, §5.6; CASE-03/08/09/10).

All functions take two stamps of ONE clock — wall-clock epoch seconds (event ``ts``,
``stage_submit_ts``, chunk receipts) or the engine's monotonic seconds — never one of each
(CASE-08: the caller picks the pair, this module never mixes them). Spans are computed on
integer microseconds, so log timestamps (already exact to the µs, ``events.types``) give exact
milliseconds: ``190.0``, never ``189.9999999999995``. Units are in the names.

* :func:`span_ms` — end − start;
* :func:`ttft_ms` — time to first token: first token-carrying output − the submit of *this*
  segment/turn (DOMAIN §5.6; CASE-10 for resident segments); None without a token;

:func:`ttft_ms`, :func:`tpot_ms` and :func:`gen_ms` never return a negative value: a span whose
end stamp is earlier than its start (the host's clock stepped back) is 0 (DOMAIN §5.7 D17; the
turns fold reports it, once, with both positions). :func:`span_ms` keeps the sign.
* :func:`tpot_ms` — time per output token of one segment: (last − first token) / (n − 1);
  None for fewer than 2 tokens (CASE-03: never a 0 or −1 denominator). The turn value over
  several segments is the token-weighted mean of ``projections.collapse`` (DOMAIN §5.4, M7);
* :func:`gen_ms` — a segment's generation time: last output − start, never negative.
"""

from __future__ import annotations

from events.types import ts_to_us


def span_ms(start_s: float, end_s: float) -> float:
    """(end − start) in ms, on integer microseconds (both stamps of one clock)."""
    return (ts_to_us(end_s) - ts_to_us(start_s)) / 1000.0


def ttft_ms(submit_s: float | None, first_token_s: float | None) -> float | None:
    """First token − submit (ms); None when either stamp is missing (no token: no TTFT)."""
    if submit_s is None or first_token_s is None:
        return None
    return max(span_ms(submit_s, first_token_s), 0.0)  # D17: a clock stepped back shows 0


def tpot_ms(first_token_s: float | None, last_token_s: float | None, num_tokens_out: int | None) -> float | None:
    """(last − first token) / (n − 1) in ms; None for n < 2 or a missing stamp."""
    if first_token_s is None or last_token_s is None or num_tokens_out is None or num_tokens_out < 2:
        return None
    return max(span_ms(first_token_s, last_token_s), 0.0) / (num_tokens_out - 1)  # D17


def gen_ms(start_s: float | None, last_output_s: float | None) -> float | None:
    """Last output − start (ms), at least 0; None when either stamp is missing."""
    if start_s is None or last_output_s is None:
        return None
    return max(span_ms(start_s, last_output_s), 0.0)
