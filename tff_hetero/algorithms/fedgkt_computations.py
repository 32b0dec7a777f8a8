"""FedGKT's typed TFF computations: one round, features kept in TFF values.

He, Annavaram and Avestimehr, "Group Knowledge Transfer: Federated Learning
of Large CNNs at the Edge" (NeurIPS 2020), Algorithm 1; `fedgkt.py` states
the algorithm and drives the rounds, `fedgkt_steps.py` holds the
`tf.function`s wrapped here.

Types, with M = <trainable, non_trainable, optimizer_state> of the edge,
D = a client's batches <x, y, index=int64[?], train=bool, has_teacher=bool,
teacher=float32[?, C]>, U = `GKTUpload` <features=float32[?, h, w, c],
logits=float32[?, C], labels=int32[?]>, T = `TaggedUpload` <U,
owners=int32[?], valid=float32[?]>, Z = `UploadSizes` <bytes_up=int64,
samples=int64, feature_bytes=int64, non_finite=int32>, P = `ServerPlan` <group_ends=int32[?],
group_samples=int32[?], orders=int64[?], order_ends=int32[?]>, S = the
server's `ModelWeights`, O = its optimizer state and R = `ServerResult`
<S, O, train sums, fresh correct=float32, answers=float32[?, C],
answer_owners=int32[?], seconds=float64>:

    client_step: (<M, D*, int32> -> <M, T, Z, metric sums>)
    server_step: (<S, O, T, P> -> R)
    round: (<S@SERVER, O@SERVER, P@SERVER, M@CLIENTS, {D*}@CLIENTS,
             int32@CLIENTS (cohort position)> ->
            <R@SERVER, <rows=<M[?], Z[?]>, positions=int32[?]>@SERVER,
             metric sums@SERVER>)

`round` maps `client_step` over the clients, gathers their tagged uploads
with `cohort_positions.concatenated` (a `tff.federated_aggregate` whose
accumulator concatenates; so does the merge of several workers'
accumulators), and maps `server_step` over the
gathered uploads at the server. On one TFF worker the features, the
largest part of the traffic, thus stay inside the worker, from the clients
to the server, and never reach the Python driver; what comes back to the
driver is the server's state and the answers, which it keeps per client in
the program's client-state store and puts into each client's next data
(`teacher`).

The clients' new edge models and upload sizes come back SERVER-placed too,
stacked with their cohort positions (`cohort_positions.gather`, the same
concatenating aggregate), so every result is SERVER-placed. On several TFF
workers the computation runs through TFF 0.87's mergeable context: each
worker runs the part up to the aggregation on its share of the clients, the
driver relays the workers' partial accumulators to the merge (so the
features do pass through the driver there), and, since no result is
CLIENTS-placed, TFF runs the part after the merge, `server_step`, once, on
one worker (`_invoke_mergeable_comp_form`). The workers' shares arrive in
the order they finish: each client tags its samples and its row with its
cohort position, the server sorts the samples by their tags (stable) before
training, and the driver reads the rows by position. The CLIENTS-placed
arguments come last: TFF 0.87's mergeable
context splits an argument's clients among the workers element by element
and carries the split's progress over from the last element only
(`_partition_value`), so a SERVER-placed last element made every worker
train the first clients again (measured: 800 samples received from a cohort
of three 200-sample clients on two workers).

The server's input is tensors, not a `tf.data` dataset, which TFF would
serialize with the features inside as graph constants (capped at 100 MB).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.algorithms import cohort_positions
from tff_hetero.algorithms import fedgkt_steps as steps
from tff_hetero.algorithms import learning_process


class GKTComputations:
  """FedGKT's typed computations for one edge/server pair (module docstring):
  `client_step`, `server_step` and `round`."""

  def __init__(
    self,
    edge_fn,
    server_fn,
    split_layer: str,
    element_spec,
    client_initial: steps.ClientModel,
    server_initial: tff.learning.models.ModelWeights,
    server_optimizer_initial,
    client_optimizer,
    server_optimizer,
    settings: steps.GKTSettings,
    num_classes: int,
    feature_shape: Sequence[int],
  ):
    client_type = learning_process.type_of(client_initial)
    data_type = tff.SequenceType(learning_process.type_of(element_spec))
    server_type = learning_process.type_of(server_initial)
    optimizer_type = learning_process.type_of(server_optimizer_initial)
    upload_spec = steps.GKTUpload(
      features=tf.TensorSpec([None, *feature_shape], tf.float32),
      logits=tf.TensorSpec([None, num_classes], tf.float32),
      labels=tf.TensorSpec([None], tf.int32),
    )
    tagged_type = learning_process.type_of(
      steps.TaggedUpload(
        upload_spec,
        tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([None], tf.float32),
      )
    )
    plan_type = learning_process.type_of(
      steps.ServerPlan(
        group_ends=tf.TensorSpec([None], tf.int32),
        group_samples=tf.TensorSpec([None], tf.int32),
        orders=tf.TensorSpec([None], tf.int64),
        order_ends=tf.TensorSpec([None], tf.int32),
      )
    )

    @tff.tensorflow.computation(
      client_type, data_type, cohort_positions.POSITION_TYPE
    )
    def client_step(model, data, position):
      update = steps.build_edge_update(
        edge_fn, split_layer, client_optimizer, settings
      )
      return update(steps.ClientModel(*model), data, position)

    @tff.tensorflow.computation(
      server_type, optimizer_type, tagged_type, plan_type
    )
    def server_step(weights, optimizer_state, received, plan):
      update = steps.build_server_update(server_fn, server_optimizer, settings)
      return update(
        tff.learning.models.ModelWeights(*weights),
        optimizer_state,
        steps.TaggedUpload(
          steps.GKTUpload(*received.upload), received.owners, received.valid
        ),
        steps.ServerPlan(*plan),
      )

    @tff.federated_computation(
      tff.FederatedType(server_type, tff.SERVER),
      tff.FederatedType(optimizer_type, tff.SERVER),
      tff.FederatedType(plan_type, tff.SERVER),
      tff.FederatedType(client_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
      cohort_positions.POSITIONS_AT_CLIENTS,
    )
    def round_(weights, optimizer_state, plan, models, data, positions):
      new_models, uploads, sizes, sums = tff.federated_map(
        client_step, (models, data, positions)
      )
      received = cohort_positions.concatenated(uploads)
      result = tff.federated_map(
        server_step, (weights, optimizer_state, received, plan)
      )
      return (
        result,
        cohort_positions.gather(
          tff.federated_zip((new_models, sizes)), positions
        ),
        tff.federated_sum(sums),
      )

    self.client_step = client_step
    self.server_step = server_step
    self.round = round_
