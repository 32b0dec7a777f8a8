r"""Describe a model: parameters and forward MACs, whole or as a sub-model pool.

  python -m pipelines.describe --model=mnist_cnn
  python -m pipelines.describe --model=vgg16 --pool=adaptivefl
  python -m pipelines.describe --model=resnet20 --pool=heterofl --format=json

Nothing is trained and no data are loaded: the input shape and the number of
classes come from `--dataset` (default cifar10, 32x32x3 and 10 classes, for
the models the registry marks as meant for CIFAR images: the ResNets, VGGs,
`cifar_cnn` and FedGKT's; mnist, 28x28x1 and 10 classes, otherwise) or from
`--input_shape` / `--num_classes`. Models on token ids (`text_transformer`)
default to glue_sst2: 64 tokens, 2 classes, and the registry's default
vocabulary of 20,000 ids (the GLUE loader's cap; its embedding dominates
the parameters).

`--pool=none` prints the model's parameters (trainable: batch-norm gamma/beta
counted, running statistics not), non-trainable weights and forward MACs per
example, layer by layer (`--format=table`; layers without weights and MACs
are left out) or as one JSON object with keys `params`, `non_trainable`,
`flops`, `training_flops_per_example` and `layers`. "FLOPs" here are MACs, as
FL papers report them (`tff_hetero/models/counting.py`).

A model that is cut between a device and a server (FedGKT's edge models:
registry `split_layer`) also reports its extractor, the part up to the
split whose output the device sends (JSON: `split_layer`,
`extractor_params`, `extractor_flops`), and its size against the full models
of its family (`full_model_ratios`: per full model its `params`, `flops`,
`params_ratio` and `flops_ratio`, full / edge; for the official code's
`fedgkt_edge_resnet8_bottleneck` also FedGKT's printed figures,
`paper_params_ratio` and `paper_flops_ratio`, 54x / 105x and 9x / 17x
against ResNet-56 / ResNet-110, and `paper_params`, "11K").

A depth-scalable model (registry `depths`: `transformer`, `depth_cnn`;
InclusiveFL's tiers) is described at its deepest tier (the title says which
depth), followed by one row per tier, deepest first: depth, params, FLOPs
(MACs), size ratio to the deepest (params) and the HeteroFL widths, those at
which the deepest model has about the tier's parameters
(`models.depth_matched_widths`: unit 1 narrowed, InclusiveFL's HeteroFL
baseline); JSON: `depth_tiers`, a list of objects with keys `depth`,
`params`, `flops`, `ratio` and `heterofl_widths`.

`--pool=adaptivefl` (ratios `--pool_ratios=M:S`, start indices
`--pool_start_indices`, default the model's) and `--pool=heterofl` (uniform
rates `--heterofl_rates`) print one row per pool member in the order of
AdaptiveFL's Table 1 (largest first): level, r_w, I, params, FLOPs (MACs) and
size ratio to the full model (params); `--format=json` prints a list of
objects with keys `level`, `r_w`, `I`, `params`, `flops`, `ratio`, `widths`
and `index` (the member's position in the pool, smallest first). For vgg16 on
32x32x3 with 10 classes and the paper's settings, the paper's Table 1 figures
are shown beside ours (`paper_params`, `paper_flops` in JSON); its FLOPs are
thop counts, which equal our MACs plus 3 x the batch-norm outputs
(`tff_hetero/models/vgg.py`).

Bad flags exit with status 2 and one line naming the flag.
"""

from __future__ import annotations

import functools
import json
import math
import sys

from absl import flags

from pipelines import _cli

# Data sets of `tff_hetero.data` -> (input shape, classes), so that nothing
# is loaded. Kept equal to `tff_hetero.data.DATASETS` by a test.
DATASET_SHAPES = {
  "mnist5k": ((28, 28, 1), 10),
  "digits": ((8, 8, 1), 10),
  "synthetic": ((8, 8, 1), 10),
  "mnist": ((28, 28, 1), 10),
  "emnist": ((28, 28, 1), 47),
  "cifar10": ((32, 32, 3), 10),
  "cifar100": ((32, 32, 3), 100),
  "cinic10": ((32, 32, 3), 10),
  # GLUE: 64 token ids per example (the loader's default seq_len); the
  # vocabulary (rows of the token embedding) is the registry's default.
  **{
    f"glue_{task}": ((64,), 3 if task == "mnli" else 2)
    for task in ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2")
  },
}
POOLS = ("none", "adaptivefl", "heterofl")
FORMATS = ("table", "json")
DEFAULT_RATIOS = "0.66:0.4"
DEFAULT_HETEROFL_RATES = "1:0.5:0.25"
_PAPER_SETTINGS = ("vgg16", (32, 32, 3), 10, (0.66, 0.4), (8, 6, 4))


