"""The client device population: tiers, capacities, availability, fluctuation.

    from tff_hetero import devices
    tiers = devices.parse_tiers("weak,medium,strong", "4:3:3")
    tiers = devices.resolve_capacities(tiers, full_params, full_flops)
    population = devices.assign_tiers(client_ids, tiers, seed=0)
    population.capacity_at_round("17", round_num=3)   # Capacity(params, flops)

See `tiers.py` for the flags and defaults (AdaptiveFL's 4:3:3) and
`population.py` for the assignment and the per-round draws.
"""

from tff_hetero.devices.population import Capacity
from tff_hetero.devices.population import DevicePopulation
from tff_hetero.devices.population import DeviceProfile
from tff_hetero.devices.population import assign_tiers
from tff_hetero.devices.population import tier_sizes
from tff_hetero.devices.tiers import AVAILABILITY_FLAG
from tff_hetero.devices.tiers import CAPACITIES_FLAG
from tff_hetero.devices.tiers import DEFAULT_CAPACITY_FRACTIONS
from tff_hetero.devices.tiers import DEFAULT_PROPORTIONS
from tff_hetero.devices.tiers import DEFAULT_TIERS
from tff_hetero.devices.tiers import FLUCTUATION_FLAG
from tff_hetero.devices.tiers import PROPORTIONS_FLAG
from tff_hetero.devices.tiers import TIERS_FLAG
from tff_hetero.devices.tiers import TierSpec
from tff_hetero.devices.tiers import parse_tiers
from tff_hetero.devices.tiers import resolve_capacities
from tff_hetero.errors import DeviceError

__all__ = [
  "AVAILABILITY_FLAG",
  "CAPACITIES_FLAG",
  "Capacity",
  "DEFAULT_CAPACITY_FRACTIONS",
  "DEFAULT_PROPORTIONS",
  "DEFAULT_TIERS",
  "DeviceError",
  "DevicePopulation",
  "DeviceProfile",
  "FLUCTUATION_FLAG",
  "PROPORTIONS_FLAG",
  "TIERS_FLAG",
  "TierSpec",
  "assign_tiers",
  "parse_tiers",
  "resolve_capacities",
  "tier_sizes",
]
