"""Knowledge-distillation losses (Hinton et al., "Distilling the Knowledge in
a Neural Network", 2015), shared by the algorithms that transfer knowledge
through logits (FedGKT)."""

from __future__ import annotations

import tensorflow as tf


def soft_label_kl(teacher_logits: tf.Tensor, student_logits: tf.Tensor,
                  temperature: float) -> tf.Tensor:
  """T^2 x mean over the batch of KL(softmax(teacher / T) || softmax(student / T)).

  The teacher's logits are constants (no gradient flows into them). The T^2
  factor keeps the gradient's scale independent of T (Hinton et al.,
  Section 2), as FedGKT's reference code does.
  """
  t = tf.cast(temperature, tf.float32)
  teacher = tf.stop_gradient(tf.cast(teacher_logits, tf.float32)) / t
  student = tf.cast(student_logits, tf.float32) / t
  log_teacher = tf.nn.log_softmax(teacher)
  kl = tf.reduce_sum(
      tf.exp(log_teacher) * (log_teacher - tf.nn.log_softmax(student)),
      axis=-1)
  return t * t * tf.reduce_mean(kl)
