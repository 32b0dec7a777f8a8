"""Sub-models of width-capable models: pools of widths and the maps to them.

* `pools`: AdaptiveFL's pool (L1, M1..Mp, S1..Sp) and HeteroFL's uniform
  rates, as `SubModelPool`s of `PoolMember`s;
* `maps`: `SubModelMap`, extracting a sub-model's weights from a larger
  model's and scattering them back, as TensorFlow ops.
"""

from tff_hetero.submodels.maps import SliceSpec
from tff_hetero.submodels.maps import SubModelMap
from tff_hetero.submodels.pools import PoolMember
from tff_hetero.submodels.pools import SubModelPool
from tff_hetero.submodels.pools import adaptivefl_pool
from tff_hetero.submodels.pools import uniform_pool

__all__ = [
  "PoolMember",
  "SliceSpec",
  "SubModelMap",
  "SubModelPool",
  "adaptivefl_pool",
  "uniform_pool",
]
