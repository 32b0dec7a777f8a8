"""CommLedger: recording, totals, per-client totals and checkpoint round trip."""

from tff_hetero.accounting import ClientTraffic
from tff_hetero.accounting import CommLedger


def _ledger():
  ledger = CommLedger()
  ledger = ledger.record(
    1,
    [
      ClientTraffic("a", 100, 10, 1000, 5),
      ClientTraffic("b", 100, 20, 2000, 7),
    ],
  )
  return ledger.record(2, [ClientTraffic("b", 50, 5, 500, 3)])


def test_record_is_immutable_and_totals_add_up():
  empty = CommLedger()
  ledger = _ledger()
  assert empty.totals().bytes_up == 0
  assert ledger.round_totals(1).bytes_up == 30
  assert ledger.round_totals(1).num_clients == 2
  assert ledger.round_totals(2).bytes_down == 50
  totals = ledger.totals()
  assert (
    totals.bytes_down,
    totals.bytes_up,
    totals.flops,
    totals.examples,
  ) == (250, 35, 3500, 15)
  assert ledger.totals(up_to_round=1).bytes_down == 200


def test_per_client_totals():
  per_client = _ledger().per_client_totals()
  assert list(per_client) == ["a", "b"]
  assert per_client["b"]["bytes_up"] == 25
  assert per_client["b"]["rounds"] == 2
  assert per_client["a"]["flops"] == 1000


def test_array_round_trip():
  ledger = _ledger()
  restored = CommLedger.from_arrays(ledger.client_ids, ledger.to_arrays())
  assert restored.totals() == ledger.totals()
  assert restored.per_client_totals() == ledger.per_client_totals()
