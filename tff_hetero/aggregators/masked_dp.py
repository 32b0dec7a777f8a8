"""Clipping and differential privacy for masked sums of width sub-models.

TFF's `DifferentiallyPrivateFactory` noises a sum whose every client covers
every element. A width-heterogeneous round (`tff_hetero.algorithms.
width_rounds`) sums updates of different shapes, each scattered into the
server model where its level covers it, and divides per element by how many
clients covered it. `MaskedAggregation` states how those sums are formed:

* `factory` (optional): the `tff.aggregators.WeightedAggregationFactory`
  that forms each group's masked sums, `MaskedSumFactory()` by default; any
  of TFF's wrappers around a `MaskedSumFactory` works, and so do inner sum
  factories inside it, e.g.
  `tff.aggregators.zeroing_factory(10.0, MaskedSumFactory(
  value_sum_factory=tff.aggregators.SecureSumFactory(1.0),
  weight_sum_factory=tff.aggregators.SecureSumFactory(1e4)))` drops a
  client whose update's norm exceeds 10 and sums the rest with secure
  aggregation (simulated: `tff_hetero.runtime.contexts`). Its result must be
  `MaskedSums` (checked when a round is built). Its process is initialised
  afresh for every group of every round: a stateful factory (adaptive
  zeroing or clipping, adaptive secure-sum bounds) keeps its initial
  state; pass a stateless one.
* `clip_norm` C (optional): each client's update, at the size it trained,
  is scaled to L2 norm at most C before it is summed (TFF's
  `clipping_factory` around `MaskedSumFactory`; the mask rides in the weight,
  so clipping touches only the value).
* `noise_multiplier` z (optional, needs C): DP. Clients are weighted
  uniformly (weight 1), and after all groups of the round the server adds,
  from a seeded stateless generator,

      to the value sums (every element of the server model):  N(0, (z C)^2)
      to each level's client count n_l (every level, present
        or not):                                               N(0, z^2)

  and divides element e's value sum by max(sum_l n~_l cov_l(e), 1), where
  cov_l is level l's coverage (1 where level l holds the element).
  Neighbouring rounds differ by adding or removing one client (user-level,
  add/remove; replacing a client by one at another level is two steps). That
  changes the value sums by at most C in L2 (its clipped update, scattered)
  and exactly one level count by 1, so the pair (value sums / C, counts) has
  L2 sensitivity sqrt(2) and each round's release is the Gaussian mechanism
  with noise multiplier z / sqrt(2). An algorithm in which one client trains
  k separate models in a round (Decoupled: up to one per model it can hold)
  releases k such mechanisms about it: their composition, not one. Every level
  gets count noise, present or not, so which levels trained is not revealed;
  the elements only absent levels hold then move by noise alone. The clamp
  at 1 keeps a near-zero noised count from amplifying the noise; it is
  post-processing. With z = 0 the step is the masked mean of clipped updates
  with uniform weights (tested against a hand computation).

The noise is drawn from TF's stateless generator seeded by `(noise_seed,
round)`. Whoever knows `noise_seed` can recompute the noise and remove it,
so by default it is a secret: `initial_noise_seed` draws 60 bits from the
operating system's entropy (`secrets`) when a run's state is initialized,
and the algorithm keeps it in its server state. It is thus in the run's
checkpoints (a resumed run draws the noise an uninterrupted one does; keep
checkpoints as private as the data) and in no report, metric or log. A
given seed (`--dp_noise_seed`, `noise_seed=` in the library) makes a
reproducible simulation instead, and is written in the report like every
setting.

No (epsilon, delta) is computed or reported: our cohorts are sampled
uniformly without replacement, not by the Poisson sampling the usual RDP
accountants assume.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
import secrets
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_hetero.aggregators.masked import MaskedSumFactory
from tff_hetero.aggregators.masked import MaskedSums


def initial_noise_seed(
  aggregation: "MaskedAggregation", given: Optional[int]
) -> np.int64:
  """The noise seed a new run keeps in its state (module docstring): `given`
  if set, a secret one if the aggregation is private, else 0 (unused)."""
  if given is not None:
    return np.int64(given)
  if aggregation.private:
    return np.int64(secrets.randbits(60))
  return np.int64(0)


def _check_optional(name, value, lowest):
  if value is None:
    return
  if not math.isfinite(value) or (value <= 0 if lowest == 0 else value < 0):
    raise ValueError(
      f"{name} must be finite and {'> 0' if lowest == 0 else '>= 0'},"
      f" got {value}"
    )


@attrs.frozen
class MaskedAggregation:
  """How a heterogeneous round sums its clients' updates (module docstring).

  Attributes:
    clip_norm: L2 bound of each client's update, or None (no clipping).
    noise_multiplier: Gaussian noise multiplier z, or None (no DP). Needs
      `clip_norm`.
    factory: The masked-sum factory (module docstring), or None:
      `MaskedSumFactory()`.
    weighting: `tff.learning.ClientWeighting` of the clients' updates, or
      None: by examples, uniform when private (which needs uniform).
  """

  clip_norm: Optional[float] = None
  noise_multiplier: Optional[float] = None
  factory: Optional[tff.aggregators.WeightedAggregationFactory] = None
  weighting: Optional[tff.learning.ClientWeighting] = None

  def __attrs_post_init__(self):
    if self.weighting is not None and not isinstance(
      self.weighting, tff.learning.ClientWeighting
    ):
      raise TypeError(
        "client weighting must be a tff.learning.ClientWeighting"
        " (NUM_EXAMPLES or UNIFORM), got"
        f" {type(self.weighting).__name__}"
      )
    if (
      self.noise_multiplier is not None
      and self.weighting is tff.learning.ClientWeighting.NUM_EXAMPLES
    ):
      raise ValueError(
        "a private aggregation weighs clients uniformly (client weighting"
        " NUM_EXAMPLES would let one client's data size move the sum)"
      )
    if self.factory is not None and not isinstance(
      self.factory, tff.aggregators.WeightedAggregationFactory
    ):
      raise TypeError(
        "factory must be a tff.aggregators.WeightedAggregationFactory"
        " forming MaskedSums (e.g. around MaskedSumFactory), got"
        f" {type(self.factory).__name__}"
      )
    _check_optional("clip_norm", self.clip_norm, 0)
    _check_optional("noise_multiplier", self.noise_multiplier, -1)
    if self.noise_multiplier is not None and self.clip_norm is None:
      raise ValueError("noise_multiplier needs clip_norm")

  @property
  def private(self) -> bool:
    return self.noise_multiplier is not None

  @property
  def client_weighting(self) -> tff.learning.ClientWeighting:
    if self.weighting is not None:
      return self.weighting
    if self.private:
      return tff.learning.ClientWeighting.UNIFORM
    return tff.learning.ClientWeighting.NUM_EXAMPLES

  def sum_factory(self) -> tff.aggregators.WeightedAggregationFactory:
    """`factory` (`MaskedSumFactory()` if None), inside TFF's clipping when
    `clip_norm` is set."""
    inner = self.factory if self.factory is not None else MaskedSumFactory()
    if self.clip_norm is None:
      return inner
    return tff.aggregators.clipping_factory(self.clip_norm, inner)


def check_masked_sums(process: tff.templates.AggregationProcess) -> None:
  """A one-line `TypeError` unless `process` returns `MaskedSums` of its
  values: value sums of the values' structure, weight sums of the weights'
  masks (a `MaskedWeight`) or of the scalar weight."""
  result = process.next.type_signature.result.result.member
  value = process.next.type_signature.parameter[1].member
  weight = process.next.type_signature.parameter[2].member
  if isinstance(weight, tff.StructType) and "mask" in dir(weight):
    weight = weight.mask
  names = [name for name, _ in tff.structure.iter_elements(result)]
  if (
    names != list(MaskedSums._fields)
    or not result["weighted_sum"].is_assignable_from(value)
    or not result["weight_sum"].is_assignable_from(weight)
  ):
    raise TypeError(
      "the masked-sum factory must return MaskedSums(weighted_sum,"
      " weight_sum) of the values' structure (a tff.aggregators wrapper"
      f" around tff_hetero.aggregators.MaskedSumFactory), got {result}"
    )


def add_gaussian_noise(
  sums: MaskedSums,
  coverages: Sequence[Sequence[tf.Tensor]],
  aggregation: MaskedAggregation,
  seed: tf.Tensor,
) -> MaskedSums:
  """`sums` with the DP noise of the module docstring (pure TF).

  Args:
    sums: The round's value and weight sums over the server model.
    coverages: Per level, its 0/1 coverage of each server tensor.
    aggregation: A private `MaskedAggregation`.
    seed: int64[2], the seed of TF's stateless generators (one per round).
  """
  z = float(aggregation.noise_multiplier)
  value_std = z * float(aggregation.clip_norm)
  values = list(sums.weighted_sum)
  noised_values = []
  for i, v in enumerate(values):
    value_seed = tf.stack([seed[0], seed[1] * 4096 + i])
    noised_values.append(
      v + value_std * tf.random.stateless_normal(tf.shape(v), value_seed)
    )
  count_seed = tf.stack([seed[0], seed[1] * 4096 + 4095])
  count_noise = z * tf.random.stateless_normal([len(coverages)], count_seed)
  noised_weights = []
  for i, w in enumerate(sums.weight_sum):
    noise = tf.add_n(
      [count_noise[l] * coverage[i] for l, coverage in enumerate(coverages)]
    )
    noised_weights.append(w + noise)
  return MaskedSums(noised_values, noised_weights)


def clamped_masked_mean(sums: MaskedSums, min_weight: float = 1.0):
  """Per element, value sum / max(weight sum, `min_weight`) (pure TF)."""
  return [
    v / tf.maximum(w, min_weight)
    for v, w in zip(sums.weighted_sum, sums.weight_sum)
  ]
