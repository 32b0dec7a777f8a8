"""The model aggregators a run can choose (`--aggregator`), as TFF factories.

Each entry builds a `tff.aggregators` factory for the clients' model updates
and says how clients are weighted:

* `mean`: `tff.aggregators.MeanFactory()`, clients weighted by the examples
  they trained on (FedAvg's mean).
* `clip`: `tff.aggregators.clipping_factory(clip_norm, MeanFactory())`: each
  client's update is scaled down to L2 norm at most `--clip_norm` (over all
  its tensors together) before the example-weighted mean.
* `dp`: `tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
  noise_multiplier, clients_per_round, clip_norm)`: DP-FedAvg's Gaussian sum
  (McMahan et al., 2018, "Learning Differentially Private Recurrent Language
  Models"): each update clipped to `clip_norm`, summed, Gaussian noise of
  standard deviation `noise_multiplier * clip_norm` added to the sum, divided
  by the expected number of clients per round. Clients are weighted
  uniformly (an example-weighted mean would let one client's data size
  change the sensitivity), and the denominator is the fixed cohort size, not
  a count of the clients that reported.

Privacy accounting: none is reported. The noise and the clipping are applied
(tested); an (epsilon, delta) for a run depends on the sampling scheme (ours
is uniform without replacement, not the Poisson sampling the usual RDP
accountants assume) and is left to the user.

The factories are TFF's own; `build_model_aggregator` only chooses one, so any
other `tff.aggregators` factory can be passed to the builders directly.

The width-heterogeneous algorithms sum masked updates of several shapes; the
same three choices are `masked_dp.MaskedAggregation`s there
(`AggregatorEntry.masked`, `width_round_options`): `mean` the example-weighted masked mean, `clip` the
same of clipped updates, `dp` the masked Gaussian mechanism of `masked_dp`
(uniform weights, noised value sums and noised level counts).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
import math
from typing import Optional

import attrs
import tensorflow_federated as tff

from tff_hetero.aggregators import masked_dp
from tff_hetero.errors import UsageError


@attrs.frozen
class AggregatorEntry:
  """How to build one `--aggregator` choice.

  Attributes:
    build: `(clip_norm, noise_multiplier, clients_per_round) -> factory`.
    client_weighting: How clients are weighted with it.
    needs: The flags it needs (each a positive number; noise >= 0).
  """

  build: Callable[[Optional[float], Optional[float], int], object]
  client_weighting: tff.learning.ClientWeighting
  needs: tuple[str, ...] = ()
  # `(clip_norm, noise_multiplier) -> masked_dp.MaskedAggregation`.
  masked: Callable[[Optional[float], Optional[float]], object] = (
    lambda clip, noise: masked_dp.MaskedAggregation()
  )


MODEL_AGGREGATORS: "collections.OrderedDict[str, AggregatorEntry]" = (
  collections.OrderedDict(
    mean=AggregatorEntry(
      lambda clip, noise, cohort: tff.aggregators.MeanFactory(),
      tff.learning.ClientWeighting.NUM_EXAMPLES,
    ),
    clip=AggregatorEntry(
      lambda clip, noise, cohort: tff.aggregators.clipping_factory(
        clip, tff.aggregators.MeanFactory()
      ),
      tff.learning.ClientWeighting.NUM_EXAMPLES,
      ("clip_norm",),
      lambda clip, noise: masked_dp.MaskedAggregation(clip_norm=clip),
    ),
    dp=AggregatorEntry(
      lambda clip, noise, cohort: (
        tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
          noise_multiplier=noise, clients_per_round=cohort, clip=clip
        )
      ),
      tff.learning.ClientWeighting.UNIFORM,
      ("clip_norm", "noise_multiplier"),
      lambda clip, noise: masked_dp.MaskedAggregation(clip, noise),
    ),
  )
)


def check_settings(
  kind: str, clip_norm: Optional[float], noise_multiplier: Optional[float]
) -> None:
  """`UsageError` naming the flag if the settings do not fit `kind`."""
  if kind not in MODEL_AGGREGATORS:
    raise UsageError(
      "--aggregator",
      f"unknown value {kind!r}; accepted: " + ", ".join(MODEL_AGGREGATORS),
    )
  needs = MODEL_AGGREGATORS[kind].needs
  for name, value, lowest in (
    ("clip_norm", clip_norm, "> 0"),
    ("noise_multiplier", noise_multiplier, ">= 0"),
  ):
    if name not in needs:
      if value is not None:
        raise UsageError(
          f"--{name}",
          "is read only by --aggregator="
          + " or ".join(
            k for k, e in MODEL_AGGREGATORS.items() if name in e.needs
          )
          + f", not --aggregator={kind}",
        )
      continue
    if value is None:
      raise UsageError(f"--{name}", f"--aggregator={kind} needs it")
    finite = math.isfinite(value)
    if not finite or (value <= 0 if lowest == "> 0" else value < 0):
      raise UsageError(f"--{name}", f"must be finite and {lowest}, got {value}")


def build_model_aggregator(
  kind: str,
  *,
  clip_norm: Optional[float] = None,
  noise_multiplier: Optional[float] = None,
  clients_per_round: int = 1,
):
  """The `kind` factory (module docstring) and its client weighting."""
  check_settings(kind, clip_norm, noise_multiplier)
  entry = MODEL_AGGREGATORS[kind]
  return (
    entry.build(clip_norm, noise_multiplier, int(clients_per_round)),
    entry.client_weighting,
  )


def width_round_options(config) -> dict:
  """The width algorithms' aggregation options a run's settings choose:
  `aggregation` (`masked_dp.MaskedAggregation` of `--aggregator`,
  `--clip_norm`, `--noise_multiplier`) and `noise_seed` (`--dp_noise_seed`:
  None draws a secret one, `masked_dp.initial_noise_seed`)."""
  check_settings(config.aggregator, config.clip_norm, config.noise_multiplier)
  entry = MODEL_AGGREGATORS[config.aggregator]
  return dict(
    aggregation=entry.masked(config.clip_norm, config.noise_multiplier),
    noise_seed=config.dp_noise_seed,
  )
