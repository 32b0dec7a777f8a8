"""What the training program drives: the `FederatedAlgorithm` interface.

An algorithm is a small object with an `initialize` / `next` pair, like FedJAX's
`FederatedAlgorithm`, whose `next` runs one round of TFF federated
computations. The program owns everything around it (sampling, data,
checkpoints, the client-state store, metrics) and the algorithm owns the
computations and says what each client received, sent and computed.

State passed in and out is immutable: `next` returns a new state and the new
states of the clients it touched; nothing is mutated in place, so a checkpoint
taken between rounds is complete.
"""

from __future__ import annotations

import abc
import collections
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf
import tree

from tff_hetero import data
from tff_hetero import models as models_lib
from tff_hetero.accounting import ClientTraffic
from tff_hetero.algorithms import model_fns


def keras_model_of(name: str, model_fn) -> tf.keras.Model:
  """`model_fn()`, or a one-line `TypeError` naming the argument `name` if
  it is not a no-arg factory of Keras models (the public builders' check)."""
  if not callable(model_fn):
    raise TypeError(
      f"{name} must be a no-arg callable returning a tf.keras.Model, got"
      f" {type(model_fn).__name__}"
    )
  model = model_fn()
  if not isinstance(model, tf.keras.Model):
    raise TypeError(
      f"{name} must return a tf.keras.Model, got {type(model).__name__}"
    )
  return model


def all_finite(structure) -> bool:
  """Whether every floating-point leaf of `structure` is finite (NumPy)."""
  return all(
    np.all(np.isfinite(np.asarray(leaf)))
    for leaf in tree.flatten(structure)
    if np.issubdtype(np.asarray(leaf).dtype, np.floating)
  )


@attrs.frozen
class Task:
  """The learning task an algorithm is built for.

  Attributes:
    model_name: Registry name of the Keras model.
    model_fn: No-arg callable returning a fresh, seeded (identically
      initialised) `tf.keras.Model` that outputs logits.
    input_shape: Shape of one example, without the batch dimension.
    num_classes: Number of labels.
    element_spec: Spec of one batch of client data (`OrderedDict(x=, y=)`).
    training_flops_per_example: Compute of one forward+backward pass of the
      full model on one example, in multiply-accumulates, the unit FL papers
      report as FLOPs (see `tff_hetero.models.counting`).
    width_model_fn: `widths -> tf.keras.Model`: the model narrowed to one
      output width per width unit (`tff_hetero.models.width`), seeded like
      `model_fn`; None when the model has no width knobs.
    width_units: The model's width units (empty without width knobs).
    depth_model_fn: `depth -> tf.keras.Model`: the model with `depth`
      encoder blocks (`tff_hetero.models.depth`), seeded like `model_fn`;
      None when the model has no depth knob.
    depths: The model's registered tier depths (e.g. (4, 8, 12); empty
      without a depth knob).
    loss_fn / metrics_fn: No-arg factories of the training loss and the
      metrics (`model_fns.variable_model_fn`; None: cross-entropy on logits
      and accuracy, every registered model's).
  """

  model_name: str
  model_fn: Callable[[], tf.keras.Model]
  input_shape: tuple[int, ...]
  num_classes: int
  element_spec: Any
  training_flops_per_example: int
  width_model_fn: Optional[Callable[[Sequence[int]], tf.keras.Model]] = None
  width_units: tuple[Any, ...] = ()
  depth_model_fn: Optional[Callable[[int], tf.keras.Model]] = None
  depths: tuple[int, ...] = ()
  loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None
  metrics_fn: Optional[Callable[[], list[tf.keras.metrics.Metric]]] = None

  def tff_model_fn(self, keras_model_fn=None, *, plain_graph_methods=True):
    """A no-arg function building a `tff.learning.models.VariableModel`.

    Of the task's model, or of `keras_model_fn`'s (e.g. a sub-model), with
    the task's loss and metrics (None: the default classification loss and
    accuracy, `model_fns.variable_model_fn`; `plain_graph_methods=False`:
    TFF's `from_keras_model` model unchanged).
    """
    return model_fns.variable_model_fn(
      keras_model_fn or self.model_fn,
      self.element_spec,
      self.loss_fn,
      self.metrics_fn,
      plain_graph_methods=plain_graph_methods,
    )

  @classmethod
  def of_keras(
    cls,
    model_fn: Callable[[], tf.keras.Model],
    input_spec: Any,
    loss_fn: Optional[Callable[[], tf.keras.losses.Loss]] = None,
    metrics_fn: Optional[Callable[[], list[tf.keras.metrics.Metric]]] = None,
  ) -> "Task":
    """The task of a user's no-arg Keras factory (checked; the public
    builders' way in). Its model is built once here, to count its FLOPs."""
    probe = keras_model_of("model_fn", model_fn)
    if input_spec is None:
      raise TypeError(
        "input_spec is required: the spec of one batch of client data, e.g."
        " OrderedDict(x=TensorSpec, y=TensorSpec)"
      )
    return cls(
      model_name=getattr(model_fn, "__name__", "model"),
      model_fn=model_fn,
      input_shape=tuple(tf.nest.flatten(input_spec)[0].shape[1:]),
      num_classes=int(probe.output_shape[-1]),
      element_spec=input_spec,
      training_flops_per_example=models_lib.training_flops_per_example(probe),
      loss_fn=loss_fn,
      metrics_fn=metrics_fn,
    )


