"""Exact parameter and MAC counts, checked against figures computed by hand.

Conventions (see tff_hetero/models/counting.py): MACs per example of one
forward pass; conv = out_h*out_w*C_out*(k_h*k_w*C_in/groups); dense = in*out;
bias adds not counted; batch/layer norm = 1 MAC per output element;
pooling, activations, merges = 0.
"""

from conftest import assert_one_line_error
import pytest
import tensorflow as tf

from tff_hetero import models


def _one_line_error(call, *needles):
  return assert_one_line_error(models.ModelError, call, *needles)


L = tf.keras.layers


def _by_name(model):
  return {row.name: row for row in models.layer_costs(model)}


def _check_totals(model, trainable, non_trainable, macs):
  assert models.count_params(model) == models.ParamCount(
    trainable, non_trainable, trainable + non_trainable
  )
  assert model.count_params() == trainable + non_trainable  # Keras agrees
  assert models.count_flops(model) == macs
  assert models.training_flops_per_example(model) == 3 * macs
  rows = models.layer_costs(model)
  assert sum(r.params for r in rows) == trainable
  assert sum(r.non_trainable for r in rows) == non_trainable


def test_mnist_cnn_by_hand():
  model = models.build_model("mnist_cnn", (28, 28, 1), 10, 0)
  rows = _by_name(model)
  # conv1: 28 -> 24 (valid 5x5); params 5*5*1*10 + 10 = 260;
  #        MACs 24*24*10*(5*5*1) = 144,000
  assert rows["conv1"][2:] == (260, 0, 144_000)
  # pool1: 24 -> 12.  conv2: 12 -> 8; params 5*5*10*20 + 20 = 5,020;
  #        MACs 8*8*20*(5*5*10) = 320,000
  assert rows["conv2"][2:] == (5_020, 0, 320_000)
  # pool2: 8 -> 4; flatten 4*4*20 = 320.  fc1: 320*50 + 50 = 16,050 params,
  #        320*50 = 16,000 MACs.  logits: 50*10 + 10 = 510, 500 MACs.
  assert rows["fc1"][2:] == (16_050, 0, 16_000)
  assert rows["logits"][2:] == (510, 0, 500)
  assert rows["pool1"].macs == rows["pool2"].macs == rows["flatten"].macs == 0
  # 260 + 5,020 + 16,050 + 510 = 21,840; 144,000 + 320,000 + 16,000 + 500
  _check_totals(model, 21_840, 0, 480_500)


def test_mnist_cnn_feddst_by_hand():
  model = models.build_model("mnist_cnn_feddst", (28, 28, 1), 10, 0)
  rows = _by_name(model)
  # conv1 28 -> 24, MACs 24*24*10*25 = 144,000; pool 3x3 stride 1: 24 -> 22
  assert rows["conv1"].macs == 144_000
  # conv2 22 -> 18: 18*18*20*(5*5*10) = 1,620,000; pool 3/1: 18 -> 16
  assert rows["conv2"][2:] == (5_020, 0, 1_620_000)
  # flatten 16*16*20 = 5,120; fc1 5,120*50 + 50 = 256,050 params, 256,000 MACs
  assert model.get_layer("flatten").output_shape == (None, 5_120)
  assert rows["fc1"][2:] == (256_050, 0, 256_000)
  # 260 + 5,020 + 256,050 + 510 = 261,840 (FedDST's reference figure)
  _check_totals(model, 261_840, 0, 144_000 + 1_620_000 + 256_000 + 500)


