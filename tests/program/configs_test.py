"""Settings classes, the flags generated from them, and flat configs."""

from absl import flags
import attrs
import pytest

from tff_hetero import settings as settings_lib
from tff_hetero.algorithms import registry
from tff_hetero.algorithms.sparse import fedsgc
from tff_hetero.errors import UsageError
from tff_hetero.program import ExperimentConfig
from tff_hetero.program import configs
from tff_hetero.program import evolve_config
from tff_hetero.program import loop
from tff_hetero.program import make_config


@attrs.frozen(kw_only=True)
class _Common:
  rounds: int = settings_lib.setting(10, "Rounds.")


@attrs.frozen(kw_only=True)
class _Toy(settings_lib.AlgorithmSettings):
  strength: float = settings_lib.setting(
    0.5, "Toy strength.", check=settings_lib.positive_float
  )
  mode: str = settings_lib.setting("a", "Toy mode.", choices=("a", "b"))
  names: tuple = settings_lib.setting(("x",), "Toy names.")
  on: bool = settings_lib.setting(True, "Toy switch.")


@attrs.frozen(kw_only=True)
class _OtherToy(settings_lib.AlgorithmSettings):
  strength: float = settings_lib.setting(
    0.5, "Toy strength.", check=settings_lib.positive_float
  )


def _flag_values(specs):
  flag_values = flags.FlagValues()
  settings_lib.define_flags(specs, flag_values, module_name="toy")
  return flag_values


def test_one_flag_per_setting_with_its_kind_help_and_readers():
  specs = settings_lib.flag_specs(_Common, {"toy": _Toy, "other": _OtherToy})
  assert list(specs) == ["rounds", "strength", "mode", "names", "on"]
  assert specs["rounds"].readers == ()
  assert specs["strength"].readers == ("toy", "other")
  flag_values = _flag_values(specs)
  flag_values(["prog", "--strength=2", "--mode=b", "--names=p,q", "--noon"])
  values, given = settings_lib.values_from_flags(flag_values, specs)
  assert values == dict(
    rounds=10, strength=2.0, mode="b", names=("p", "q"), on=False
  )
  assert given == {"strength", "mode", "names", "on"}
  help_text = flag_values.get_help()
  assert "Toy strength. [toy, other]" in help_text
  assert "<a|b>: Toy mode. [toy]" in help_text
  with pytest.raises(flags.IllegalFlagValueError, match=r"one of <a\|b>"):
    _flag_values(specs)(["prog", "--mode=c"])


def test_conflicting_definitions_of_one_flag_are_refused():
  @attrs.frozen(kw_only=True)
  class Stronger(settings_lib.AlgorithmSettings):
    strength: float = settings_lib.setting(0.9, "Toy strength.")

  with pytest.raises(ValueError, match="read by toy: default, checks differ"):
    settings_lib.flag_specs(_Common, {"toy": _Toy, "strong": Stronger})

  @attrs.frozen(kw_only=True)
  class Unchecked(settings_lib.AlgorithmSettings):
    strength: float = settings_lib.setting(0.5, "Toy strength.")

  with pytest.raises(ValueError, match="read by toy: checks differ"):
    settings_lib.flag_specs(_Common, {"toy": _Toy, "unchecked": Unchecked})

  # Checks built from parameters compare by their parameters.
  def bounded(high):
    @attrs.frozen(kw_only=True)
    class Bounded(settings_lib.AlgorithmSettings):
      share: float = settings_lib.setting(
        0.5,
        "Toy share.",
        check=settings_lib.optional(
          settings_lib.in_interval(0, high, closed_high=True)
        ),
      )

    return Bounded

  specs = settings_lib.flag_specs(_Common, {"a": bounded(1), "b": bounded(1)})
  assert specs["share"].readers == ("a", "b")
  with pytest.raises(ValueError, match="disagrees with the definition read"):
    settings_lib.flag_specs(_Common, {"a": bounded(1), "b": bounded(2)})

  @attrs.frozen(kw_only=True)
  class Shadow(settings_lib.AlgorithmSettings):
    rounds: int = settings_lib.setting(10, "Rounds.")

  with pytest.raises(ValueError, match="shadows the common setting"):
    settings_lib.flag_specs(_Common, {"shadow": Shadow})