@attrs.frozen
class ClientRound:
  """One sampled client's inputs to a round.

  Attributes:
    client_id: The client.
    dataset: Its local data for this round: batched `OrderedDict(x=, y=)`,
      already repeated for the local epochs and shuffled with a seed drawn by
      the program.
    num_examples: Examples in `dataset` (all epochs): what the client will
      process if it trains on all of it.
    capacity: Its device capacity this round (`tff_hetero.devices.Capacity`)
      or None when the population has no capacities. It belongs to the
      device population, the same for every algorithm. Algorithms whose
      server must not know it (AdaptiveFL) only hand it to a client-placed
      computation.
    state: Its persistent state from the client-state store (or the
      algorithm's `initial_client_state()` the first time).
    tier: Its device tier name. Only algorithms whose paper assumes the
      server knows each device's class (HeteroFL, Decoupled) may read it.
    assignment: What the algorithm's `plan_round` decided for this client
      (e.g. the sub-model it is sent), or None.
    validation: Its local validation split (`--val_fraction`), batched, one
      unshuffled epoch, for algorithms whose clients evaluate locally
      (SPATL's selection reward); None when the client has none.
  """

  client_id: str
  dataset: tf.data.Dataset
  num_examples: int
  capacity: Any = None
  state: Any = None
  tier: Optional[str] = None
  assignment: Any = None
  validation: Optional[tf.data.Dataset] = None


@attrs.frozen
class Assignment:
  """A client chosen for a round and what the server decided to send it."""

  client_id: str
  payload: Any = None


@attrs.frozen
class EvaluationModel:
  """Weights to evaluate and the Keras model they belong to.

  Attributes:
    weights: `tff.learning.models.ModelWeights`.
    model_fn: No-arg builder of the Keras model of these weights; None means
      the task's model.
    group: Models of one group (e.g. each client's own model) are reported
      together, by their mean accuracy and loss, not one by one.
    data: `(x, y)` arrays to evaluate on instead of the test split (e.g. a
      client's local validation split); None means the test split.
  """

  weights: Any
  model_fn: Optional[Callable[[], tf.keras.Model]] = None
  group: Optional[str] = None
  data: Any = None


class EvaluationData(abc.ABC):
  """Client data the program lends to `evaluation_models` (e.g. for sBN)."""

  @abc.abstractmethod
  def client_datasets(self) -> list[tf.data.Dataset]:
    """Every client's training data, batched, unshuffled, one epoch."""

  def client_states(self) -> Mapping[str, Any]:
    """The client-state store: persistent state of every client seen."""
    return {}

  def client_ids(self) -> tuple[str, ...]:
    """Every client id, in the order of `client_datasets`."""
    return ()

  def client_validation(self, client_id: str) -> Any:
    """`client_id`'s local validation split as `(x, y)` arrays (possibly
    empty); None when the data have no per-client validation."""
    del client_id
    return None


class ClientDatasets(EvaluationData):
  """`EvaluationData` over given datasets (for code outside the program)."""

  def __init__(
    self,
    datasets: Sequence[tf.data.Dataset],
    client_states: Optional[Mapping[str, Any]] = None,
  ):
    self._datasets = list(datasets)
    self._client_states = dict(client_states or {})

  def client_datasets(self) -> list[tf.data.Dataset]:
    return list(self._datasets)

  def client_states(self) -> Mapping[str, Any]:
    return self._client_states


