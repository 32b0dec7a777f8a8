"""The report's accuracy-by-upload table (FedSGC's Table 2 form)."""

from tff_hetero.program import loop
from tff_hetero.program import make_config

MIB = 1 << 20


def test_best_accuracy_within_each_upload_budget():
  rows = [
    dict(round=1, accuracy=0.2, bytes_up_cumulative=1 * MIB),
    dict(round=2, accuracy=0.5, bytes_up_cumulative=2 * MIB),
    dict(round=3, accuracy=0.4, bytes_up_cumulative=3 * MIB),
  ]
  best = loop.best_accuracy_by_upload(rows, [0.5, 1.0, 2.5, 10.0])
  assert best == {"0.5": None, "1": 0.2, "2.5": 0.5, "10": 0.5}


def test_default_budgets_are_fractions_of_the_run():
  config = make_config()
  assert loop.upload_budgets(config, 8 * MIB) == [1.0, 2.0, 4.0, 8.0]
  explicit = make_config(upload_budgets_mib="100:200")
  assert loop.upload_budgets(explicit, 8 * MIB) == [100.0, 200.0]
