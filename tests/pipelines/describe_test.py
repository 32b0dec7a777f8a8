"""pipelines.describe: model and pool sizes, in process through its CLI entry.

The figures are the exact ones of tests/models (hand-computed there). Sizes
are cached per process by the pipeline, so VGG-16's pool is built once here.
"""

import json
import os
import subprocess
import sys

import pytest

from pipelines import _cli
from pipelines import describe
from pipelines import train  # noqa: F401  both pipelines' flags in one process

_ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def _run(capsys, *flags):
  _cli.run_in_process(describe.main, ["describe", *flags])
  return capsys.readouterr().out


def _json(capsys, *flags):
  return json.loads(_run(capsys, "--format=json", *flags))


def test_model_json_has_params_and_flops(capsys):
  out = _json(capsys, "--model=mnist_cnn")
  assert (out["params"], out["non_trainable"], out["flops"]) == (
    21_840,
    0,
    480_500,
  )
  assert out["training_flops_per_example"] == 3 * 480_500
  assert (out["input_shape"], out["num_classes"]) == ([28, 28, 1], 10)
  assert [l["name"] for l in out["layers"] if l["params"]] == [
    "conv1",
    "conv2",
    "fc1",
    "logits",
  ]
  assert sum(l["flops"] for l in out["layers"]) == 480_500


def test_model_table_lists_weighted_layers_and_totals(capsys):
  out = _run(capsys, "--model=vgg16_eighth", "--dataset=mnist5k")
  lines = out.splitlines()
  assert lines[0] == "vgg16_eighth on 28x28x1 (mnist5k), 10 classes"
  assert lines[1].split() == [
    "layer",
    "kind",
    "params",
    "non-trainable",
    "MACs",
  ]
  rows = {line.split()[0]: line.split()[1:] for line in lines[2:-1]}
  assert rows["conv1"] == ["Conv2D", "80", "0", "56,448"]
  assert rows["bn1"] == ["BatchNormalization", "16", "16", "6,272"]
  assert rows["total"] == ["234,946", "1,056", "3,283,232"]
  assert "relu1" not in rows and "pool1" not in rows  # no weights, no MACs
  assert lines[-1].startswith(
    "params 234,946 (non-trainable 1,056); forward MACs per example 3,283,232"
  )


def test_default_shapes_by_model_and_overrides(capsys):
  # Models meant for CIFAR images default to cifar10 (32x32x3, 10 classes)
  assert _json(capsys, "--model=resnet20")["params"] == 269_722
  edge = _json(capsys, "--model=fedgkt_edge_resnet8")
  assert (edge["input_shape"], edge["params"], edge["flops"]) == (
    [32, 32, 3],
    14_650,
    14_712_992,
  )
  # The ResNet-55 server on the edge's 32x32x16 features: CIFAR ResNet-56
  # (n = 9) without its stem, counted as models_zoo_test's
  # _cifar_resnet_by_hand(9) less the stem's 464 parameters, 32 BN statistics
  # and 458,752 MACs.
  server = _json(capsys, "--model=fedgkt_server_resnet55")
  assert (server["params"], server["non_trainable"], server["flops"]) == (
    852_554,
    4_032,
    125_559_424,
  )
  assert _json(capsys, "--model=cifar_cnn")["flops"] == 32_778_112
  # cifar100: the logits grow from 64*10+10 to 64*100+100
  out = _json(capsys, "--model=resnet20", "--dataset=cifar100")
  assert out["params"] == 269_722 - 650 + 6_500
  out = _json(capsys, "--model=mlp", "--input_shape=8,8,1", "--num_classes=3")
  assert (out["input_shape"], out["params"]) == ([8, 8, 1], 64 * 64 + 64 + 195)
  assert _json(capsys, "--model=mlp", "--dataset=digits")["params"] == 4_810


def test_edge_model_reports_its_extractor_and_ratios(capsys):
  edge = _json(capsys, "--model=fedgkt_edge_resnet8")
  # The extractor is the stem: 3x3x3x16 kernel + BN gamma/beta; its MACs
  # are the convolution and the BN on 32x32x16 (tests/models by hand).
  assert edge["split_layer"] == "stem_relu"
  assert (edge["extractor_params"], edge["extractor_flops"]) == (
    27 * 16 + 2 * 16,
    32 * 32 * 16 * 27 + 32 * 32 * 16,
  )
  assert [r["model"] for r in edge["full_model_ratios"]] == [
    "resnet56",
    "resnet110",
  ]
  assert "split_layer" not in _json(capsys, "--model=resnet56")