def _shared_string(
  name: str, default: str | None, help_text: str
) -> flags.FlagHolder:
  """A string flag that `pipelines.train` may define too.

  absl keeps one global set of flags, so when both pipelines are imported in
  one process (tests, notebooks) they share the flag object; this pipeline
  reads a shared flag only when it is given on the command line (`present`)
  and otherwise applies its own default, so which definition won does not
  matter.
  """
  if name in flags.FLAGS:
    return flags.FlagHolder(flags.FLAGS, flags.FLAGS[name])
  return flags.DEFINE_string(name, default, help_text, allow_override=True)


_MODEL = _shared_string("model", None, "Model registry name (required).")
_DATASET = _shared_string(
  "dataset",
  None,
  "Data set whose input shape and classes to use (nothing is loaded):"
  f" {', '.join(DATASET_SHAPES)}. Default: cifar10 for the models meant"
  " for CIFAR images (ResNets, VGGs, cifar_cnn, FedGKT's), mnist otherwise.",
)
_INPUT_SHAPE = flags.DEFINE_string(
  "input_shape",
  None,
  "Input shape of one example, e.g. 32,32,3 (overrides --dataset).",
)
_NUM_CLASSES = flags.DEFINE_integer(
  "num_classes", None, "Number of classes (overrides --dataset)."
)
_POOL = flags.DEFINE_string(
  "pool", "none", f"Sub-model pool: {', '.join(POOLS)}."
)
_POOL_RATIOS = _shared_string(
  "pool_ratios",
  DEFAULT_RATIOS,
  "AdaptiveFL pool: width ratios of the M and S levels, M:S.",
)
_POOL_STARTS = _shared_string(
  "pool_start_indices",
  "",
  "AdaptiveFL pool: start indices I_1:I_2:..., decreasing (default: the"
  " model's, e.g. 8:6:4 for vgg16).",
)
_HETEROFL_RATES = _shared_string(
  "heterofl_rates",
  DEFAULT_HETEROFL_RATES,
  "HeteroFL pool: width rates, colon-separated, including 1.",
)
_FORMAT = flags.DEFINE_string(
  "format", "table", f"Output: {', '.join(FORMATS)}."
)


def _given(holder: flags.FlagHolder, default: str | None) -> str | None:
  """The flag's value if given on the command line, else our default."""
  return holder.value if holder.present else default


def _numbers(flag: str, text: str, kind: type, what: str) -> tuple:
  parts = str(text).split(":")
  try:
    values = tuple(kind(p.strip()) for p in parts)
  except ValueError:
    values = ()
  if not values or any(
    isinstance(v, float) and not math.isfinite(v) for v in values
  ):
    _cli.fail(f"--{flag} must be {what} separated by ':', got {text!r}")
  return values


# The data set whose shape describes a model by default, by the kind of
# images its registry entry says it is meant for.
_DEFAULT_DATASET_FOR_IMAGES = {
  "cifar": "cifar10",
  "mnist": "mnist",
  "text": "glue_sst2",
}


def _default_dataset(model: str) -> str:
  from tff_hetero import models  # pylint: disable=g-import-not-at-top

  return _DEFAULT_DATASET_FOR_IMAGES[models.MODELS[model].images]


def _input(model: str) -> tuple[str, tuple[int, ...], int]:
  """(where the shape comes from, input shape, classes) from the flags."""
  dataset = _given(_DATASET, None)
  if dataset is not None and dataset not in DATASET_SHAPES:
    _cli.fail(
      f"--dataset must be one of {', '.join(DATASET_SHAPES)}, got {dataset!r}"
    )
  source = dataset or _default_dataset(model)
  shape, classes = DATASET_SHAPES[source]
  if _INPUT_SHAPE.value is not None:
    text = _INPUT_SHAPE.value
    try:
      shape = tuple(int(d) for d in text.split(","))
    except ValueError:
      shape = ()
    if not shape or min(shape) < 1:
      _cli.fail(
        f"--input_shape must be positive integers separated by ',',"
        f" e.g. 32,32,3, got {text!r}"
      )
    source = "--input_shape" if dataset is None else f"{source}, --input_shape"
  if _NUM_CLASSES.value is not None:
    classes = _NUM_CLASSES.value
    if classes < 2:
      _cli.fail(f"--num_classes must be an integer >= 2, got {classes}")
  return source, shape, classes


