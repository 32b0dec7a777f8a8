"""Every invalid flag value or combination exits 2 with one line naming the flag.

Run in process through the CLI's own entry point (`_cli.run_in_process`), so
the parsing, validation and error printing under test are the real ones; the
subprocess tests in `train_run_test.py` check the same path end to end.
"""

import os
import socket

import pytest

from pipelines import _cli
from pipelines import train

_BASE = [
  "train",
  "--dataset=synthetic",
  "--model=mlp",
  "--num_clients=6",
  "--clients_per_round=2",
  "--rounds=1",
  "--noprogress",
]


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


CASES = [
  # (extra flags, text the one line must contain)
  (["--algorithm=nope"], "--algorithm"),
  (["--dataset=nope"], "--dataset"),
  (["--model=nope"], "--model"),
  (["--partition=nope"], "--partition"),
  (["--augment=mixup"], "--augment"),
  (["--num_clients=0"], "--num_clients"),
  (["--clients_per_round=-1"], "--clients_per_round"),
  (["--rounds=0"], "--rounds"),
  (["--alpha=0"], "--alpha"),
  (["--alpha=-1"], "--alpha"),
  (["--num_clients=4", "--clients_per_round=5"], "--clients_per_round"),
  (["--batch_size=0"], "--batch_size"),
  (["--local_epochs=0"], "--local_epochs"),
  (["--client_lr=0"], "--client_lr"),
  (["--server_lr=nan"], "--server_lr"),
  (["--eval_every=0"], "--eval_every"),
  (["--checkpoint_every=0"], "--checkpoint_every"),
  (["--seed=-1"], "--seed"),
  (["--val_fraction=1.5"], "--val_fraction"),
  (["--algorithm=fedprox", "--prox_mu=-0.1"], "--prox_mu: must be"),
  (["--prox_mu=0.1"], "--prox_mu: is not a setting of --algorithm=fedavg"),
  (
    ["--algorithm=heterofl", "--pool_ratios=0.5:0.25"],
    "--pool_ratios: is not a setting of --algorithm=heterofl; it is read by"
    " adaptivefl, decoupled",
  ),
  (["--aggregator=median"], "--aggregator"),
  (["--aggregator=dp", "--clip_norm=1"], "--noise_multiplier"),
  (["--aggregator=clip"], "--clip_norm"),
  (["--aggregator=clip", "--clip_norm=-1"], "--clip_norm"),
  (["--clip_norm=1"], "--clip_norm"),
  (
    [
      "--algorithm=feddst",
      "--aggregator=clip",
      "--clip_norm=1",
    ],
    "--aggregator",
  ),
  (
    ["--algorithm=fednova", "--aggregator=clip", "--clip_norm=1"],
    "--aggregator",
  ),
  (["--algorithm=fednova", "--client_optimizer=adam"], "--client_optimizer"),
  (
    ["--algorithm=scaffold", "--client_momentum=0.9"],
    "--client_momentum: scaffold trains with plain SGD",
  ),
  (
    ["--algorithm=scaffold", "--aggregator=clip", "--clip_norm=1"],
    "--aggregator",
  ),
  (["--algorithm=spatl", "--val_fraction=0"], "--val_fraction"),
  (["--algorithm=spatl", "--spatl_budget=0"], "--spatl_budget"),
  (["--algorithm=spatl", "--spatl_episodes=0"], "--spatl_episodes"),
  (["--algorithm=spatl", "--spatl_salient_mean=all"], "--spatl_salient_mean"),
  (
    ["--algorithm=spatl", "--spatl_agent=/no/such/agent.npz"],
    "--spatl_agent",
  ),
  (
    ["--algorithm=spatl", "--client_momentum=0.9"],
    "--client_momentum: spatl trains with plain SGD",
  ),
  (["--executor=gpu"], "--executor"),
  (["--executor=remote"], "--workers"),
  (["--workers=127.0.0.1:5000"], "--workers"),
  (["--executor=remote", "--workers=nohostport"], "--workers"),
  (["--executor=remote", "--workers=127.0.0.1:70000"], "--workers"),
  (["--experiment_name=a/b"], "--experiment_name"),
  (["--rounds=abc"], "rounds"),
  (["--no_such_flag=1"], "no_such_flag"),
  (["--tiers=weak,weak"], "--tiers"),
  (["--tier_proportions=4:3"], "--tier_proportions"),
  (["--tier_proportions=4:x:3"], "--tier_proportions"),
  (["--tier_capacities=0:1:2"], "--tier_capacities"),
  (["--tier_availability=1.5"], "--tier_availability"),
  (["--tier_fluctuation=-1"], "--tier_fluctuation"),
  (["--partition=shards", "--shards_per_client=0"], "--shards_per_client"),
  (["--num_clients=500", "--clients_per_round=5"], "--num_clients"),
  (["--dataset=cifar10", "--model=cifar_cnn"], "cifar10"),
  (
    [
      "--dataset=mnist5k",
      "--model=mlp",
      "--num_clients=5000",
      "--clients_per_round=2",
      "--min_samples_per_client=1",
    ],
    "--num_clients",
  ),
  (["--dataset=digits", "--model=mnist_cnn"], "mnist_cnn"),
  (["--client_momentum=1"], "--client_momentum"),
  (
    ["--algorithm=decoupled", "--prune_min_start_index=-1"],
    "--prune_min_start_index: must be >= 1",
  ),
  (["--algorithm=adaptivefl", "--pool_ratios=0.4:0.66"], "--pool_ratios"),
  (["--algorithm=adaptivefl", "--pool_ratios=0.5"], "--pool_ratios"),
  (["--algorithm=adaptivefl", "--pool_ratios=a:b"], "--pool_ratios"),
  (["--algorithm=decoupled", "--pool_ratios=0.9:1.5"], "--pool_ratios"),
  (
    ["--algorithm=adaptivefl", "--pool_start_indices=5"],
    "--pool_start_indices",
  ),
  (
    ["--algorithm=adaptivefl", "--model=small_cnn", "--pool_start_indices=0:1"],
    "--pool_start_indices",
  ),
  (
    ["--algorithm=adaptivefl", "--adaptivefl_selection=best"],
    "--adaptivefl_selection",
  ),
  (["--algorithm=heterofl", "--heterofl_rates=0.5:1"], "--heterofl_rates"),
  (["--algorithm=heterofl", "--heterofl_rates=0:0.5:1"], "--heterofl_rates"),
  (
    [
      "--algorithm=heterofl",
      "--tiers=a,b",
      "--tier_proportions=1:1",
      "--tier_capacities=0.5:1",
      "--heterofl_rates=1:1",
    ],
    "--heterofl_rates",
  ),
  (
    ["--algorithm=adaptivefl", "--prune_min_start_index=0"],
    "--prune_min_start_index",
  ),
  (
    ["--algorithm=adaptivefl", "--pool_start_indices=2:1"],
    "--pool_start_indices",
  ),  # mnist_cnn: S1 11,910 > M2 10,760.
  (
    ["--algorithm=heterofl", "--tier_capacities=0.5:1.5:1"],
    "--tier_capacities",
  ),
  (["--algorithm=fedsgc", "--sparsity=1"], "--sparsity"),
  (["--algorithm=fedsgc", "--sparsity=-0.1"], "--sparsity"),
  (["--algorithm=feddst", "--readjust_every=-1"], "--readjust_every"),
  (["--algorithm=fedsgc", "--readjust_end_round=-5"], "--readjust_end_round"),
  (
    ["--algorithm=fedsgc", "--readjust_delta_epochs=-1"],
    "--readjust_delta_epochs",
  ),
  (["--algorithm=fedsgc", "--readjust_end_epoch=-2"], "--readjust_end_epoch"),
  (["--algorithm=fedsgc", "--sgc_memory=all"], "--sgc_memory"),
  (["--algorithm=fedsgc", "--client_optimizer=rmsprop"], "--client_optimizer"),
  (["--algorithm=heterofl", "--client_optimizer=adam"], "--client_optimizer"),
  (
    ["--algorithm=fedavg", "--client_optimizer=adam", "--client_momentum=0.9"],
    "--client_momentum",
  ),
  (
    ["--algorithm=prunefl", "--prunefl_initial_rounds=0"],
    "--prunefl_initial_rounds",
  ),
  (
    ["--algorithm=prunefl", "--prunefl_readjust_every=-1"],
    "--prunefl_readjust_every",
  ),
  (["--algorithm=fedsgc", "--prune_alpha=1.5"], "--prune_alpha"),
  (["--algorithm=fedsgc", "--congruity_lambda=-1"], "--congruity_lambda"),
  (["--algorithm=fedsgc", "--prox_mu=-1"], "--prox_mu"),
  (["--algorithm=fedgkt"], "--model"),
  (
    [
      "--algorithm=fedgkt",
      "--model=fedgkt_edge_resnet4",
      "--gkt_server_model=resnet56",
    ],
    "--gkt_server_model",
  ),
  (
    ["--algorithm=fedgkt", "--model=fedgkt_edge_resnet4", "--gkt_mode=later"],
    "--gkt_mode",
  ),
  (
    [
      "--algorithm=fedgkt",
      "--model=fedgkt_edge_resnet4",
      "--gkt_transfer=sideways",
    ],
    "--gkt_transfer",
  ),
  (
    [
      "--algorithm=fedgkt",
      "--model=fedgkt_edge_resnet4",
      "--gkt_server_order=sorted",
    ],
    "--gkt_server_order",
  ),
  (
    [
      "--algorithm=fedgkt",
      "--model=fedgkt_edge_resnet4",
      "--gkt_server_optimizer=rmsprop",
    ],
    "--gkt_server_optimizer",
  ),
  (
    [
      "--algorithm=fedgkt",
      "--model=fedgkt_edge_resnet4",
      "--gkt_temperature=0",
    ],
    "--gkt_temperature: must be",
  ),
  (
    ["--algorithm=fedgkt", "--model=fedgkt_edge_resnet4", "--gkt_server_lr=-1"],
    "--gkt_server_lr: must be",
  ),
  (
    [
      "--algorithm=fedgkt",
      "--model=fedgkt_edge_resnet4",
      "--gkt_client_kd_weight=-1",
    ],
    "--gkt_client_kd_weight: must be",
  ),
  (
    [
      "--algorithm=fedgkt",
      "--model=fedgkt_edge_resnet4",
      "--gkt_server_kd_weight=nan",
    ],
    "--gkt_server_kd_weight: must be",
  ),
  (
    [
      "--algorithm=fedgkt",
      "--model=fedgkt_edge_resnet4",
      "--gkt_server_epochs=0",
    ],
    "--gkt_server_epochs: must be",
  ),
  (["--upload_budgets_mib=10:x"], "--upload_budgets_mib"),
  (["--upload_budgets_mib=0"], "--upload_budgets_mib"),
]


