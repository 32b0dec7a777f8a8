"""Asynchronous clients as a deterministic event simulation of the devices.

An asynchronous algorithm (FedGKT's `--gkt_mode=async`) lets the server act
on each client's upload as it arrives, and lets each client start its next
job as soon as it has the server's answer. Which upload arrives when is a
property of the devices, not of the algorithm; this module plays the world:

* K slots (the concurrency, `--clients_per_round`): K devices work at once.
  An empty slot is filled by a client drawn uniformly among the available
  clients (`DevicePopulation.available_clients` of the round) that are not
  in another slot.
* A job of client c that starts at time t (in round r) ends at
  t + work(c) / speed(c, r): `work` is what the algorithm says the client
  computes (FedGKT: its local epochs of training and one extraction pass,
  in MACs) and `speed` the device's MAC capacity in that round
  (`DevicePopulation.capacity_at_round`: its tier's nominal capacity times
  its fluctuation), 1 when the population has no capacities. Time is in
  MACs per unit of capacity: only order and ratios matter.
* When a job ends (an arrival), the algorithm's server handles it at once
  (the server's own time is not simulated: FedGKT's server is a GPU against
  CPU edges), and the slot is refilled at that moment by a client drawn
  among the idle available ones, the arriving client included: with K = N
  (every client working, as in FedGKT's experiments) each client simply
  starts its next job.
* A program round processes the next arrivals in time order, at most
  `size` of them, and ends before an arrival of a client already in it (its
  new job started after this round's answer to it, so it needs this round's
  results): every client of a round is independent of the others' answers in
  that round, and the round's client work runs as one federated computation.

Draws use `np.random.default_rng([seed, STREAM, jobs])` where `jobs` counts
the jobs started so far; the state (clock, jobs, each slot's client and end
time) is a structure of arrays the algorithm keeps in its server state, so a
checkpointed run resumes to the same arrivals. Ties in end time go to the
lower slot.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import attrs
import numpy as np

_STREAM = 7


class EventState(NamedTuple):
  """The simulation between rounds (arrays, for checkpoints).

  Attributes:
    clock: float64 scalar, the time of the last arrival handled.
    jobs: int64 scalar, jobs started so far (keys the draws).
    slot_client: int64[K], the index (in the sorted client ids) of the client
      working in each slot, -1 for an empty slot.
    slot_start: float64[K], when each slot's job started.
    slot_finish: float64[K], when it ends.
  """

  clock: Any
  jobs: Any
  slot_client: Any
  slot_start: Any
  slot_finish: Any


@attrs.frozen
class Arrival:
  """One job's end: its client, slot, start and end times."""

  client_id: str
  slot: int
  start: float
  finish: float


class Simulation:
  """The event simulation of K concurrent devices (module docstring).

  Args:
    client_ids: Every client id.
    concurrency: K, the number of slots.
    seed: Seed of the draws.
    work: `client_id -> MACs` of one job of that client.
    speed: `(client_id, round_num) -> MACs per unit of time`, or None.
  """

  def __init__(
    self,
    client_ids: Sequence[str],
    concurrency: int,
    seed: int,
    work: Callable[[str], float],
    speed: Callable[[str, int], Any],
  ):
    if concurrency < 1:
      raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    self.client_ids = tuple(sorted(client_ids))
    self._index = {c: i for i, c in enumerate(self.client_ids)}
    self.concurrency = int(concurrency)
    self.seed = int(seed)
    self._work = work
    self._speed = speed

  def initial_state(self) -> EventState:
    k = self.concurrency
    return EventState(
      np.float64(0.0),
      np.int64(0),
      np.full([k], -1, np.int64),
      np.zeros([k], np.float64),
      np.zeros([k], np.float64),
    )

  def duration(self, client_id: str, round_num: int) -> float:
    speed = self._speed(client_id, round_num)
    return float(self._work(client_id)) / float(speed or 1)

  def plan(
    self, state: EventState, round_num: int, available: Sequence[str], size: int
  ) -> tuple[list[Arrival], EventState]:
    """The round's arrivals, in time order, and the state after them."""
    clock, jobs = float(state.clock), int(state.jobs)
    slots = [int(c) for c in np.asarray(state.slot_client)]
    starts = [float(t) for t in np.asarray(state.slot_start)]
    finishes = [float(t) for t in np.asarray(state.slot_finish)]
    available = sorted(set(available) & set(self._index))

    def refill(slot: int) -> None:
      nonlocal jobs
      busy = {
        self.client_ids[c] for s, c in enumerate(slots) if c >= 0 and s != slot
      }
      idle = [c for c in available if c not in busy]
      if not idle:
        slots[slot] = -1
        return
      draw = np.random.default_rng([self.seed, _STREAM, jobs])
      client = idle[int(draw.integers(len(idle)))]
      jobs += 1
      slots[slot] = self._index[client]
      starts[slot] = clock
      finishes[slot] = clock + self.duration(client, round_num)

    for slot in range(self.concurrency):
      if slots[slot] < 0:
        refill(slot)
    arrivals: list[Arrival] = []
    while len(arrivals) < size:
      working = [s for s in range(self.concurrency) if slots[s] >= 0]
      if not working:
        break
      slot = min(working, key=lambda s: (finishes[s], s))
      client = self.client_ids[slots[slot]]
      if any(a.client_id == client for a in arrivals):
        break
      arrivals.append(Arrival(client, slot, starts[slot], finishes[slot]))
      clock = finishes[slot]
      refill(slot)
    return arrivals, EventState(
      np.float64(clock),
      np.int64(jobs),
      np.asarray(slots, np.int64),
      np.asarray(starts, np.float64),
      np.asarray(finishes, np.float64),
    )
