"""`CommLedger`: what each client downloaded, uploaded and computed, per round.

The ledger is filled by the training program from what the algorithms measured
(see `payload.py` and `tff_measure.py`); it never estimates. It is immutable:
`record` returns a new ledger, so a checkpoint holds exactly the ledger of the
rounds it covers.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from collections.abc import Sequence

import attrs
import numpy as np


@attrs.frozen
class ClientTraffic:
  """One client's measured cost in one round.

  Attributes:
    client_id: The client.
    bytes_down: Bytes the client received from the server.
    bytes_up: Bytes the client sent to the server.
    flops: Compute of the client's local training in the unit FL papers call
      FLOPs, multiply-accumulates (`tff_hetero.models.counting`: forward MACs
      x 3 per example), times the examples it actually processed.
    examples: Number of examples the client processed (all local epochs).
  """

  client_id: str
  bytes_down: int
  bytes_up: int
  flops: int
  examples: int

  def plus(self, other: "ClientTraffic | None") -> "ClientTraffic":
    """The same client's costs added (e.g. two models it trained)."""
    if other is None:
      return self
    if other.client_id != self.client_id:
      raise ValueError(
        f"cannot add {other.client_id}'s traffic to {self.client_id}'s"
      )
    return ClientTraffic(
      client_id=self.client_id,
      bytes_down=self.bytes_down + other.bytes_down,
      bytes_up=self.bytes_up + other.bytes_up,
      flops=self.flops + other.flops,
      examples=self.examples + other.examples,
    )


_COLUMNS = (
  "round_num",
  "client_index",
  "bytes_down",
  "bytes_up",
  "flops",
  "examples",
)


@attrs.frozen
class RoundTotals:
  bytes_down: int
  bytes_up: int
  flops: int
  examples: int
  num_clients: int


@attrs.frozen
class CommLedger:
  """Per-client, per-round traffic and compute, with totals.

  Stored column-wise as int64 arrays (`round_num`, `client_index`, ...) so it
  checkpoints as plain arrays; client ids are interned in `client_ids`.
  """

  client_ids: tuple[str, ...] = ()
  columns: tuple[np.ndarray, ...] = attrs.field(
    factory=lambda: tuple(np.zeros([0], np.int64) for _ in _COLUMNS)
  )

  def record(
    self, round_num: int, traffic: Iterable[ClientTraffic]
  ) -> "CommLedger":
    """Returns a ledger with `traffic` added for `round_num`."""
    client_ids = list(self.client_ids)
    index = {cid: i for i, cid in enumerate(client_ids)}
    rows = []
    for item in traffic:
      if item.client_id not in index:
        index[item.client_id] = len(client_ids)
        client_ids.append(item.client_id)
      rows.append(
        (
          round_num,
          index[item.client_id],
          item.bytes_down,
          item.bytes_up,
          item.flops,
          item.examples,
        )
      )
    if not rows:
      return self
    new = np.asarray(rows, np.int64).T
    columns = tuple(
      np.concatenate([old, new[i]]) for i, old in enumerate(self.columns)
    )
    return CommLedger(tuple(client_ids), columns)

  def _column(self, name: str) -> np.ndarray:
    return self.columns[_COLUMNS.index(name)]

  def _totals(self, selected: np.ndarray) -> RoundTotals:
    return RoundTotals(
      bytes_down=int(self._column("bytes_down")[selected].sum()),
      bytes_up=int(self._column("bytes_up")[selected].sum()),
      flops=int(self._column("flops")[selected].sum()),
      examples=int(self._column("examples")[selected].sum()),
      num_clients=int(selected.sum()),
    )

  def round_totals(self, round_num: int) -> RoundTotals:
    return self._totals(self._column("round_num") == round_num)

  def totals(self, up_to_round: int | None = None) -> RoundTotals:
    rounds = self._column("round_num")
    if up_to_round is None:
      return self._totals(np.ones_like(rounds, bool))
    return self._totals(rounds <= up_to_round)

  def per_client_totals(self) -> collections.OrderedDict:
    """client id -> OrderedDict(bytes_down, bytes_up, flops, examples, rounds)."""
    out = collections.OrderedDict()
    client_index = self._column("client_index")
    for i, cid in enumerate(self.client_ids):
      selected = client_index == i
      out[cid] = collections.OrderedDict(
        bytes_down=int(self._column("bytes_down")[selected].sum()),
        bytes_up=int(self._column("bytes_up")[selected].sum()),
        flops=int(self._column("flops")[selected].sum()),
        examples=int(self._column("examples")[selected].sum()),
        rounds=int(selected.sum()),
      )
    return out

  # Checkpoint form: plain arrays and a list of ids.
  def to_arrays(self) -> collections.OrderedDict:
    return collections.OrderedDict(zip(_COLUMNS, self.columns))

  @classmethod
  def from_arrays(
    cls,
    client_ids: Sequence[str],
    arrays: "collections.abc.Mapping[str, np.ndarray]",
  ) -> "CommLedger":
    return cls(
      tuple(client_ids),
      tuple(np.asarray(arrays[c], np.int64).reshape([-1]) for c in _COLUMNS),
    )
