"""FedSGC ("Gradient-Congruity Guided Federated Sparse Training"; paper text in
the project's shared papers; equations reconstructed from FedDST and RigL as
the reading notes say).

Dynamic sparse training with a gradient-congruity guided prune-and-grow:
on readjustment rounds a client prunes first the weights whose local
pseudo-gradient opposes the global direction map sign(w_t - w_{t-1}) and
grows first the weights whose learning direction agrees with it (a share
`congruity_lambda` of each; the rest by magnitude); the server averages every
element over the uploads that hold it, counting the last upload of clients
not sampled this round, ORs the masks and re-prunes by magnitude to the ERK
budgets. All mechanics are in `sparse_training.py`.

Decisions where the paper is silent (its equations were lost):
* `congruity_lambda` is one share for pruning and growing (the reference
  sketch FedPruning/... uses 0.01 and 0.1); default 0.5;
* "learning direction" of an inactive weight is minus its loss gradient, and
  a weight whose global direction is 0 is neither congruent nor not;
* the server counts the last upload of absent clients (the reading notes);
  `--nosgc_remember_uploads` averages this round's uploads only, for the
  ablation that separates this memory from the congruity-guided readjust;
* readjustment happens after E // 2 + 1 of E local epochs (reference code),
  on rounds 1, 1 + r, 1 + 2r, ... up to `--readjust_end_round`, with the
  cosine prune fraction of the round (`sparse_training.prune_fraction`).
"""

from __future__ import annotations

from tff_hetero.algorithms import api
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms import sparse_training


def build_sparse_algorithm(name: str, config, task: api.Task, *,
                           congruity_lambda: float, remember_uploads: bool
                           ) -> sparse_training.SparseTraining:
  """A `SparseTraining` from the run's flags (shared with `feddst.py`)."""
  end = config.readjust_end_round or max(1, config.rounds // 2)
  return sparse_training.SparseTraining(
      name, task, sparsity=config.sparsity,
      readjust_every=config.readjust_every, readjust_end_round=end,
      prune_alpha=config.prune_alpha, congruity_lambda=congruity_lambda,
      remember_uploads=remember_uploads,
      client_optimizer=learning_process.client_sgd(config.client_lr,
                                                   config.client_momentum),
      prox_mu=config.prox_mu or 0.0, local_epochs=config.local_epochs,
      seed=config.seed)


def build_fedsgc(config, task: api.Task, client_ids=()):
  del client_ids  # Every client is alike to the server.
  return build_sparse_algorithm("fedsgc", config, task,
                                congruity_lambda=config.congruity_lambda,
                                remember_uploads=config.sgc_remember_uploads)