# FedGKT, Section 4.3 and abstract: ResNet-8 "has 11K parameters", "54 times
# less than that of ResNet-56 and 105 times less than that of ResNet-110",
# edge FLOPs "9 times less than that of ResNet-56 and 17 times less than
# that of ResNet-110". The paper prints rounded figures (11K for 10,586
# parameters) and whole ratios: ours must be within 5% of each.
PAPER_TOLERANCE = 0.05


def test_official_variants_match_the_papers_ratios(capsys):
  out = _json(capsys, "--model=fedgkt_edge_resnet8_bottleneck")
  assert out["params"] == pytest.approx(11_000, rel=PAPER_TOLERANCE)
  assert out["paper_params"] == 11_000
  ratios = {r["model"]: r for r in out["full_model_ratios"]}
  paper = {"resnet56_bottleneck": (54, 9), "resnet110_bottleneck": (105, 17)}
  assert set(ratios) == set(paper)
  for full, (params_ratio, flops_ratio) in paper.items():
    row = ratios[full]
    assert (row["paper_params_ratio"], row["paper_flops_ratio"]) == (
      params_ratio,
      flops_ratio,
    )
    assert row["params_ratio"] == pytest.approx(
      params_ratio, rel=PAPER_TOLERANCE
    )
    assert row["flops_ratio"] == pytest.approx(flops_ratio, rel=PAPER_TOLERANCE)
    assert row["params_ratio"] == round(row["params"] / out["params"], 2)
  text = _run(capsys, "--model=fedgkt_edge_resnet8_bottleneck")
  assert (
    "resnet56_bottleneck (591,322 params, 88,414,720 MACs) /"
    " fedgkt_edge_resnet8_bottleneck: params 55.86x, forward MACs"
    " 8.93x (paper: 54x and 9x)"
  ) in text


def test_vgg16_adaptivefl_pool_json_and_paper_figures(capsys):
  rows = _json(capsys, "--model=vgg16", "--pool=adaptivefl")
  assert [r["level"] for r in rows] == [
    "L1",
    "M1",
    "M2",
    "M3",
    "S1",
    "S2",
    "S3",
  ]
  assert [r["index"] for r in rows] == [6, 5, 4, 3, 2, 1, 0]
  assert [(r["r_w"], r["I"]) for r in rows] == [
    (1.0, 15),
    (0.66, 8),
    (0.66, 6),
    (0.66, 4),
    (0.4, 8),
    (0.4, 6),
    (0.4, 4),
  ]
  assert [r["params"] for r in rows] == [
    33_646_666,
    16_814_977,
    15_410_557,
    14_839_789,
    8_397_106,
    6_483_040,
    5_667_148,
  ]
  assert [r["flops"] for r in rows] == [
    332_388_352,
    271_366_174,
    239_167_550,
    202_660_926,
    238_211_768,
    190_562_936,
    138_385_272,
  ]
  assert rows[1]["ratio"] == round(16_814_977 / 33_646_666, 4)
  assert [r["paper_params"] for r in rows] == [
    33_650_000,
    16_810_000,
    15_410_000,
    14_840_000,
    8_390_000,
    6_480_000,
    5_670_000,
  ]
  assert rows[0]["paper_flops"] == 333_220_000
  assert rows[1]["widths"][-2:] == [2703, 2703]


def test_vgg16_adaptivefl_pool_table(capsys):
  lines = _run(capsys, "--model=vgg16", "--pool=adaptivefl").splitlines()
  assert lines[0] == (
    "vgg16 on 32x32x3 (cifar10), 10 classes: AdaptiveFL"
    " pool, r_M=0.66, r_S=0.4, I=8:6:4"
  )
  assert lines[1].split() == [
    "level",
    "r_w",
    "I",
    "params",
    "FLOPs",
    "(MACs)",
    "ratio",
    "paper",
    "params",
    "paper",
    "FLOPs",
  ]
  assert lines[2].split() == [
    "L1",
    "1.00",
    "15",
    "33,646,666",
    "332,388,352",
    "1.00",
    "33.65M",
    "333.22M",
  ]
  assert lines[7].split() == [
    "S2",
    "0.40",
    "6",
    "6,483,040",
    "190,562,936",
    "0.19",
    "6.48M",
    "191.31M",
  ]
  assert lines[-1].startswith("paper: AdaptiveFL (DAC 2024) Table 1")


