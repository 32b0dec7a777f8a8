"""FedDST (Bibikar et al., "Federated Dynamic Sparse Training: Computing Less,
Communicating Less, Yet Learning Better", AAAI 2022).

The machinery of `sparse_training.py` with congruity_lambda = 0 (prune the
smallest magnitudes, grow the largest loss gradients: RigL's rule) and
FedDST's aggregation: over this round's uploads only, masks OR-ed (FedDST's
`--min-votes 0`), then magnitude re-prune to the ERK budgets.

Decisions against FedDST's code (bibikar/feddst): RigL's ERK densities
instead of its linearly scaled sparsities; the cosine prune fraction is used
(the code computes it but prunes with the raw ratio); growth only among
weights inactive before the pruning (the code's top-|gradient| can pick
active weights); clients sampled without replacement.
"""

from __future__ import annotations

from tff_hetero.algorithms import api
from tff_hetero.algorithms import fedsgc


def build_feddst(config, task: api.Task, client_ids=()):
  del client_ids  # Every client is alike to the server.
  return fedsgc.build_sparse_algorithm("feddst", config, task,
                                       congruity_lambda=0.0,
                                       remember_uploads=False)