def test_cifar_cnn_by_hand_on_32x32():
  model = models.build_model("cifar_cnn", (32, 32, 3), 10, 0)
  rows = _by_name(model)
  # conv1 same 5x5: 32x32x64; params 5*5*3*64 + 64 = 4,864;
  #   MACs 32*32*64*(5*5*3) = 4,915,200
  assert rows["conv1"][2:] == (4_864, 0, 4_915_200)
  # pool 3x3/2 same: 32 -> 16; conv2: params 5*5*64*64 + 64 = 102,464;
  #   MACs 16*16*64*(5*5*64) = 26,214,400
  assert rows["conv2"][2:] == (102_464, 0, 26_214_400)
  # pool: 16 -> 8; flatten 8*8*64 = 4,096; fc1 4,096*384 (+384 bias)
  assert rows["fc1"][2:] == (1_573_248, 0, 1_572_864)
  # fc2 384*192 + 192; logits 192*10 + 10
  assert rows["fc2"][2:] == (73_920, 0, 73_728)
  assert rows["logits"][2:] == (1_930, 0, 1_920)
  _check_totals(
    model, 1_756_426, 0, 4_915_200 + 26_214_400 + 1_572_864 + 73_728 + 1_920
  )


def test_cifar_cnn_by_hand_on_24x24_crops_of_the_paper():
  model = models.build_model("cifar_cnn", (24, 24, 3), 10, 0)
  # conv1 24*24*64*75 = 2,764,800; conv2 12*12*64*1,600 = 14,745,600;
  # flatten 6*6*64 = 2,304; fc1 2,304*384 = 884,736 (+384 params)
  # params 4,864 + 102,464 + 885,120 + 73,920 + 1,930 = 1,068,298 ("about 10^6")
  _check_totals(
    model, 1_068_298, 0, 2_764_800 + 14_745_600 + 884_736 + 73_728 + 1_920
  )


def test_small_cnn_by_hand():
  model = models.build_model("small_cnn", (8, 8, 1), 10, 0)
  rows = _by_name(model)
  # conv1 same 3x3: 8*8*16*9 = 9,216 MACs, 3*3*1*16 + 16 = 160 params
  assert rows["conv1"][2:] == (160, 0, 9_216)
  # pool 8 -> 4; conv2: 4*4*32*(3*3*16) = 73,728 MACs, 144*32 + 32 = 4,640
  assert rows["conv2"][2:] == (4_640, 0, 73_728)
  # pool 4 -> 2; flatten 2*2*32 = 128; logits 128*10 (+10)
  assert rows["logits"][2:] == (1_290, 0, 1_280)
  _check_totals(model, 6_090, 0, 9_216 + 73_728 + 1_280)


def test_mlp_by_hand():
  model = models.build_model("mlp", (8, 8, 1), 10, 0)
  # fc1 64*64 + 64 = 4,160 params, 4,096 MACs; logits 64*10 + 10, 640 MACs
  _check_totals(model, 4_810, 0, 4_096 + 640)
  model = models.build_model("mlp", (28, 28, 1), 10, 0)
  # fc1 784*64 + 64 = 50,240; logits 650; MACs 50,176 + 640
  _check_totals(model, 50_890, 0, 50_176 + 640)


def test_mnist_2nn_matches_fedavg_paper():
  model = models.build_model("mnist_2nn", (28, 28, 1), 10, 0)
  # 784*200+200 + 200*200+200 + 200*10+10 = 199,210 (McMahan et al. 2017)
  _check_totals(model, 199_210, 0, 156_800 + 40_000 + 2_000)