@functools.lru_cache(maxsize=64)
def _costs(
  model: str,
  shape: tuple[int, ...],
  classes: int,
  widths: tuple[int, ...] | None,
  depth: int | None = None,
):
  """(ParamCount, [LayerCost]) of one (sub-)model; built once per process."""
  from tff_hetero import models  # pylint: disable=g-import-not-at-top

  keras_model = models.build_model(
    model, shape, classes, seed=0, widths=widths, depth=depth
  )
  return models.count_params(keras_model), tuple(
    models.layer_costs(keras_model)
  )


def _pool(model: str, shape: tuple[int, ...], classes: int):
  """(pool, its settings for the header, paper rows or None)."""
  from tff_hetero import models  # pylint: disable=g-import-not-at-top
  from tff_hetero.models import vgg  # pylint: disable=g-import-not-at-top
  from tff_hetero.submodels import pools  # pylint: disable=g-import-not-at-top

  kind = _POOL.value
  units = models.width_units(model, shape, classes)
  if kind == "adaptivefl":
    if _HETEROFL_RATES.present:
      _cli.fail("--heterofl_rates applies to --pool=heterofl only")
    ratios = _numbers(
      "pool_ratios",
      _given(_POOL_RATIOS, DEFAULT_RATIOS),
      float,
      "two width ratios M:S",
    )
    if len(ratios) != 2:
      _cli.fail(
        f"--pool_ratios must be two width ratios M:S, got"
        f" {_POOL_RATIOS.value!r}"
      )
    starts_text = _given(_POOL_STARTS, "")
    if starts_text:
      starts = _numbers(
        "pool_start_indices", starts_text, int, "integer start indices"
      )
    else:
      starts = models.MODELS[model].default_start_indices
    try:
      pool = pools.adaptivefl_pool(units, ratios[0], ratios[1], starts)
    except models.ModelError as e:
      flag = (
        "--pool_start_indices" if "start ind" in str(e) else "--pool_ratios"
      )
      _cli.fail(f"{flag}: {e}")
    paper = None
    if (model, shape, classes, ratios, tuple(starts)) == _PAPER_SETTINGS:
      paper = {row.level: row for row in vgg.ADAPTIVEFL_VGG16_TABLE1}
    settings = (
      f"AdaptiveFL pool, r_M={ratios[0]:g}, r_S={ratios[1]:g},"
      f" I={':'.join(map(str, starts))}"
    )
    return pool, settings, paper
  for flag in (_POOL_RATIOS, _POOL_STARTS):
    if flag.present:
      _cli.fail(f"--{flag.name} applies to --pool=adaptivefl only")
  rates = _numbers(
    "heterofl_rates",
    _given(_HETEROFL_RATES, DEFAULT_HETEROFL_RATES),
    float,
    "width rates",
  )
  try:
    pool = pools.uniform_pool(units, rates)
  except models.ModelError as e:
    _cli.fail(f"--heterofl_rates: {e}")
  return pool, f"HeteroFL pool, rates {':'.join(f'{r:g}' for r in rates)}", None


def _pool_rows(
  model: str, shape: tuple[int, ...], classes: int
) -> tuple[str, list[dict]]:
  pool, settings, paper = _pool(model, shape, classes)
  full_params = _costs(model, shape, classes, None)[0].trainable
  rows = []
  for member in reversed(pool.members):  # Table 1 order: largest first
    params, layers = _costs(model, shape, classes, member.widths)
    row = {
      "level": member.level,
      "r_w": member.ratio,
      "I": member.start_index,
      "params": params.trainable,
      "flops": sum(r.macs for r in layers),
      "ratio": round(params.trainable / full_params, 4),
      "widths": list(member.widths),
      "index": member.index,
    }
    if paper is not None:
      row["paper_params"] = round(paper[member.level].params_m * 1e6)
      row["paper_flops"] = round(paper[member.level].flops_m * 1e6)
    rows.append(row)
  return settings, rows


def _table(header: tuple[str, ...], rows: list[tuple], right: set[int]) -> str:
  cells = [header] + [tuple(str(c) for c in row) for row in rows]
  sizes = [max(len(row[i]) for row in cells) for i in range(len(header))]
  lines = []
  for row in cells:
    lines.append(
      "  ".join(
        c.rjust(sizes[i]) if i in right else c.ljust(sizes[i])
        for i, c in enumerate(row)
      ).rstrip()
    )
  return "\n".join(lines)


