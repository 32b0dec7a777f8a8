"""tf.data options for the datasets a round iterates: autotuning off.

`without_autotune(dataset)` is `dataset` with `tf.data.Options().autotune.enabled
= False`. Every dataset the program hands to a TFF computation, builds inside
one, or evaluates on goes through it.

Why: with autotuning on (tf.data's default), every iterator starts a model
thread (`Model::OptimizeLoop`) that sleeps on a deadline, and destroying the
iterator waits for that thread to end. On the TFF worker (TensorFlow 2.14,
two cores) that wait sometimes lasted until the sleep's deadline: a client
computation could not return, and the whole worker sat idle for several
seconds inside a round (2026-11-28, sampling the worker's CPU time every
second during FedAvg rounds of `mnist_cnn_feddst`, 10 clients x 20 steps:
0.00 CPU seconds for 6 s in a row, the stacks then showed one thread in
`~IteratorResource` waiting on the model thread, every other thread waiting
on it). With autotuning off there is no model thread: the same rounds went
from 8.9-14.5 s (median 11.6) to 7.3-9.0 s (median 8.7); `tools/bench.py
--suite=base`'s compute-bound round went from 16.34 s to 8.63 s against a
floor of 7.05 / 7.30 s (plain TensorFlow, `docs/performance.md`). Nothing
is lost: these datasets are in-memory slices, or a `flat_map` over files
(`worker_files`), with no parallel stage for autotuning to tune.
"""

from __future__ import annotations

__all__ = ["without_autotune"]


def without_autotune(dataset):
  """`dataset` (a `tf.data.Dataset`) with tf.data's autotuning off."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)
