"""Communication and compute accounting measured on what actually happened."""

from tff_hetero.accounting.ledger import ClientTraffic
from tff_hetero.accounting.ledger import CommLedger
from tff_hetero.accounting.ledger import RoundTotals
from tff_hetero.accounting.payload import channel_indexed_nbytes
from tff_hetero.accounting.payload import dense_nbytes
from tff_hetero.accounting.payload import masked_nbytes
from tff_hetero.accounting.payload import tf_channel_indexed_nbytes
from tff_hetero.accounting.payload import tf_dense_nbytes
from tff_hetero.accounting.payload import tf_masked_nbytes

__all__ = [
  "ClientTraffic",
  "CommLedger",
  "RoundTotals",
  "channel_indexed_nbytes",
  "dense_nbytes",
  "masked_nbytes",
  "tf_channel_indexed_nbytes",
  "tf_dense_nbytes",
  "tf_masked_nbytes",
]
