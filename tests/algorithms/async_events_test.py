"""The event simulation of asynchronous devices: arrivals by hand, rounds,
refills, determinism and resumption (pure Python: no model, no TFF)."""

import numpy as np
import pytest

from tff_hetero.algorithms import async_events

WORK = {"a": 10.0, "b": 20.0, "c": 30.0, "d": 40.0}


def _simulation(concurrency, speed=lambda c, r: 1.0, seed=0, clients=WORK):
  return async_events.Simulation(
    list(clients), concurrency, seed, work=lambda c: WORK[c], speed=speed
  )


def test_one_device_arrives_once_a_round_at_work_over_speed():
  # Speed 2 in round 1, 5 afterwards: jobs of 10 MACs last 5, then 2.
  sim = _simulation(1, speed=lambda c, r: 2.0 if r == 1 else 5.0, clients=["a"])
  state, finishes = sim.initial_state(), []
  for round_num in (1, 2, 3):
    arrivals, state = sim.plan(state, round_num, ["a"], size=4)
    assert [a.client_id for a in arrivals] == ["a"]  # its next job is later
    finishes.append(arrivals[0].finish)
  # Job 1 started at 0 in round 1 (5 long); job 2 at 5, also drawn in round
  # 1 (5 long); job 3 at 10 in round 2 (2 long).
  assert finishes == [5.0, 10.0, 12.0]
  assert float(state.clock) == 12.0 and int(state.jobs) == 4


def test_all_devices_busy_each_goes_on_and_rounds_stop_before_a_repeat():
  work = {"a": 10.0, "b": 26.0, "c": 35.0, "d": 45.0}  # no ties
  sim = async_events.Simulation(
    list(work), 4, 0, work=lambda c: work[c], speed=lambda c, r: 1.0
  )
  state = sim.initial_state()
  rounds = []
  for round_num in range(1, 6):
    arrivals, state = sim.plan(state, round_num, list(work), size=4)
    rounds.append([(a.client_id, a.finish) for a in arrivals])
  # K = N: each client keeps a slot and starts again when answered. Ends:
  # a at 10, 20, 30, ...; b at 26, 52; c at 35, 70; d at 45. Each round
  # stops before a's next arrival.
  assert rounds == [
    [("a", 10.0)],
    [("a", 20.0), ("b", 26.0)],
    [("a", 30.0), ("c", 35.0)],
    [("a", 40.0), ("d", 45.0)],
    [("a", 50.0), ("b", 52.0)],
  ]
  assert float(state.clock) == 52.0


def test_freed_slots_go_to_idle_available_clients():
  sim = _simulation(2, seed=3)
  state = sim.initial_state()
  available_by_round = {
    1: ["a", "b"],
    2: ["a", "c"],
    3: ["b", "c", "d"],
    4: ["d"],
  }
  for round_num, available in available_by_round.items():
    before = {sim.client_ids[c] for c in state.slot_client if c >= 0}
    arrivals, state = sim.plan(state, round_num, available, size=2)
    after = [sim.client_ids[c] if c >= 0 else None for c in state.slot_client]
    # A client that started this round was available this round; the two
    # slots never hold the same client.
    started = set(after) - before - {None}
    assert started <= set(available)
    assert len([c for c in after if c]) == len({c for c in after if c})
    assert all(
      a.client_id in before | started | {x.client_id for x in arrivals}
      for a in arrivals
    )
  # Round 4: only d is available; slots freed then hold d or nothing.
  assert set(after) <= {"b", "c", "d", None}


def test_same_state_same_plan_and_a_resumed_run_continues_the_same():
  sim = _simulation(2, seed=7)

  def run(rounds, state):
    out = []
    for round_num in rounds:
      arrivals, state = sim.plan(state, round_num, list(WORK), size=2)
      out.append([(a.client_id, a.slot, a.start, a.finish) for a in arrivals])
    return out, state

  whole, _ = run(range(1, 9), sim.initial_state())
  first, saved = run(range(1, 5), sim.initial_state())
  # A checkpoint holds the state's arrays; a new process rebuilds them.
  restored = async_events.EventState(*(np.array(x) for x in saved))
  rest, _ = run(range(5, 9), restored)
  assert first + rest == whole
  assert run(range(1, 9), sim.initial_state())[0] == whole
  other_seed, _ = _simulation(2, seed=8).plan(
    sim.initial_state(), 1, list(WORK), 2
  )
  assert isinstance(other_seed, list)


def test_bad_concurrency():
  with pytest.raises(ValueError, match="concurrency"):
    _simulation(0)
