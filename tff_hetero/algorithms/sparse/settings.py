"""Settings the sparse-training algorithms share (`tff_hetero.settings`).

`SparseSettings`: every algorithm that trains a masked model (FedDST,
FedSGC, PruneFL, GraSP). `DynamicSparseSettings`: those that readjust the
mask on the clients on an epoch schedule (FedDST, FedSGC); each algorithm
adds its own fields in its module.
"""

from __future__ import annotations

import attrs

from tff_hetero.algorithms.fedprox import prox_mu_setting
from tff_hetero.settings import AlgorithmSettings
from tff_hetero.settings import in_interval
from tff_hetero.settings import non_negative_int
from tff_hetero.settings import setting

_READERS = "FedSGC/FedDST"


@attrs.frozen(kw_only=True)
class SparseSettings(AlgorithmSettings):
  sparsity: float = setting(
    0.8,
    "Fraction of kernel weights masked.",
    check=in_interval(0, 1, closed_high=False),
  )
  prox_mu: float | None = prox_mu_setting()


@attrs.frozen(kw_only=True)
class DynamicSparseSettings(SparseSettings):
  readjust_every: int = setting(
    1,
    f"{_READERS}: the server requests mask readjustment on rounds 1, 1+N,"
    " 1+2N, ... (0: never); requested clients readjust on their epoch"
    " schedule.",
    check=non_negative_int("never"),
  )
  readjust_end_round: int = setting(
    0,
    f"{_READERS}: last round the server requests readjustment (0: no limit).",
    check=non_negative_int("no limit"),
  )
  readjust_delta_epochs: int = setting(
    0,
    f"{_READERS}: a client readjusts every N of its cumulative training"
    " epochs (0: --local_epochs).",
    check=non_negative_int("--local_epochs"),
  )
  readjust_begin_epoch: int = setting(
    0,
    f"{_READERS}: the first cumulative epoch after which a client"
    " readjusts (0: FedSGC ceil(E/2), mid-round; FedDST E, end of local"
    " training).",
    check=non_negative_int("the algorithm's"),
  )
  readjust_end_epoch: int = setting(
    0,
    f"{_READERS}: E_end, no readjustment from this cumulative epoch on; the"
    " cosine prune fraction reaches 0 there (0: a client's expected total"
    " epochs, local_epochs x rounds x clients_per_round / num_clients; give"
    " it explicitly to resume with another --rounds).",
    check=non_negative_int("a client's expected total epochs"),
  )
  prune_alpha: float = setting(
    0.2,
    f"{_READERS}: initial prune fraction of the cosine schedule.",
    check=in_interval(0, 1, closed_high=True),
  )
