"""`--profile_rounds`: the trace holds the rounds asked for, and no other.

A real run (synthetic data, MLP, three rounds) with `profile_rounds=1`
profiles round 2 only: its trace, where TensorBoard reads it, holds one
call of the program's per-round cohort building, round 2's callback and
neither round 1's nor round 3's (whose evaluation is absent too). `RoundProfiler` starts and
stops on the rounds it is given, and stops when the run ends early.
"""

import collections
import glob
import os

import pytest
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from tff_hetero.errors import UsageError
from tff_hetero.program import loop
from tff_hetero.program import make_config
from tff_hetero.program import profiling


def _traces(directory):
  return sorted(
    glob.glob(os.path.join(directory, "plugins/profile/*/*.xplane.pb"))
  )


def _python_calls(trace) -> collections.Counter:
  """Python tracer events by function name (`$file:line name` -> name)."""
  space = xplane_pb2.XSpace()
  with open(trace, "rb") as f:
    space.ParseFromString(f.read())
  calls = collections.Counter()
  for plane in space.planes:
    for line in plane.lines:
      for event in line.events:
        name = plane.event_metadata[event.metadata_id].name
        if name.startswith("$"):
          calls[name.rsplit(" ", 1)[-1]] += 1
  return calls


def round_1_done():
  pass


def round_2_done():
  pass


def round_3_done():
  pass


@pytest.mark.slow
def test_a_run_traces_the_rounds_asked_for(tmp_path):
  marks = {1: round_1_done, 2: round_2_done, 3: round_3_done}
  result = loop.run_experiment(
    make_config(
      dataset="synthetic",
      model="mlp",
      num_clients=6,
      clients_per_round=2,
      rounds=3,
      batch_size=10,
      profile_rounds=1,
      eval_every=3,
      checkpoint_every=3,
      progress=False,
      root_output_dir=str(tmp_path),
      experiment_name="profiled",
    ),
    on_round=lambda round_num, row: marks[round_num](),
  )
  (trace,) = _traces(os.path.join(result.experiment_dir, "tensorboard"))
  calls = _python_calls(trace)
  # Round 2 of three, and only it: one cohort built, round 2's mark and
  # neither of the others', no evaluation or checkpoint (round 3's).
  assert calls["_round_clients"] == 1
  assert calls["round_2_done"] == 1
  assert calls["round_1_done"] == 0 and calls["round_3_done"] == 0
  assert calls["_evaluate"] == 0
  assert calls["invoke"] >= 1  # The wait in TFF's call is in the trace.


def test_round_profiler_starts_and_stops_on_its_rounds(tmp_path):
  profiler = profiling.RoundProfiler(str(tmp_path), rounds=2, first_round=3)
  profiler.round_starts(2)
  assert not profiler.active
  profiler.round_starts(3)
  assert profiler.active
  profiler.round_ended(3)
  assert profiler.active
  profiler.round_starts(4)
  profiler.round_ended(4)
  assert not profiler.active
  assert len(_traces(str(tmp_path))) == 1
  # None asked for: nothing starts; a run ending early still writes.
  none = profiling.RoundProfiler(
    str(tmp_path / "none"), rounds=0, first_round=1
  )
  none.round_starts(1)
  assert not none.active
  early = profiling.RoundProfiler(
    str(tmp_path / "early"), rounds=5, first_round=1
  )
  early.round_starts(1)
  early.close()
  assert not early.active
  assert len(_traces(str(tmp_path / "early"))) == 1


def test_a_negative_count_is_refused_with_the_flag_named():
  with pytest.raises(UsageError, match="--profile_rounds"):
    make_config(profile_rounds=-1)
