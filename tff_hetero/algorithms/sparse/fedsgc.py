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
  re-prune (the union average over every upload it holds, remembered ones
  included) and 0 where no upload holds the element: on a weight some
  client grew and trained it is the direction the clients moved it; on one
  the global model had dropped but a remembered upload still holds, the
  sign of that remembered value. The metrics `grow_candidates_with_direction`
  (share of growth candidates whose map entry is non-zero), `grown_congruent`
  (grown weights taken from the congruent set), `pruned_incongruent` and
  `direction_nonzero_inactive` (share of the new global model's inactive
  weights with a non-zero entry) show how much it informs. Round 1's map is
  all zero (nothing aggregated yet): its readjustments follow FedDST's rule.
* Congruence. The map is a change (w_t - w_{t-1}); a client's
  pseudo-gradient is compared in the same convention (w_now - w_received),
  and an inactive weight's "learning direction" is minus its loss gradient
  (the way SGD would move it), so "the same learning direction sign as the
  global direction" means -sign(g) = sign(map). A weight whose map entry is
  0 is neither congruent nor incongruent. (Eq. 3's text names the client's
  pseudo-gradient for growth too; on a weight that was never active it is
  always 0, so growth read that way could never be guided.)
* `congruity_lambda` is one share for pruning and growing (the paper's
  lambda names the pruning share; a code sketch in FedPruning/FedPruning,
  not confirmed as the authors', uses 0.01 for pruning and 0.1 for
  growing); default 0.5. The guided count is floor(lambda x k) of the k
  weights pruned (or grown), taken from the incongruent (congruent) set
  first; the other reading, lambda x the size of that set, would tie the
  share to how informative the map is. `--prune_alpha` defaults to 0.2 (the paper's value
  was lost; FedDST's code defaults to 0.5, its CIFAR example uses 0.01,
  RigL 0.3).
