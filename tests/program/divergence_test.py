"""When a round ends the run: a client's non-finite update was zeroed and
counted, and the run goes on; only a round where every update was zeroed
(or the model itself is not finite) stops it, naming the round."""

import collections
import math

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_hetero.accounting import ClientTraffic
from tff_hetero.algorithms import api
from tff_hetero.errors import DivergenceError
from tff_hetero.program import loop


class _Weights:
  """Stands in for an algorithm: only its model weights are read."""

  name = "stand-in"

  def model_weights(self, state):
    return tff.learning.models.ModelWeights([state], [])


def _output(weight, loss, zeroed, examples=(10, 10)):
  return api.RoundOutput(
    state=np.float32(weight),
    metrics=collections.OrderedDict(loss=loss, non_finite_updates=zeroed),
    traffic=tuple(
      ClientTraffic(f"c{i}", 1, 1, 1, n) for i, n in enumerate(examples)
    ),
  )


def _check(output, round_num=4, last_checkpoint=3):
  loop.check_not_diverged(
    _Weights(), output, round_num, last_checkpoint, "/runs/x"
  )


def test_a_zeroed_client_with_a_finite_loss_goes_on():
  _check(_output(1.0, 0.7, 1.0))
  # No client had examples: no loss, and no failure.
  _check(_output(1.0, math.nan, 0.0, examples=(0, 0)))


def test_every_update_zeroed_stops_naming_the_round_and_the_count():
  with pytest.raises(DivergenceError) as raised:
    _check(_output(math.nan, math.nan, 2.0))
  message = str(raised.value)
  assert message.startswith("round 4: training diverged")
  assert (
    "2 client updates non-finite and zeroed left no finite update to train on"
    in message
  )
  assert "last good checkpoint: round 3 in /runs/x" in message
  assert "\n" not in message


def test_non_finite_weights_stop_even_with_a_finite_loss():
  with pytest.raises(DivergenceError, match="non-finite loss or weights"):
    _check(_output(math.inf, 0.7, 0.0), last_checkpoint=0)


def test_a_round_without_the_count_is_refused():
  output = _output(1.0, 0.7, 0.0)
  del output.metrics["non_finite_updates"]
  with pytest.raises(RuntimeError, match="no non_finite_updates"):
    _check(output)