@functools.lru_cache(maxsize=16)
def _extractor_costs(model: str, shape: tuple[int, ...], classes: int):
  """(ParamCount, MACs) of the model up to its split layer."""
  from tff_hetero import models  # pylint: disable=g-import-not-at-top
  from tff_hetero.models import fedgkt  # pylint: disable=g-import-not-at-top

  keras_model = models.build_model(model, shape, classes, seed=0)
  extractor = fedgkt.extractor(keras_model, models.split_layer(model))
  return models.count_params(extractor), models.count_flops(extractor)


def _split(model: str, shape: tuple[int, ...], classes: int) -> dict:
  """The extractor and the ratios of a split model (module docstring)."""
  from tff_hetero import models  # pylint: disable=g-import-not-at-top
  from tff_hetero.models import fedgkt  # pylint: disable=g-import-not-at-top

  params, layers = _costs(model, shape, classes, None)
  macs = sum(r.macs for r in layers)
  extractor_params, extractor_macs = _extractor_costs(model, shape, classes)
  out = {
    "split_layer": models.split_layer(model),
    "extractor_params": extractor_params.trainable,
    "extractor_flops": extractor_macs,
    "full_model_ratios": [],
  }
  if model in fedgkt.PAPER_EDGE_PARAMS:
    out["paper_params"] = fedgkt.PAPER_EDGE_PARAMS[model]
  for full in fedgkt.COMPARED_FULL_MODELS.get(fedgkt.family(model), ()):
    full_params, full_layers = _costs(full, shape, classes, None)
    full_macs = sum(r.macs for r in full_layers)
    row = {
      "model": full,
      "params": full_params.trainable,
      "flops": full_macs,
      "params_ratio": round(full_params.trainable / params.trainable, 2),
      "flops_ratio": round(full_macs / macs, 2),
    }
    paper = fedgkt.PAPER_RATIOS.get((model, full))
    if paper is not None:
      row["paper_params_ratio"], row["paper_flops_ratio"] = paper
    out["full_model_ratios"].append(row)
  return out


def _depth_rows(model: str, shape: tuple[int, ...], classes: int) -> list:
  """One row per depth tier, deepest first (module docstring)."""
  from tff_hetero import models  # pylint: disable=g-import-not-at-top

  tiers = models.MODELS[model].depths
  deepest = _costs(model, shape, classes, None, tiers[-1])[0].trainable
  rows = []
  for depth in reversed(tiers):
    params, layers = _costs(model, shape, classes, None, depth)
    rows.append(
      {
        "depth": depth,
        "params": params.trainable,
        "flops": sum(r.macs for r in layers),
        "ratio": round(params.trainable / deepest, 4),
        "heterofl_widths": list(
          models.depth_matched_widths(model, shape, classes, depth)
        ),
      }
    )
  return rows


def _print_depth_rows(rows: list[dict]) -> None:
  print("depth tiers (embedding, block_1..block_L, head):")
  table = [
    (
      row["depth"],
      f"{row['params']:,}",
      f"{row['flops']:,}",
      f"{row['ratio']:.2f}",
      ":".join(map(str, row["heterofl_widths"])),
    )
    for row in rows
  ]
  print(
    _table(
      ("depth", "params", "FLOPs (MACs)", "ratio", "HeteroFL widths"),
      table,
      {0, 1, 2, 3},
    )
  )


