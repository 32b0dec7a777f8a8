"""`ClientTraffic.plus`: one client's costs of two parts of a round, added."""

import pytest

from tff_hetero.accounting import ClientTraffic


def test_plus_adds_every_cost_of_the_same_client():
  a = ClientTraffic("c1", bytes_down=10, bytes_up=4, flops=100, examples=5)
  b = ClientTraffic("c1", bytes_down=1, bytes_up=2, flops=30, examples=3)
  assert a.plus(b) == ClientTraffic("c1", 11, 6, 130, 8)
  assert a.plus(None) is a
  with pytest.raises(ValueError, match="c2's traffic to c1's"):
    a.plus(ClientTraffic("c2", 0, 0, 0, 0))
