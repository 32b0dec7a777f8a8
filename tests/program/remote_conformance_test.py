"""Algorithm families the other remote tests do not cover, on three workers.

`tests/program/executors_test.py` runs FedAvg (one and two workers),
AdaptiveFL, FedGKT, FedSGC and the FedDST process across workers.
Here SPATL (per-client predictors and selections returned by cohort
position) and split learning (the server's half trained on the driver
between worker calls) run on the local runtime and on three workers started
as an operator would, and must end with the same weights, bytes and accuracy
(`tff_hetero.program.conformance`). `tools/remote_conformance.py` checks
every registered algorithm the same way, on one worker as well; InclusiveFL
(one computation per depth group, like AdaptiveFL's one per sub-model
above) took 66 s of CI here and is left to the tool.
"""

import pytest

from tff_hetero.program import conformance
from tff_hetero.runtime import testing as proc_testing

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def three_workers():
  with proc_testing.cli_workers(3) as workers:
    yield [w.address for w in workers]


@pytest.mark.parametrize("algorithm", ["spatl", "split_learning"])
def test_three_workers_end_where_the_local_runtime_ends(
  algorithm, three_workers, tmp_path
):
  # One round and one client per worker: the splits, the per-client
  # results coming back by cohort position, at the least cost.
  row = conformance.conform(
    algorithm,
    three_workers,
    str(tmp_path),
    atol=1e-4,
    one_worker=False,
    rounds=1,
    eval_every=1,
    checkpoint_every=1,
    num_clients=3,
    clients_per_round=3,
  )
  assert row["all"]["same_bytes"], row
  assert row["all"]["same_accuracy"], row
  assert row["all"]["max_weight_diff"] <= 1e-4, row
