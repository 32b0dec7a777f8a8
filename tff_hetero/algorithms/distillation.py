"""Knowledge-distillation losses (Hinton et al., "Distilling the Knowledge in
a Neural Network", 2015), shared by the algorithms that transfer knowledge
through logits (FedGKT)."""

from __future__ import annotations

import tensorflow as tf


def soft_label_kl(
  teacher_logits: tf.Tensor,
  student_logits: tf.Tensor,
  temperature: float,
  t_squared: bool = True,
) -> tf.Tensor:
  """Mean over the batch of KL(softmax(teacher / T) || softmax(student / T)),
  times T^2 when `t_squared`.

  The teacher's logits are constants (no gradient flows into them). The
  gradient of the KL term with respect to a student logit is
  (softmax(student / T) - softmax(teacher / T)) / T; the T^2 factor makes it
  T x that, so that its scale relative to the cross-entropy's does not
  shrink as 1 / T^2 (Hinton et al., Section 2). FedGKT's Eq. 6/7 have no
  T^2; its official code multiplies by T^2 (`KL_Loss`).
  """
  t = tf.cast(temperature, tf.float32)
  teacher = tf.stop_gradient(tf.cast(teacher_logits, tf.float32)) / t
  student = tf.cast(student_logits, tf.float32) / t
  log_teacher = tf.nn.log_softmax(teacher)
  kl = tf.reduce_sum(
    tf.exp(log_teacher) * (log_teacher - tf.nn.log_softmax(student)), axis=-1
  )
  scale = t * t if t_squared else tf.constant(1.0)
  return scale * tf.reduce_mean(kl)