@attrs.frozen
class RoundOutput:
  """What one round produced.

  Attributes:
    state: The new server state.
    metrics: Scalar training metrics of the round (floats): at least
      `loss` (over the finite client updates; NaN if none) and
      `non_finite_updates`, how many clients' updates were not finite and
      were zeroed (the program's loop checks it is there).
    traffic: One `ClientTraffic` per participating client, measured.
    client_states: New persistent states of the clients that changed.
  """

  state: Any
  metrics: collections.OrderedDict
  traffic: tuple[ClientTraffic, ...]
  client_states: Mapping[str, Any] = attrs.field(factory=dict)


class FederatedAlgorithm(abc.ABC):
  """An algorithm the training program can run round by round."""

  name: str = "algorithm"

  @abc.abstractmethod
  def initialize(self) -> Any:
    """Returns the initial server state (a structure of arrays)."""

  def plan_round(
    self,
    state: Any,
    round_num: int,
    available: Sequence[str],
    size: int,
    sampler: Any,
  ) -> list[Assignment]:
    """Chooses the round's clients among `available` (ids).

    `sampler` is the program's checkpointed `CohortSampler`: its `sample`
    draws uniformly without replacement and its `rng` (a NumPy Generator) is
    the only randomness an algorithm may use here, so that resumed runs
    choose what uninterrupted runs choose. Default: `size` clients uniformly.
    """
    del state, round_num
    return [Assignment(c) for c in sampler.sample(available, size)]

  @abc.abstractmethod
  def next(
    self, state: Any, round_num: int, clients: Sequence[ClientRound]
  ) -> RoundOutput:
    """Runs one round on `clients` and returns its output."""

  @abc.abstractmethod
  def model_weights(self, state: Any) -> Any:
    """The global model's `tff.learning.models.ModelWeights` in `state`."""

  def initial_client_state(self) -> Optional[Any]:
    """Persistent state of a client never seen before; None if stateless."""
    return None

  def attach(self, population: Any, client_sizes: Mapping[str, int]) -> None:
    """Called once before the first round with the device population
    (`tff_hetero.devices.DevicePopulation`) and every client's number of
    training examples, for algorithms that simulate the devices' time
    (FedGKT's asynchronous mode). The server side of an algorithm must not
    act on them where its paper says it cannot know them. Default: unused.
    """
    del population, client_sizes

  def report_extras(self) -> Mapping[str, Any]:
    """Algorithm-specific facts for the run's `report.json` (JSON values)."""
    return {}

  def client_dataset(
    self,
    arrays: Any,
    *,
    batch_size: int,
    local_epochs: int,
    shuffle_seed: int,
    augment: str = "none",
    state: Any = None,
  ) -> tf.data.Dataset:
    """A sampled client's `ClientRound.dataset` from its training arrays.

    `state` is the client's persistent state (`ClientRound.state`), for
    algorithms whose clients train on values they received (FedGKT's
    server logits). Default: `tff_hetero.data.make_client_dataset` (batched
    `OrderedDict(x=, y=)`, `local_epochs` passes shuffled from the seed,
    each batch `augment`ed).
    """
    del state
    return data.make_client_dataset(
      arrays,
      batch_size=batch_size,
      local_epochs=local_epochs,
      shuffle_seed=shuffle_seed,
      augment=augment,
    )

  def evaluation_models(
    self, state: Any, data: Optional[EvaluationData] = None
  ) -> "collections.OrderedDict[str, EvaluationModel]":
    """Named models to evaluate on the test set.

    The program reports the accuracy of the first entry as `accuracy`; more
    entries (e.g. each sub-model level) are reported with their name as a
    prefix, and their mean as `avg_accuracy`. Entries with a `group` are
    reported as `<group>_accuracy` (and `_test_loss`), the mean over the
    group; when the first entry has one, `accuracy` is its group's mean. The
    first entry is also the model the run saves at the end. `data` gives access to the clients'
    training data for algorithms that calibrate models before evaluation
    (static batch norm). Defaults to the global model.
    """
    del data
    return collections.OrderedDict(
      global_model=EvaluationModel(self.model_weights(state))
    )


def to_numpy(structure: Any) -> Any:
  """Structure of tensors -> same structure of numpy arrays."""
  import tree  # pylint: disable=g-import-not-at-top

  return tree.map_structure(np.asarray, structure)