def test_conv_variants_batch_norm_and_layer_norm_by_hand():
  inputs = tf.keras.Input((8, 8, 4))
  x = L.Conv2D(6, 3, padding="same", use_bias=False, name="conv")(inputs)
  x = L.BatchNormalization(name="bn")(x)
  x = L.ReLU(name="relu")(x)
  x = L.DepthwiseConv2D(3, depth_multiplier=2, name="dw")(x)
  x = L.SeparableConv2D(5, 3, padding="same", name="sep")(x)
  x = L.Conv2DTranspose(3, 2, strides=2, name="up")(x)
  x = L.Conv2D(4, 3, name="valid")(x)
  x = L.GlobalAveragePooling2D(name="gap")(x)
  x = L.LayerNormalization(name="ln")(x)
  outputs = L.Dense(3, name="out")(x)
  rows = _by_name(tf.keras.Model(inputs, outputs))
  # conv: 8*8*6*(3*3*4) = 13,824 MACs; 3*3*4*6 = 216 params (no bias)
  assert rows["conv"][2:] == (216, 0, 13_824)
  # bn: gamma, beta trainable (2*6), mean, var not (2*6); 8*8*6 = 384 MACs
  assert rows["bn"][2:] == (12, 12, 384)
  assert rows["relu"][2:] == (0, 0, 0)
  # dw 3x3 valid: 8 -> 6, 6*2 = 12 channels: 6*6*12*9 = 3,888; 9*12 + 12
  assert rows["dw"][2:] == (120, 0, 3_888)
  # sep: depthwise 6*6*12*9 = 3,888 + pointwise 6*6*12*5 = 2,160 -> 6,048;
  #      params 9*12 + 12*5 + 5 = 173
  assert rows["sep"][2:] == (173, 0, 6_048)
  # transpose 2x2/2: 6*6 input positions * 5 in * 4 kernel * 3 out = 2,160;
  #      params 2*2*5*3 + 3 = 63; output 12x12x3
  assert rows["up"][2:] == (63, 0, 2_160)
  # valid 3x3: 12 -> 10: 10*10*4*(9*3) = 10,800; 9*3*4 + 4 = 112
  assert rows["valid"][2:] == (112, 0, 10_800)
  assert rows["gap"].macs == 0
  # ln over 4 features: 4 MACs, gamma + beta = 8
  assert rows["ln"][2:] == (8, 0, 4)
  assert rows["out"][2:] == (15, 0, 12)


def test_grouped_conv_by_hand():
  inputs = tf.keras.Input((5, 5, 4))
  model = tf.keras.Model(inputs, L.Conv2D(6, 3, groups=2, name="g")(inputs))
  # out 3x3x6, each output sees 3*3*(4/2) inputs: 9*6*18 = 972; 3*3*2*6 + 6
  _check_totals(model, 114, 0, 972)


def test_dense_on_sequences_counts_every_position():
  inputs = tf.keras.Input((7, 5))
  model = tf.keras.Model(inputs, L.Dense(3)(inputs))
  _check_totals(model, 5 * 3 + 3, 0, 7 * 5 * 3)


def test_multi_head_attention_by_hand():
  query, value = tf.keras.Input((5, 8)), tf.keras.Input((7, 6))
  mha = L.MultiHeadAttention(num_heads=2, key_dim=3, value_dim=4, name="mha")
  model = tf.keras.Model([query, value], mha(query, value))
  # T=5, S=7, d_q=8, d_k=d_v=6, H=2, key 3, value 4, output back to 8:
  # Q 5*8*6 = 240; K 7*6*6 = 252; V 7*6*8 = 336; scores + context
  # 2*5*7*(3+4) = 490; output 5*(2*4)*8 = 320.  Params: (8*6+6) + (6*6+6)
  # + (6*8+8) + (8*8+8) = 224.
  _check_totals(model, 224, 0, 240 + 252 + 336 + 490 + 320)


def test_nested_models_and_shared_layers():
  inner_in = tf.keras.Input((4,))
  inner = tf.keras.Model(inner_in, L.Dense(3, name="d")(inner_in), name="inner")
  outer_in = tf.keras.Input((4,))
  shared = L.Dense(4, name="shared")
  h = shared(shared(outer_in))
  model = tf.keras.Model(outer_in, L.Add(name="add")([inner(h), inner(h)]))
  rows = models.layer_costs(model)
  assert [r.name for r in rows] == [
    "shared",
    "shared#2",
    "inner/d",
    "inner/d#2",
    "add",
  ]
  assert [r.params for r in rows] == [20, 0, 15, 0, 0]
  assert [r.macs for r in rows] == [16, 16, 12, 12, 0]
  _check_totals(model, 35, 0, 56)


def test_nested_sequential_and_tf_ops():
  body = tf.keras.Sequential([L.Dense(6), L.Dense(2)], name="body")
  inputs = tf.keras.Input((3,))
  outputs = tf.nn.relu(body(inputs)) * 2.0
  model = tf.keras.Model(inputs, outputs)
  # 3*6 + 6*2 MACs; params 3*6+6 + 6*2+2
  _check_totals(model, 38, 0, 30)
  assert [r.name.split("/")[0] for r in models.layer_costs(model)][:2] == [
    "body",
    "body",
  ]