def test_other_settings_show_no_paper_columns(capsys):
  rows = _json(
    capsys, "--model=vgg16", "--pool=adaptivefl", "--pool_start_indices=8"
  )
  assert [r["level"] for r in rows] == ["L1", "M1", "S1"]
  assert "paper_params" not in rows[0]
  assert rows[1]["params"] == 16_814_977  # same member as the full pool's M1


def test_small_model_pools(capsys):
  rows = _json(capsys, "--model=mnist_cnn", "--pool=adaptivefl")
  # default I = 2 (with 1 as well, S1 would outgrow M2); floor: fc1 50 ->
  # 33 / 20
  assert [(r["level"], r["I"], r["widths"]) for r in rows] == [
    ("L1", 3, [10, 20, 50]),
    ("M1", 2, [10, 20, 33]),
    ("S1", 2, [10, 20, 20]),
  ]
  # M1: fc1 320*33+33, logits 33*10+10: 260 + 5,020 + 10,593 + 340
  assert rows[1]["params"] == 16_213
  # S1: fc1 320*20+20, logits 20*10+10: 260 + 5,020 + 6,420 + 210
  assert rows[2]["params"] == 11_910
  rows = _json(
    capsys, "--model=resnet20", "--pool=heterofl", "--heterofl_rates=1:0.5"
  )
  assert [(r["level"], r["r_w"], r["I"], r["widths"]) for r in rows] == [
    ("x1", 1.0, 0, [16, 16, 32, 64]),
    ("x0.5", 0.5, 0, [8, 8, 16, 32]),
  ]
  assert rows[0]["params"] == 269_722
  lines = _run(capsys, "--model=resnet20", "--pool=heterofl").splitlines()
  assert lines[0].endswith("HeteroFL pool, rates 1:0.5:0.25")
  assert [line.split()[0] for line in lines[2:]] == ["x1", "x0.5", "x0.25"]


def test_depth_model_json_has_its_tiers(capsys):
  # tests/models/depth_test.py by hand: 1,706 + 18,496 L parameters and
  # 57,792 + 3,612,672 L MACs; HeteroFL widths: C = 26 and 19 channels
  # give the 12-block model about the 8- and 4-block models' parameters.
  out = _json(capsys, "--model=depth_cnn")
  assert (out["input_shape"], out["params"], out["flops"]) == (
    [28, 28, 1],
    223_658,
    43_409_856,
  )
  assert out["depth_tiers"] == [
    {
      "depth": 12,
      "params": 223_658,
      "flops": 43_409_856,
      "ratio": 1.0,
      "heterofl_widths": [32],
    },
    {
      "depth": 8,
      "params": 149_674,
      "flops": 28_959_168,
      "ratio": round(149_674 / 223_658, 4),
      "heterofl_widths": [26],
    },
    {
      "depth": 4,
      "params": 75_690,
      "flops": 14_508_480,
      "ratio": round(75_690 / 223_658, 4),
      "heterofl_widths": [19],
    },
  ]
  assert [l["name"] for l in out["layers"] if l["params"]][-3:] == [
    "block_12",
    "fc",
    "logits",
  ]
  assert "depth_tiers" not in _json(capsys, "--model=mlp", "--dataset=digits")


def test_depth_model_table_shows_blocks_and_tiers(capsys):
  lines = _run(capsys, "--model=depth_cnn").splitlines()
  assert lines[0] == "depth_cnn on 28x28x1 (mnist), 10 classes, depth 12"
  rows = {line.split()[0]: line.split()[1:] for line in lines[2:19]}
  # tests/models/depth_test.py by hand: stem 320 params, 56,448 MACs; a
  # block 18,496 params, 3,612,672 MACs.
  assert rows["stem_conv"] == ["Conv2D", "320", "0", "56,448"]
  assert rows["block_12"] == ["ResidualConvBlock", "18,496", "0", "3,612,672"]
  assert rows["total"] == ["223,658", "0", "43,409,856"]
  start = lines.index("depth tiers (embedding, block_1..block_L, head):")
  assert lines[start + 1].split() == [
    "depth",
    "params",
    "FLOPs",
    "(MACs)",
    "ratio",
    "HeteroFL",
    "widths",
  ]
  assert [line.split() for line in lines[start + 2 :]] == [
    ["12", "223,658", "43,409,856", "1.00", "32"],
    ["8", "149,674", "28,959,168", "0.67", "26"],
    ["4", "75,690", "14,508,480", "0.34", "19"],
  ]


