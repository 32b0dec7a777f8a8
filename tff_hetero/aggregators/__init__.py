"""`tff.aggregators` factories and server-side steps shared by the algorithms."""

from tff_hetero.aggregators.masked import MaskedMeanFactory
from tff_hetero.aggregators.masked import MaskedSumFactory
from tff_hetero.aggregators.masked import MaskedSums
from tff_hetero.aggregators.masked import MaskedWeight
from tff_hetero.aggregators.masked import add_masked_sums
from tff_hetero.aggregators.masked import masked_average
from tff_hetero.aggregators.masked import masked_mean_or_zero
from tff_hetero.aggregators.masked import weigh
from tff_hetero.aggregators.masked_dp import MaskedAggregation
from tff_hetero.aggregators.model_aggregators import MODEL_AGGREGATORS
from tff_hetero.aggregators.model_aggregators import build_model_aggregator

__all__ = [
  "MaskedAggregation",
  "MODEL_AGGREGATORS",
  "build_model_aggregator",
  "MaskedMeanFactory",
  "MaskedSumFactory",
  "MaskedSums",
  "MaskedWeight",
  "add_masked_sums",
  "masked_average",
  "masked_mean_or_zero",
  "weigh",
]
