"""Known-answer tests of payload sizes, NumPy and TensorFlow versions alike."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tff_hetero.accounting import payload


def test_dense_nbytes_counts_every_element_at_its_itemsize():
  structure = collections.OrderedDict(
    kernel=np.zeros([3, 4], np.float32),  # 12 * 4 = 48
    bias=np.zeros([4], np.float64),  # 4 * 8 = 32
    steps=np.int32(7),  # 4
  )
  assert payload.dense_nbytes(structure) == 84
  assert int(payload.tf_dense_nbytes(structure)) == 84


def test_tf_dense_nbytes_counts_leaves_whose_size_is_known_only_when_run():
  @tf.function(
    input_signature=[
      tf.TensorSpec([None, 3], tf.float32),
      tf.TensorSpec([2], tf.float64),
    ]
  )
  def nbytes(rows, known):
    return payload.tf_dense_nbytes([rows, known])

  # 5 rows * 3 * 4 bytes + 2 * 8 bytes; 1 row: 12 + 16.
  assert int(nbytes(tf.zeros([5, 3]), tf.zeros([2], tf.float64))) == 76
  assert int(nbytes(tf.zeros([1, 3]), tf.zeros([2], tf.float64))) == 28


def test_masked_nbytes_is_kept_values_plus_one_bit_per_element():
  values = [np.arange(20, dtype=np.float32).reshape(4, 5)]
  masks = [np.zeros([4, 5], np.bool_)]
  masks[0][0, :3] = True  # 3 kept values.
  # 3 values * 4 bytes + ceil(20 / 8) = 12 + 3 bytes of mask.
  assert payload.masked_nbytes(values, masks) == 15
  assert int(payload.tf_masked_nbytes(values, masks)) == 15


def test_masked_nbytes_with_none_mask_is_dense():
  values = [np.zeros([10], np.float32), np.zeros([9], np.float32)]
  masks = [None, np.ones([9], np.bool_)]
  # 40 dense + 9 * 4 + ceil(9 / 8) = 40 + 36 + 2.
  assert payload.masked_nbytes(values, masks) == 78


def test_masked_nbytes_rejects_mismatched_mask():
  with pytest.raises(ValueError, match="mask shape"):
    payload.masked_nbytes([np.zeros([3])], [np.zeros([4])])


def test_tf_and_numpy_agree_on_random_masks():
  rng = np.random.default_rng(0)
  values = [
    rng.normal(size=[7, 3]).astype(np.float32),
    rng.normal(size=[33]).astype(np.float32),
  ]
  masks = [rng.random([7, 3]) < 0.3, rng.random([33]) < 0.6]
  expected = payload.masked_nbytes(values, masks)
  assert (
    int(
      payload.tf_masked_nbytes(
        [tf.constant(v) for v in values], [tf.constant(m) for m in masks]
      )
    )
    == expected
  )


def test_channel_indexed_nbytes_by_hand_and_in_tf():
  kernel = np.ones([3, 3, 2, 4], np.float32)  # 18 values per channel.
  bias = np.ones([4], np.float32)
  dense = np.ones([5], np.float32)
  mask = np.array([1, 0, 1, 1], np.float32)
  # Three kernel channels (3 x 18 floats), three bias values, five dense
  # floats; one int32 index per kept channel, shared by kernel and bias.
  by_hand = (3 * 18 + 3 + 5) * 4 + 3 * 4
  assert (
    payload.channel_indexed_nbytes(
      [kernel, bias, dense], [mask, mask, None], index_groups=[0, 0, -1]
    )
    == by_hand
  )
  # Without groups each value sends its own indices.
  assert (
    payload.channel_indexed_nbytes([kernel, bias], [mask, mask])
    == (3 * 18 + 3) * 4 + 2 * 3 * 4
  )
  assert (
    int(
      payload.tf_channel_indexed_nbytes(
        [kernel, bias, dense], [mask, mask, None], index_groups=[0, 0, -1]
      )
    )
    == by_hand
  )
  with pytest.raises(ValueError, match="channel mask shape"):
    payload.channel_indexed_nbytes([kernel], [np.ones([3])])