def _print_model(model: str, title: str, shape, classes, as_json: bool) -> None:
  from tff_hetero import models  # pylint: disable=g-import-not-at-top

  tiers = models.MODELS[model].depths
  params, layers = _costs(
    model, shape, classes, None, tiers[-1] if tiers else None
  )
  macs = sum(r.macs for r in layers)
  split = (
    _split(model, shape, classes) if models.MODELS[model].split_layer else None
  )
  depth_rows = _depth_rows(model, shape, classes) if tiers else None
  if as_json:
    print(
      json.dumps(
        {
          "model": model,
          "input_shape": list(shape),
          "num_classes": classes,
          "params": params.trainable,
          "non_trainable": params.non_trainable,
          "flops": macs,
          "training_flops_per_example": models.TRAINING_MACS_MULTIPLIER * macs,
          **(split or {}),
          **({"depth_tiers": depth_rows} if depth_rows else {}),
          "layers": [
            {
              "name": r.name,
              "kind": r.kind,
              "params": r.params,
              "non_trainable": r.non_trainable,
              "flops": r.macs,
            }
            for r in layers
          ],
        }
      )
    )
    return
  print(title + (f", depth {tiers[-1]}" if tiers else ""))
  rows = [
    (r.name, r.kind, f"{r.params:,}", f"{r.non_trainable:,}", f"{r.macs:,}")
    for r in layers
    if r.params or r.non_trainable or r.macs
  ]
  rows.append(
    (
      "total",
      "",
      f"{params.trainable:,}",
      f"{params.non_trainable:,}",
      f"{macs:,}",
    )
  )
  print(
    _table(
      ("layer", "kind", "params", "non-trainable", "MACs"), rows, {2, 3, 4}
    )
  )
  print(
    f"params {params.trainable:,} (non-trainable {params.non_trainable:,});"
    f" forward MACs per example {macs:,}; training"
    f" {models.TRAINING_MACS_MULTIPLIER} x {macs:,} ="
    f" {models.TRAINING_MACS_MULTIPLIER * macs:,}"
  )
  if depth_rows:
    _print_depth_rows(depth_rows)
  if split is None:
    return
  paper = (
    f" (paper: about {split['paper_params']:,})"
    if "paper_params" in split
    else ""
  )
  print(
    f"extractor (up to {split['split_layer']}, its output goes to the"
    f" server): params {split['extractor_params']:,}, forward MACs"
    f" {split['extractor_flops']:,}; the whole edge model: params"
    f" {params.trainable:,}{paper}"
  )
  for row in split["full_model_ratios"]:
    paper = ""
    if "paper_params_ratio" in row:
      paper = (
        f" (paper: {row['paper_params_ratio']}x and"
        f" {row['paper_flops_ratio']}x)"
      )
    print(
      f"{row['model']} ({row['params']:,} params, {row['flops']:,} MACs)"
      f" / {model}: params {row['params_ratio']:.2f}x, forward MACs"
      f" {row['flops_ratio']:.2f}x{paper}"
    )


def _print_pool(
  title: str, settings: str, rows: list[dict], as_json: bool
) -> None:
  if as_json:
    print(json.dumps(rows))
    return
  print(f"{title}: {settings}")
  paper = "paper_params" in rows[0]
  header = ("level", "r_w", "I", "params", "FLOPs (MACs)", "ratio")
  if paper:
    header += ("paper params", "paper FLOPs")
  table = []
  for row in rows:
    cells = (
      row["level"],
      f"{row['r_w']:.2f}",
      row["I"],
      f"{row['params']:,}",
      f"{row['flops']:,}",
      f"{row['ratio']:.2f}",
    )
    if paper:
      cells += (
        f"{row['paper_params'] / 1e6:.2f}M",
        f"{row['paper_flops'] / 1e6:.2f}M",
      )
    table.append(cells)
  print(_table(header, table, {1, 2, 3, 4, 5, 6, 7}))
  if paper:
    print(
      "paper: AdaptiveFL (DAC 2024) Table 1; its FLOPs are thop counts,"
      " our MACs + 3 x batch-norm outputs (tff_hetero/models/vgg.py)"
    )


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _cli.fail(f"unexpected arguments: {' '.join(argv[1:])}")
  if _FORMAT.value not in FORMATS:
    _cli.fail(
      f"--format must be one of {', '.join(FORMATS)}, got {_FORMAT.value!r}"
    )
  if _POOL.value not in POOLS:
    _cli.fail(f"--pool must be one of {', '.join(POOLS)}, got {_POOL.value!r}")
  if not _MODEL.present or not _MODEL.value:
    _cli.fail("--model is required (a model registry name)")
  from tff_hetero import models  # pylint: disable=g-import-not-at-top

  model = _MODEL.value
  if model not in models.MODELS:
    _cli.fail(
      f"--model must be one of {', '.join(models.model_names())}, got {model!r}"
    )
  source, shape, classes = _input(model)
  title = (
    f"{model} on {'x'.join(map(str, shape))} ({source}), {classes} classes"
  )
  as_json = _FORMAT.value == "json"
  try:
    if _POOL.value == "none":
      for flag in (_POOL_RATIOS, _POOL_STARTS, _HETEROFL_RATES):
        if flag.present:
          _cli.fail(f"--{flag.name} needs --pool=adaptivefl or heterofl")
      _print_model(model, title, shape, classes, as_json)
    else:
      settings, rows = _pool_rows(model, shape, classes)
      _print_pool(title, settings, rows, as_json)
  except models.ModelError as e:
    given = (
      f"--input_shape={_INPUT_SHAPE.value}"
      if _INPUT_SHAPE.value is not None
      else f"--dataset={source}"
    )
    _cli.fail(f"--model={model} with {given}: {e}")
  sys.stdout.flush()


if __name__ == "__main__":
  _cli.run_main(main)
