"""FedSGC ("Gradient-Congruity Guided Federated Sparse Training"; the paper's
text is in the project's shared papers, its equations lost in conversion and
reconstructed from FedDST and RigL as the reading notes say).

Dynamic sparse training (ERK masks on every convolution and dense kernel,
masked local SGD) in which a client's readjustment prunes first the weights
whose local pseudo-gradient opposes the global direction map and grows first
the weights whose learning direction agrees with it (a share
`congruity_lambda` of each; the rest by magnitude, Eq. 1-4); the server
averages each element over the uploads that hold it, including what it
remembers of clients absent this round (Eq. 5), takes the OR of the masks
and re-prunes by magnitude to the target sparsity (Section 3.3). Mechanics:
`prune_grow.py` (pure TF), `client_update.py` (the client's `tf.function`),
`computations.py` (typed TFF computations), `training.py` (the driver).

Readings and departures, each on purpose:

* Global direction map. The paper: "the direction of the change in the
  global parameters after each round of aggregation". Taken literally
  (sign(w_t - w_{t-1}) of two masked global models) it is 0 on every weight
  a client could grow, so guided growth never acts (measured before this
  reading: 0 non-zero entries among ~17,500 inactive weights), and on a
  weight the server just dropped it points to zero. Here it is
  sign(w~_t - w_{t-1}) with w~_t the server's aggregate *before* the global
  re-prune (the union average over every upload that holds an element) and
  0 where no upload holds the element: on a weight some client grew and
  trained, it is the direction the clients moved it, which is what the
  growth criterion compares a local gradient with. The metrics
  `grow_candidates_with_direction` (share of growth candidates whose map
  entry is non-zero), `grown_congruent` (grown weights taken from the
  congruent set) and `direction_nonzero_inactive` (share of the new global
  model's inactive weights with a non-zero entry) show how much it informs.
* `congruity_lambda` is one share for pruning and growing (the paper's
  lambda names the pruning share; a code sketch in FedPruning/FedPruning,
  not confirmed as the authors', uses 0.01 for pruning and 0.1 for
  growing); default 0.5.
* "Learning direction" of a weight is minus its loss gradient; a weight whose
  map entry is 0 is neither congruent nor incongruent.
* Growth picks among the weights inactive after the pruning, a weight just
  pruned included (RigL), so every layer returns to its ERK density and a
  layer ERK makes dense stays dense ("the same portion is regrown ... to
  achieve the target sparsity level"); a regrown weight keeps its value,
  newly active ones start at zero.
* Schedule (Section 3.1). The server requests readjustment every
  `--readjust_every` rounds (default every round) up to
  `--readjust_end_round` (default: no limit); a requested client readjusts
  after each cumulative training epoch t with t >= `--readjust_begin_epoch`
  (default E // 2 + 1 of E local epochs: mid-round, as the code sketch
  does, so grown weights train before the upload and the direction map has
  values on them), every `--readjust_delta_epochs` (default E) and t < E_end
  (`--readjust_end_epoch`, default the client's expected total epochs
  E x rounds x clients per round / clients), pruning alpha_t =
  `--prune_alpha` / 2 (1 + cos(pi t / E_end)). The paper gives no values for
  Delta, E_end or the request interval.
* The loss gradient that ranks growth is that of the due epoch's last batch,
  recomputed after its step without the FedProx term (FedDST's code).
* Server memory (`--sgc_memory`): "we still consider the parameters and
  masks that are held by those clients who do not participate". `models`
  (default, the literal reading): the last uploaded values and mask of every
  client count in Eq. 5; `updates`: instead their last change to the model
  they were sent, added to the current model; `none`: this round's uploads
  only (FedDST's aggregation). The memory is server state (one row per
  client, checkpointed).
* Server re-prune per kernel to its ERK budget (FedDST's layer-wise
  re-prune), not one global threshold, so the ERK distribution holds.
* Accounting (the paper's appendix charges the direction map and the mask on
  readjust rounds only): the direction map goes, packed at 2 bits per
  element, only on requested rounds; an upload carries a kernel's bit mask
  only when the client's readjustment changed it; the model download always
  carries the global bit masks, because the union re-prune can change the
  global mask in any round (with memory it does in most) and a client does
  not hold the previous global model. Message headers are not counted.
"""

from __future__ import annotations

from collections.abc import Sequence

from tff_hetero.algorithms import api
from tff_hetero.algorithms.sparse import training


def build_fedsgc(config, task: api.Task,
                 client_ids: Sequence[str] = ()) -> training.SparseTraining:
  return training.build_sparse_training(
      "fedsgc", config, task, client_ids,
      congruity_lambda=config.congruity_lambda, memory=config.sgc_memory,
      begin_epoch=config.local_epochs // 2 + 1)