def test_settings_check_their_values_naming_the_flag():
  assert _Toy(strength=1.0).strength == 1.0
  for kwargs, message in (
    (dict(strength=0.0), "--strength: must be a finite number > 0, got 0.0"),
    (dict(mode="c"), "--mode: unknown value 'c'; accepted: a, b"),
  ):
    with pytest.raises(UsageError, match=message):
      _Toy(**kwargs)


def test_every_registered_setting_is_a_flag_of_the_cli():
  specs = configs.flag_specs()
  for name, entry in registry.ALGORITHMS.items():
    for field in attrs.fields(entry.settings):
      assert name in specs[field.name].readers
  for field in attrs.fields(ExperimentConfig):
    if field.name != "settings":
      assert specs[field.name].readers == ()
  assert specs["sparsity"].readers == ("fedsgc", "feddst", "prunefl", "grasp")
  assert specs["gkt_server_model"].readers == ("fedgkt", "split_learning")
  assert specs["pool_ratios"].readers == ("adaptivefl", "decoupled")
  flag_values = flags.FlagValues()
  configs.define_flags(flag_values, module_name="train")
  flag_values(["train", "--algorithm=fedsgc", "--sgc_memory=none"])
  config = configs.config_from_flags(flag_values)
  assert isinstance(config.settings, fedsgc.FedSGCSettings)
  assert config.settings.sgc_memory == "none"
  assert config.settings.sparsity == 0.8


@pytest.mark.parametrize(
  "values, message",
  [
    (dict(algorithm="fedx"), "--algorithm: unknown value 'fedx'; accepted:"),
    (
      dict(sparsity=0.5),
      "--sparsity: is not a setting of --algorithm=fedavg; it is read by"
      " fedsgc, feddst, prunefl, grasp",
    ),
    (
      dict(algorithm="fedsgc", sparsity=1.0),
      r"--sparsity: must be in \[0, 1\), got 1.0",
    ),
    (
      dict(algorithm="fedsgc", sgc_memory="all"),
      "--sgc_memory: unknown value 'all'; accepted: models, updates, none",
    ),
    (dict(algorithm="fedprox", prox_mu=-1.0), "--prox_mu: must be a finite"),
    (
      dict(algorithm="fedgkt", gkt_lr_factor=0.0),
      r"--gkt_lr_factor: must be in \(0, 1\] \(1: never reduce\), got 0.0",
    ),
    (
      dict(algorithm="prunefl", prunefl_initial_rounds=0),
      "--prunefl_initial_rounds: must be a positive integer, got 0",
    ),
    (
      dict(algorithm="adaptivefl", prune_min_start_index=0),
      "--prune_min_start_index: must be >= 1",
    ),
  ],
)
def test_make_config_refuses_bad_settings_in_one_line(values, message):
  with pytest.raises(UsageError, match=message):
    make_config(**values)


@pytest.mark.parametrize(
  "values, message",
  [
    (
      dict(client_data="disk"),
      "--client_data: unknown value 'disk'; accepted: sent, files",
    ),
    (
      dict(client_data="files", client_data_dir="/nonexistent/client/files"),
      "--client_data_dir: '/nonexistent/client/files' is not a directory"
      " this user can write to",
    ),
    (
      dict(client_data_dir="/"),
      "--client_data_dir: only used with --client_data=files",
    ),
    (
      dict(executor="remote", workers=("localhost:1",), client_data="files"),
      "--client_data_dir: --client_data=files with --workers needs a"
      " directory every worker reads at the same path",
    ),
    (
      dict(executor="auto", workers=("localhost:1",), client_data="files"),
      "--client_data_dir: --client_data=files with --workers needs",
    ),
  ],
)
def test_client_data_settings_are_checked_in_one_line(values, message):
  with pytest.raises(UsageError, match=message):
    loop.validate_config(make_config(**values))