def test_dataset_table_matches_the_data_sets():
  from tff_hetero import data  # pylint: disable=g-import-not-at-top

  assert set(describe.DATASET_SHAPES) == set(data.DATASETS)


CASES = [
  # (flags, text the one line must contain)
  ([], "--model is required"),
  (["--model=resnet9000"], "--model must be one of"),
  (["--model=mlp", "--format=xml"], "--format must be one of table, json"),
  (["--model=mlp", "--pool=bogus"], "--pool must be one of none"),
  (["--model=mlp", "--dataset=imagenet"], "--dataset must be one of"),
  (["--model=mlp", "--input_shape=8,x"], "--input_shape"),
  (["--model=mlp", "--input_shape=0,8,1"], "--input_shape"),
  (["--model=mlp", "--num_classes=1"], "--num_classes"),
  (["--model=vgg16", "--input_shape=16,16,3"], "at least 32x32"),
  (["--model=mnist_cnn", "--dataset=digits"], "at least 16x16"),
  (
    ["--model=vgg16", "--pool=adaptivefl", "--pool_ratios=0.4:0.66"],
    "--pool_ratios",
  ),
  (
    ["--model=vgg16", "--pool=adaptivefl", "--pool_ratios=1.5:0.4"],
    "--pool_ratios",
  ),
  (
    ["--model=vgg16", "--pool=adaptivefl", "--pool_ratios=0.66"],
    "--pool_ratios",
  ),
  (
    ["--model=vgg16", "--pool=adaptivefl", "--pool_ratios=a:b"],
    "--pool_ratios",
  ),
  (
    ["--model=vgg16", "--pool=adaptivefl", "--pool_start_indices=20:1"],
    "--pool_start_indices",
  ),
  (
    ["--model=vgg16", "--pool=adaptivefl", "--pool_start_indices=4:6:8"],
    "--pool_start_indices",
  ),
  (
    ["--model=vgg16", "--pool=adaptivefl", "--pool_start_indices=8:x"],
    "--pool_start_indices",
  ),
  (
    ["--model=mlp", "--pool=adaptivefl", "--pool_start_indices=-1"],
    "--pool_start_indices",
  ),
  (
    ["--model=mlp", "--pool=heterofl", "--heterofl_rates=0.5:0.25"],
    "--heterofl_rates",
  ),
  (
    ["--model=mlp", "--pool=heterofl", "--heterofl_rates=1:nan"],
    "--heterofl_rates",
  ),
  (
    ["--model=mlp", "--pool=adaptivefl", "--heterofl_rates=1:0.5"],
    "--heterofl_rates",
  ),
  (
    ["--model=mlp", "--pool=heterofl", "--pool_ratios=0.6:0.3"],
    "--pool_ratios",
  ),
  (["--model=mlp", "--pool_start_indices=0"], "--pool_start_indices"),
  (["--model=mlp", "extra"], "unexpected arguments"),
  (["--model=mlp", "--no_such_flag=1"], "no_such_flag"),
]


@pytest.mark.parametrize(
  "flags, expected", CASES, ids=[" ".join(c[0]) or "none" for c in CASES]
)
def test_bad_input_exits_2_with_one_line(flags, expected, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(describe.main, ["describe", *flags])
  assert exit_info.value.code == 2
  captured = capsys.readouterr()
  err = captured.err.strip().splitlines()
  assert len(err) == 1, err
  assert err[0].startswith("error: ")
  assert expected in err[0], err[0]
  assert not captured.out


def test_command_line_entry_point():
  # A real process: only this pipeline's flags exist there.
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "pipelines.describe",
      "--model=mnist_2nn",
      "--format=json",
    ],
    cwd=_ROOT,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert result.returncode == 0, result.stderr
  out = json.loads(result.stdout)
  assert (out["params"], out["flops"]) == (199_210, 198_800)
