"""FedDST (Bibikar et al., "Federated Dynamic Sparse Training: Computing Less,
Communicating Less, Yet Learning Better", AAAI 2022).

The machinery of this package with congruity_lambda = 0 (prune the smallest
magnitudes, grow the largest loss gradients: RigL's rule) and FedDST's
aggregation: this round's uploads only, masks OR-ed (its `--min-votes 0`),
then a per-layer magnitude re-prune to the target sparsity.

Timing as in FedDST's code (bibikar/feddst, `dst.py`): a client readjusts at
the end of an epoch whose cumulative index falls on its schedule
(`pruning_begin = 9`, `pruning_interval = 10` with 10 local epochs: the last
epoch of each round), i.e. at the end of local training, with the loss
gradient of the last batch recomputed after its step; here the default first
epoch is E and the interval E, so the grown weights go up at zero. It never
reads a direction map, and none is sent to it.

Decisions against FedDST's code, each so that FedDST and FedSGC differ only
in what FedSGC adds (criterion, readjust point, growth gradient, memory):

* RigL's ERK densities (`masks.erk_densities`) instead of its linearly
  scaled sparsities (which also count biases);
* the cosine prune fraction is applied, keyed on the client's cumulative
  epochs like FedSGC's (its code computes a per-round cosine value but
  prunes with the raw ratio);
* growth only among weights inactive after the pruning (its top-|gradient|
  can pick active weights and zero them); a just-pruned weight may come back
  and keeps its value, so dense layers stay dense;
* the server requests readjustment on the same rounds as for FedSGC
  (`--readjust_every`, default every round, no end): its code requests on
  0-based rounds with (r - 1) % 10 == 0 (1-based 2, 12, 22, ...) and stops at
  half the rounds;
* random initial masks at the ERK budgets (its code magnitude-prunes the
  random initial weights);
* clients weighted by examples trained (its code: two per batch), sampled
  without replacement; local SGD without momentum or L2 unless the run's
  `--client_momentum` says otherwise, for every method (its code: momentum
  0.9, L2 0.001; FedSGC's paper: vanilla SGD).
"""

from __future__ import annotations

from collections.abc import Sequence

from tff_hetero.algorithms import api
from tff_hetero.algorithms.sparse import training


def build_feddst(
  config, task: api.Task, client_ids: Sequence[str] = ()
) -> training.SparseTraining:
  return training.build_sparse_training(
    "feddst",
    config,
    task,
    client_ids,
    congruity_lambda=0.0,
    memory="none",
    begin_epoch=config.local_epochs,
    growth_gradient="last_batch",
  )
