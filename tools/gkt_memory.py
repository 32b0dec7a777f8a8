r"""Resident memory of a FedGKT run, the driver and its TFF worker apart.

  python tools/gkt_memory.py [ROUNDS] [sync|async]

Runs `tools/bench.py --suite=gkt`'s configuration (mnist5k, ResNet-8 edge,
ResNet-19 server, 20 IID clients, cohort 4, one epoch) for ROUNDS rounds
(default 50) and prints the driver's and the worker's resident memory
(MiB) at rounds 1-3 and every fifth round, then the growth of each from
round 10 to the last round (%). The last round also evaluates the model,
which raises the driver's reading.
"""

from __future__ import annotations

import json
import sys
import tempfile

import psutil

from tff_hetero.runtime import heap

# Before TensorFlow starts its threads, as the CLI entry points do (heap.py).
heap.configure_process_heap()


def main() -> None:
  from tff_hetero.program import loop  # pylint: disable=g-import-not-at-top
  from tff_hetero.program import make_config  # pylint: disable=g-import-not-at-top

  rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 50
  mode = sys.argv[2] if len(sys.argv) > 2 else "sync"
  readings = {}

  def record(round_num, row):
    me = psutil.Process()
    worker = sum(
      child.memory_info().rss for child in me.children(recursive=True)
    )
    readings[round_num] = (me.memory_info().rss / 2**20, worker / 2**20)
    if round_num <= 3 or round_num % 5 == 0:
      print(
        f"round {round_num}: driver {readings[round_num][0]:.1f} MiB,"
        f" worker {readings[round_num][1]:.1f} MiB,"
        f" clients {row.get('clients')}",
        flush=True,
      )

  with tempfile.TemporaryDirectory() as root:
    loop.run_experiment(
      make_config(
        algorithm="fedgkt",
        dataset="mnist5k",
        model="fedgkt_edge_resnet8",
        gkt_server_model="fedgkt_server_resnet19",
        partition="iid",
        num_clients=20,
        clients_per_round=4,
        local_epochs=1,
        batch_size=20,
        client_lr=0.05,
        seed=0,
        checkpoint_every=10**6,
        progress=False,
        rounds=rounds,
        eval_every=10**6,
        gkt_mode=mode,
        root_output_dir=root,
        experiment_name="gkt",
      ),
      on_round=record,
    )
  (d0, w0), (d1, w1) = readings[10], readings[rounds]
  print(
    json.dumps(
      dict(
        driver_growth_pct=round(100 * (d1 - d0) / d0, 1),
        worker_growth_pct=round(100 * (w1 - w0) / w0, 1),
        total_growth_pct=round(100 * (d1 + w1 - d0 - w0) / (d0 + w0), 1),
      )
    )
  )


if __name__ == "__main__":
  main()
