"""qd.llm.ledger: the counts the store keeps survive a round trip through its rows."""

import json

from qd.llm import Completion, Ledger


def test_ledger_rows_round_trip():
    led = Ledger()
    led.add(Completion("t", "m", 3, 4, 0.5, False, "stop", 0.1))
    led.add(Completion("t", "m", 3, 4, 0.5, True, "stop", 0.1), role="judge")
    led.fail("operator", "m")
    led.retry("operator", "m")
    led.in_flight = 2
    restored = Ledger.from_rows(json.loads(json.dumps(led.rows())))
    assert restored.in_flight == 0  # nothing is in flight after a restart
    assert restored.as_dict() == {**led.as_dict(), "in_flight": 0}
    assert restored.as_dict()["per_role"]["judge"]["cached"] == 1