def test_pruning_wrappers_cost_the_dense_layer():
  tfmot = pytest.importorskip("tensorflow_model_optimization")
  model = models.build_model("mnist_cnn", (28, 28, 1), 10, 0)
  pruned = tfmot.sparsity.keras.prune_low_magnitude(
    model, pruning_schedule=tfmot.sparsity.keras.ConstantSparsity(0.5, 0)
  )
  rows = models.layer_costs(pruned)
  assert rows[0].kind == "PruneLowMagnitude(Conv2D)"
  assert models.count_flops(pruned) == 480_500
  counts = models.count_params(pruned)
  assert counts.trainable == 21_840
  # masks (one per kernel: 250 + 5,000 + 16,000 + 500), thresholds (4 scalars)
  # and pruning steps (one per wrapper, 7 wrappers) are non-trainable
  assert counts.non_trainable == 21_750 + 4 + 7


def test_unsupported_parametrised_layer_is_named():
  inputs = tf.keras.Input((4,))
  model = tf.keras.Model(inputs, L.PReLU(name="prelu")(inputs))
  _one_line_error(
    lambda: models.count_flops(model), "'prelu'", "PReLU", "no counting rule"
  )


def test_dot_merge_is_not_silently_free():
  inputs = tf.keras.Input((4, 4))
  model = tf.keras.Model(inputs, L.Dot(axes=2, name="dot")([inputs, inputs]))
  _one_line_error(lambda: models.count_flops(model), "'dot'", "Dot")


def test_direct_matmul_op_is_refused():
  inputs = tf.keras.Input((4, 4))
  model = tf.keras.Model(inputs, tf.linalg.matmul(inputs, inputs))
  _one_line_error(lambda: models.count_flops(model), "linalg.matmul")


def test_subclass_with_extra_weights_is_refused():

  class DenseWithExtra(L.Dense):
    def build(self, input_shape):
      super().build(input_shape)
      self.extra = self.add_weight(name="extra", shape=(7,))

  inputs = tf.keras.Input((4,))
  model = tf.keras.Model(inputs, DenseWithExtra(2, name="odd")(inputs))
  _one_line_error(
    lambda: models.count_flops(model),
    "'odd'",
    "17 parameters",
    "accounts for 10",
  )


def test_subclassed_and_unbuilt_models_and_unknown_shapes():

  class Subclassed(tf.keras.Model):
    def __init__(self):
      super().__init__(name="sub")
      self.dense = L.Dense(2)

    def call(self, x):
      return self.dense(x)

  sub = Subclassed()
  sub(tf.zeros((1, 3)))
  assert models.count_params(sub) == models.ParamCount(8, 0, 8)
  _one_line_error(lambda: models.count_flops(sub), "'sub'", "functional")

  unbuilt = tf.keras.Sequential([L.Dense(3)], name="lazy")
  _one_line_error(lambda: models.count_params(unbuilt), "'lazy'", "not built")

  inputs = tf.keras.Input((None, None, 3))
  open_shape = tf.keras.Model(inputs, L.Conv2D(2, 3, name="c")(inputs))
  _one_line_error(lambda: models.count_flops(open_shape), "'c'", "unknown")


def test_embedding_conv1d_and_group_norm_by_hand():
  tokens = tf.keras.Input((5,), dtype=tf.int32)
  x = L.Embedding(100, 8, name="emb")(tokens)  # (5, 8)
  x = L.Conv1D(4, 3, name="conv")(x)  # (3, 4)
  x = L.GroupNormalization(groups=2, name="gn")(x)
  rows = _by_name(tf.keras.Model(tokens, x))
  # embedding: 100*8 parameters, a lookup (0 MACs)
  assert rows["emb"][2:] == (800, 0, 0)
  # conv1d: 3 positions * 4 out * (3*8) = 288 MACs; 3*8*4 + 4 = 100 params
  assert rows["conv"][2:] == (100, 0, 288)
  # group norm: 3*4 = 12 elements; gamma + beta per channel = 8
  assert rows["gn"][2:] == (8, 0, 12)