def test_how_client_data_travels_does_not_change_results(tmp_path):
  files = make_config(client_data="files", client_data_dir=str(tmp_path))
  assert loop.validate_config(files) is files
  # A resume may switch between the two.
  assert files.same_results_as(make_config(client_data="sent").fingerprint())
  assert not files.same_results_as(make_config(seed=1).fingerprint())


def test_flat_settings_round_trip_and_carry_over():
  config = make_config(algorithm="fedsgc", sparsity=0.6, rounds=3)
  flat = config.to_json_dict()
  assert flat["sparsity"] == 0.6 and flat["rounds"] == 3
  assert "settings" not in flat and "gkt_mode" not in flat
  assert make_config(**flat) == config  # `workers` comes back a tuple.
  assert make_config(workers=["h:1"]).workers == ("h:1",)
  feddst = evolve_config(config, algorithm="feddst", readjust_every=2)
  assert feddst.settings.sparsity == 0.6
  assert feddst.settings.readjust_every == 2
  fedavg = evolve_config(feddst, algorithm="fedavg")
  assert fedavg.settings == settings_lib.AlgorithmSettings()
  assert evolve_config(fedavg, algorithm="feddst").settings.sparsity == 0.8


def test_values_of_every_flag_keep_only_the_algorithms_settings():
  values = dict(algorithm="feddst", rounds=3, sparsity=0.7, gkt_mode="async")
  config = configs.config_from_values(values, given={"rounds", "sparsity"})
  assert config.settings.sparsity == 0.7 and config.rounds == 3
  with pytest.raises(UsageError, match="--gkt_mode: is not a setting of"):
    configs.config_from_values(values, given={"gkt_mode"})


def test_a_config_whose_settings_are_not_its_algorithms_is_refused():
  config = ExperimentConfig(algorithm="fedsgc")
  with pytest.raises(UsageError, match="--algorithm: fedsgc reads"):
    loop.validate_config(config)
  assert loop.validate_config(make_config(algorithm="fedsgc"))


def test_a_new_algorithm_is_one_settings_class_and_one_register_line():
  registry.register("toy", lambda config, task, ids: None, "toy", settings=_Toy)
  try:
    specs = configs.flag_specs()
    assert specs["mode"].readers == ("toy",)
    assert make_config(algorithm="toy", mode="b").settings == _Toy(mode="b")
  finally:
    del registry.ALGORITHMS["toy"]
  assert "mode" not in configs.flag_specs()
  with pytest.raises(TypeError, match="AlgorithmSettings subclass"):
    registry.register("bad", lambda *a: None, "bad", settings=dict)


def test_an_algorithms_own_defaults_apply_unless_a_value_is_given():
  # InclusiveFL's registry entry defaults the model, tier shares, server lr.
  config = configs.make_config(algorithm="inclusivefl")
  assert (config.model, config.tier_proportions, config.server_lr) == (
    "transformer",
    "1:1:1",
    0.003,
  )
  assert configs.make_config(algorithm="fedavg").model == "mnist_cnn"
  assert (
    configs.make_config(algorithm="inclusivefl", model="depth_cnn").model
    == "depth_cnn"
  )
  # Every flag's value, as the CLI passes them: the model at its default.
  values = {
    name: spec.field.default for name, spec in configs.flag_specs().items()
  }
  values["algorithm"] = "inclusivefl"
  assert configs.config_from_values(values, given=set()).model == "transformer"
  values["model"] = "depth_cnn"
  assert (
    configs.config_from_values(values, given={"model"}).model == "depth_cnn"
  )