@pytest.mark.parametrize(
  "extra,expected", CASES, ids=[" ".join(c[0]) for c in CASES]
)
def test_bad_input_exits_2_with_one_line(extra, expected, tmp_path, capsys):
  argv = (
    _BASE
    + [
      f"--root_output_dir={tmp_path}",
      f"--data_dir={tmp_path / 'no_tfds_here'}",
    ]
    + extra
  )
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(train.main, argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  assert err[0].startswith("error: ")
  assert expected in err[0]
  # Each case fails on its own check, not on a flag its algorithm ignores.
  assert ("is not a setting" in err[0]) == ("is not a setting" in expected)


def test_unexpected_positional_argument(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(
      train.main, _BASE + [f"--root_output_dir={tmp_path}", "stray"]
    )
  assert exit_info.value.code == 2
  assert "stray" in capsys.readouterr().err


def test_unreachable_worker_exits_2_naming_it(tmp_path, capsys):
  address = f"127.0.0.1:{_free_port()}"
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(
      train.main,
      _BASE
      + [
        f"--root_output_dir={tmp_path}",
        "--executor=remote",
        f"--workers={address}",
        "--worker_timeout_s=2",
      ],
    )
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--workers" in err[0] and address in err[0], err


def test_resume_without_checkpoint(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(
      train.main, _BASE + [f"--root_output_dir={tmp_path}", "--resume"]
    )
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--resume" in err[0], err


def test_existing_run_is_not_overwritten(tmp_path, capsys):
  run_dir = tmp_path / "experiment"
  run_dir.mkdir()
  metrics = run_dir / "metrics.csv"
  metrics.write_text("round,accuracy\n1,0.5\n")
  with pytest.raises(SystemExit) as exit_info:
    _cli.run_in_process(train.main, _BASE + [f"--root_output_dir={tmp_path}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--experiment_name" in err[0], err
  assert metrics.read_text() == "round,accuracy\n1,0.5\n"
  assert sorted(os.listdir(run_dir)) == ["metrics.csv"]