* Growth picks among the weights inactive after the pruning, a weight just
  pruned included (RigL), so every layer returns to its ERK density and a
  layer ERK makes dense stays dense ("the same portion is regrown ... to
  achieve the target sparsity level"); a regrown weight keeps its value,
  newly active ones start at zero.
* The loss gradient that ranks growth is dense (masked weights included)
  and averaged over the batches trained since the round began or since the
  client's previous readjustment (Appendix A.1: "few epochs of full training
  are needed in the re-adjust round for neuron growth"); FedDST's code uses
  the last batch's.
* Schedule (Section 3.1). The server requests readjustment every
  `--readjust_every` rounds (default every round) up to
  `--readjust_end_round` (default: no limit); a requested client readjusts
  after each cumulative training epoch t with t >= `--readjust_begin_epoch`
  (default ceil(E / 2) of E local epochs: mid-round, as the code sketch
  does (its E // 2 + 1 for odd E), so grown weights train before the upload
  and the map has values on them; with E = 1 it is the end of training),
  every `--readjust_delta_epochs` (default E) and t < E_end
  (`--readjust_end_epoch`, default the client's expected total epochs
  E x rounds x clients per round / clients), pruning alpha_t =
  `--prune_alpha` / 2 (1 + cos(pi t / E_end)). The paper gives no values for
  Delta, E_end or the request interval.
* Server memory (`--sgc_memory`): "we still consider the parameters and
  masks that are held by those clients who do not participate". `models`
  (default, the literal reading): the last uploaded values and mask of every
  client count in Eq. 5, weighted by its examples, until it uploads again
  (clients never sampled count for nothing); `updates`: instead their last
  change to the model they were sent, added to the current model (re-added
  every round until replaced); `none`: this round's uploads only (FedDST's
  aggregation). The memory is server state (one row per client,
  checkpointed); its running sums are float32 and updated by subtracting a
  client's old row, so value sums may drift by rounding over many rounds
  (weight sums are integers and exact). A sampled client without data sends
  nothing and keeps its row, in the memory and in the sums. A client whose
  values are not finite sends zeros with weight 0 (its row then has weight
  0 and counts for nothing), as TFF's FedAvg client work does, counted in
  the metric `non_finite_updates` (every sparse algorithm;
  `build_feddst_process`: `metrics["sparse"]["non_finite_updates"]`).
* Server re-prune per kernel to its ERK budget (FedDST's layer-wise
  re-prune; the paper's wording reads as one global count), every round.
* Masks cover convolution and dense kernels only (RigL, FedDST); biases and
  batch-norm parameters are dense, always sent, and have no map entry. The
  initial masks are random at each kernel's ERK budget ("a random sparse
  topology"); FedDST's code magnitude-prunes the random initial weights.
* Clients are weighted by the examples they trained (FedDST's code weighs by
  `train_size()`, which counts two per batch).
* Accounting (the paper's appendix charges the direction map and the mask on
  readjust rounds only): the direction map goes, packed at 2 bits per
  element (three values), only on requested rounds; an upload carries a
  kernel's bit mask only when the client's readjustment changed it; the
  model download always carries the global bit masks, because the union
  re-prune can change the global mask in any round (with memory it does in
  most) and a client does not hold the previous global model. Uploads add
  the float32 aggregation weight and the metric sums; message headers are
  not counted. Client compute is the dense model's training MACs (the
  masked zeros are multiplied too on this hardware), not the sparse count
  of the paper's Appendix A.1.
* Local training is vanilla SGD (the paper; `--client_momentum` applies);
  FedDST's code uses momentum 0.9 and L2 0.001.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Sequence
import math
from typing import Any
from typing import Optional

import attrs
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms import api
from tff_hetero.algorithms import learning_process
from tff_hetero.algorithms.sparse import computations
from tff_hetero.algorithms.sparse import sparse_process
from tff_hetero.algorithms.sparse import training
from tff_hetero.algorithms.sparse.settings import DynamicSparseSettings
from tff_hetero.settings import in_interval
from tff_hetero.settings import setting


@attrs.frozen(kw_only=True)
class FedSGCSettings(DynamicSparseSettings):
  congruity_lambda: float = setting(
    0.5,
    "FedSGC: share of each prune/grow guided by gradient congruity.",
    check=in_interval(0, 1, closed_high=True),
  )
  sgc_memory: str = setting(
    "models",
    "FedSGC: what the server remembers of clients absent this round: models"
    " (their last uploaded values and masks, the paper's literal reading),"
    " updates (their last change to the model they were sent), none (this"
    " round's uploads only, as FedDST).",
    choices=computations.MEMORIES,
  )


def build_fedsgc_process(
  model_fn: Callable[[], tf.keras.Model],
  *,
  input_spec: Any,
  client_optimizer_fn: tff.learning.optimizers.Optimizer,
  client_ids: Sequence[Hashable],
  local_epochs: int,
  readjust_end_epoch: int,
  sparsity: float = 0.8,
  prune_alpha: float = 0.2,
  congruity_lambda: float = 0.5,
  sgc_memory: str = "models",
  readjust_every: int = 1,
  readjust_end_round: int = 0,
  readjust_begin_epoch: int = 0,
  readjust_delta_epochs: int = 0,
  prox_mu: float = 0.0,
  mask_seed: int = 0,
  model_aggregator=None,
  loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
  metrics_fn: Optional[Callable[[], list[tf.keras.metrics.Metric]]] = None,
) -> sparse_process.SparseProcess:
  """FedSGC (module docstring) as a `sparse_process.SparseProcess`.

  The same client and server steps as `--algorithm=fedsgc`, with the
  settings of `FedSGCSettings` as keyword arguments (checked by it: an
  error names the setting as its `--flag`). `next(state, {client_id:
  dataset})` runs a round of the named clients; the server memory has one
  row per id of `client_ids`. The loss and metrics are `loss_fn()`'s
  and `metrics_fn()`'s (None: cross-entropy on logits, accuracy).

  Args:
    model_fn: No-arg callable returning a fresh, identically initialised
      `tf.keras.Model` (logits out); its Dense and Conv kernels are masked.
    input_spec: Spec of one batch of client data.
    client_optimizer_fn: The clients' `tff.learning.optimizers.Optimizer`.
    client_ids: Every client that may take part (distinct, hashable).
    local_epochs: E, the passes over its data a client's dataset holds.
    readjust_end_epoch: E_end, the cumulative epoch from which a client no
      longer readjusts (the cosine's end), e.g. E x rounds x clients per
      round / clients.
    sparsity .. readjust_delta_epochs, prox_mu: `FedSGCSettings`'s (0 for
      the begin and delta epochs: ceil(E / 2) and E).
    mask_seed: Seeds the random initial masks.
    model_aggregator: An unweighted-sum-based factory forming the masked
      sums (default `tff_hetero.aggregators.MaskedSumFactory()`); only
      with `sgc_memory="none"` (the memory keeps raw uploads).

  No server optimizer or client weighting: the server takes the union
  average by examples, then re-prunes (`sparse_process`).
  """
  task, ids = sparse_process.checked_task(
    model_fn,
    input_spec,
    client_optimizer_fn,
    client_ids,
    local_epochs,
    loss_fn,
    metrics_fn,
  )
  learning_process.check_positive("readjust_end_epoch", readjust_end_epoch)
  if model_aggregator is not None and sgc_memory != "none":
    raise ValueError(
      "model_aggregator applies only with sgc_memory='none': the server"
      " memory keeps each client's raw upload and replaces it in the running"
      " sums, which a clipped or noised sum would not match"
    )
  settings = FedSGCSettings(
    sparsity=sparsity,
    prune_alpha=prune_alpha,
    congruity_lambda=congruity_lambda,
    sgc_memory=sgc_memory,
    readjust_every=readjust_every,
    readjust_end_round=readjust_end_round,
    readjust_begin_epoch=readjust_begin_epoch,
    readjust_delta_epochs=readjust_delta_epochs,
    readjust_end_epoch=readjust_end_epoch,
    prox_mu=prox_mu,
  )
  schedule = training.readjust_schedule(
    settings,
    local_epochs,
    begin_epoch=math.ceil(local_epochs / 2),
    end_epoch=readjust_end_epoch,
  )
  algorithm = training.SparseTraining(
    "fedsgc",
    task,
    ids,
    sparsity=settings.sparsity,
    schedule=schedule,
    congruity_lambda=settings.congruity_lambda,
    memory=settings.sgc_memory,
    client_optimizer=client_optimizer_fn,
    prox_mu=settings.prox_mu or 0.0,
    local_epochs=local_epochs,
    seed=mask_seed,
    model_aggregator=model_aggregator,
    growth_gradient="accumulated",
  )
  return sparse_process.SparseProcess(algorithm)


def build_fedsgc(
  config, task: api.Task, client_ids: Sequence[str] = ()
) -> training.SparseTraining:
  return training.build_sparse_training(
    "fedsgc",
    config,
    task,
    client_ids,
    congruity_lambda=config.settings.congruity_lambda,
    memory=config.settings.sgc_memory,
    begin_epoch=math.ceil(config.local_epochs / 2),
    growth_gradient="accumulated",
  )
