"""AdaptiveFL's client selection without training: does it learn the devices?

Figure 5(a) of AdaptiveFL (Jia et al., DAC 2024) compares the communication
waste rate, 1 - sum(size of returned models) / sum(size of sent models), of
its RL selection with greedy and random dispatch. Selection does not depend
on the weights, so it can be run alone for many rounds: `simulate_selection`
runs the real `adaptivefl.plan_selection` (steps 1-2), the device rule
`adaptivefl.choose_trained_member` (step 3) and `adaptivefl.update_tables`
(step 5) on a `tff_hetero.devices.DevicePopulation`, with no model and no
TFF, and records what each round sent and got back, in parameters.

The reference code ships such a simulation (`utils/hetero_client_config.py`:
VGG-16 pool sizes, 100 clients, 10 per round, 1,000 rounds, resources drawn
per round from Gaussians clipped around 8, 16 and 35 million parameters for
weak, medium and strong devices); `VGG16_DEVICES` is that population in our
device model (log-normal fluctuation with the same relative spread, 1/8,
1/16 and 2/35, instead of a clipped Gaussian).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from tff_hetero import devices as devices_lib
from tff_hetero.algorithms import adaptivefl
from tff_hetero.submodels import pools as pools_lib

# Parameters of the paper's VGG-16 pool (Table 1), in pool order S3..L1; our
# VGG-16 counts agree to 0.01M (`tff_hetero/models/vgg.py`).
VGG16_TABLE1_PARAMS = (
  5_670_000,
  6_480_000,
  8_390_000,
  14_840_000,
  15_410_000,
  16_810_000,
  33_650_000,
)
# (name, proportion, nominal parameters, relative spread) of the reference
# code's VGG-16 devices.
VGG16_DEVICES = (
  ("weak", 4, 8_000_000, 1 / 8),
  ("medium", 3, 16_000_000, 1 / 16),
  ("strong", 3, 35_000_000, 2 / 35),
)


@attrs.frozen
class SimulationResult:
  """What one simulated run sent and got back, per round (parameters).

  Attributes:
    selection: The strategy (`adaptivefl.SELECTIONS`).
    seed: Seed of the selection and of the population.
    sent: Sum over the round's clients of the sizes of the members sent.
    returned: Same for the members returned (0 for a client that returned
      nothing).
    failed: Clients per round that could train nothing.
  """

  selection: str
  seed: int
  sent: np.ndarray
  returned: np.ndarray
  failed: np.ndarray

  def waste_rate(self, start: int = 0, stop: int | None = None) -> float:
    """1 - returned / sent over rounds [start, stop) (0-based)."""
    sent = float(self.sent[start:stop].sum())
    return 1.0 - float(self.returned[start:stop].sum()) / sent if sent else 0.0


def population(
  num_clients: int, seed: int, tiers=VGG16_DEVICES
) -> devices_lib.DevicePopulation:
  """Clients "0".."n-1" with the given (name, share, params, spread) tiers."""
  specs = tuple(
    devices_lib.TierSpec(
      name=n, proportion=share, capacity_params=params, fluctuation=spread
    )
    for n, share, params, spread in tiers
  )
  return devices_lib.assign_tiers(
    [str(i) for i in range(num_clients)], specs, seed=seed
  )


def simulate_selection(
  pool: pools_lib.SubModelPool,
  sizes: Sequence[int],
  devices: devices_lib.DevicePopulation,
  *,
  clients_per_round: int,
  rounds: int,
  selection: str,
  seed: int,
  min_start_index: int = 1,
) -> SimulationResult:
  """Runs `rounds` rounds of selection, device decisions and table updates.

  `sizes[i]` is member i's size (parameters) as the devices measure it;
  clients are indexed in `devices.client_ids` order, rounds from 1.
  """
  pools_lib.check_increasing_sizes(pool, sizes)
  ids = devices.client_ids
  tables = adaptivefl.initial_tables(len(pool.members), len(ids))
  p = max(1, len(pool.of_class("M")))
  rng = np.random.default_rng(seed)
  sent = np.zeros(rounds, np.int64)
  returned = np.zeros(rounds, np.int64)
  failed = np.zeros(rounds, np.int64)
  for r in range(rounds):
    round_num = r + 1
    candidates = np.array([devices.is_available(c, round_num) for c in ids])
    for client, member in adaptivefl.plan_selection(
      tables, pool, candidates, clients_per_round, selection, rng
    ):
      capacity = devices.capacity_at_round(ids[client], round_num).params
      trained = adaptivefl.choose_trained_member(
        pool, sizes, member, capacity, min_start_index
      )
      tables = adaptivefl.update_tables(
        tables, pool, client, member, trained, p, min_start_index
      )
      sent[r] += sizes[member]
      if trained is None:
        failed[r] += 1
      else:
        returned[r] += sizes[trained]
  return SimulationResult(selection, seed, sent, returned, failed)
