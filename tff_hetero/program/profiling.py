"""`--profile_rounds`: a TensorBoard profiler trace of some rounds of a run.

`RoundProfiler(directory, rounds, first_round)` starts TensorFlow's profiler
(`tf.profiler.experimental`, host tracer level 2 and the Python tracer)
before round `first_round` and stops it after `rounds` rounds, or when the
run ends sooner (interrupted included: `close` in the program's `finally`),
writing `<directory>/plugins/profile/<timestamp>/*.xplane.pb`, which
TensorBoard's Profile tab reads (`tensorboard --logdir
<experiment dir>/tensorboard`, beside the run's scalars).

The program profiles from the second round the process runs: the first
traces and builds every computation (cold start, reported apart by
`tools/bench.py --suite=coldstart`); a run with one round left profiles
that one.

What the trace holds: the driver process, i.e. the program around each
round (cohort sampling, client datasets, the algorithm's Python, the
ledger, metrics release, checkpoints) as Python and host events, and the
TensorFlow ops the driver runs itself. The round's TFF computations run in
the TFF worker process (TFF's C++ worker binary, which has no profiler
service), so in the trace they are the time the driver waits inside TFF's
call (`sync_execution_context.invoke`); `tools/bench.py` times them.
"""

from __future__ import annotations

from absl import logging
import tensorflow as tf

__all__ = ["RoundProfiler"]


class RoundProfiler:
  """Profiles rounds `first_round` .. `first_round + rounds - 1` (none if
  `rounds` is 0) into `directory` (module docstring)."""

  def __init__(self, directory: str, rounds: int, first_round: int):
    if rounds < 0:
      raise ValueError(f"rounds must be >= 0, got {rounds}")
    self.directory = directory
    self.first_round = int(first_round)
    self.last_round = int(first_round) + int(rounds) - 1
    self._active = False

  @property
  def active(self) -> bool:
    return self._active

  def round_starts(self, round_num: int) -> None:
    """Starts the profiler before `first_round`; a profiler that cannot
    start (e.g. one already runs in the process) is a warning: the trace is
    a diagnostic, not a reason to stop the run."""
    if round_num == self.first_round and self.last_round >= round_num:
      try:
        tf.profiler.experimental.start(
          self.directory,
          options=tf.profiler.experimental.ProfilerOptions(
            host_tracer_level=2, python_tracer_level=1, device_tracer_level=0
          ),
        )
      except (tf.errors.OpError, RuntimeError, ValueError) as e:
        logging.warning(
          "--profile_rounds: no trace, the profiler did not start: %s", e
        )
        return
      self._active = True

  def round_ended(self, round_num: int) -> None:
    if round_num >= self.last_round:
      self.close()

  def close(self) -> None:
    """Stops the profiler (writing the trace) if it runs; never raises (it
    runs in the program's `finally`, possibly while another error ends the
    run), a failure to write is a warning."""
    if self._active:
      self._active = False
      try:
        tf.profiler.experimental.stop()
      except (tf.errors.OpError, RuntimeError, ValueError) as e:
        logging.warning("--profile_rounds: the trace was not written: %s", e)
