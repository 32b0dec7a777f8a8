"""CI's process supervisor: no process a CI run starts may outlive it.

  python -m tools.ci_supervisor supervise -- CMD...   # run CMD as a subreaper
  python -m tools.ci_supervisor leftovers --run-id ID [--reaper-pid P]
      [--preexisting "PID PID ..."]                   # our TFF workers left?
  python -m tools.ci_supervisor workers               # PIDs of all TFF workers

`supervise` makes this process a child subreaper (prctl
PR_SET_CHILD_SUBREAPER), so every process CMD starts stays its descendant
even when orphaned (a TFF `worker_binary` whose parent died, the Bazel
server); it forwards SIGTERM/SIGINT/SIGHUP to CMD, reaps every child, and when
CMD ends kills the descendants still alive (SIGTERM, then SIGKILL). It exits
with CMD's status, or 1 if CMD succeeded but one of the leftovers was a TFF
worker. It sets `TFF_HETERO_CI_REAPER_PID` for CMD.

`leftovers` lists the TFF workers this run started that are still alive:
those descending from the reaper, or carrying `TFF_HETERO_CI_RUN_ID=ID` in
their environment, minus those alive before the run. It kills them and exits
1 if there were any.

Workers are recognised as the tests recognise them
(`tff_hetero.runtime.testing.is_worker_process`). `.ci/run` calls this.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time

import psutil

from tff_hetero.runtime import testing as runtime_testing

PR_SET_CHILD_SUBREAPER = 36
REAPER_VARIABLE = "TFF_HETERO_CI_REAPER_PID"
RUN_ID_VARIABLE = "TFF_HETERO_CI_RUN_ID"


def log(message: str) -> None:
  print(f"[ci_supervisor] {message}", flush=True)


def _reap() -> None:
  try:
    while os.waitpid(-1, os.WNOHANG)[0] > 0:
      pass
  except ChildProcessError:
    pass


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
  out = []
  for process in processes:
    try:
      if process.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
        out.append(process)
    except psutil.Error:
      continue
  return out


def _describe(process: psutil.Process) -> str:
  try:
    return " ".join(process.cmdline()) or process.name()
  except psutil.Error:
    return "?"


def terminate(processes: list[psutil.Process], grace_s: float = 5.0) -> None:
  """SIGTERM, then SIGKILL what is still alive after `grace_s`."""
  for sig in (signal.SIGTERM, signal.SIGKILL):
    for process in _alive(processes):
      try:
        process.send_signal(sig)
      except psutil.Error:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
      _reap()
      if not _alive(processes):
        return
      time.sleep(0.1)


def supervise(command: list[str]) -> int:
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
    log("prctl(PR_SET_CHILD_SUBREAPER) failed: orphans escape supervision")
  env = dict(os.environ, **{REAPER_VARIABLE: str(os.getpid())})
  started = []  # The child, once started; signals before that end the run.

  def forward(sig, _):
    if not started:
      sys.exit(128 + sig)
    try:
      # os.kill, not Popen.send_signal: that polls, and could reap the child
      # here, unseen by the waitpid loop below.
      os.kill(started[0].pid, sig)
    except ProcessLookupError:
      pass

  # Installed before the child starts: a signal in between must not kill
  # the supervisor and leave the command running unsupervised.
  for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, forward)
  child = subprocess.Popen(command, env=env)
  started.append(child)
  # Reap every child, not only CMD: orphans re-parented to us must not
  # linger as zombies (the Bazel client waits for its server's pid to go).
  while True:
    try:
      pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
      rc = child.returncode if child.returncode is not None else 1
      break
    if pid == child.pid:
      rc = os.waitstatus_to_exitcode(status)
      rc = 128 - rc if rc < 0 else rc
      child.returncode = rc
      break
  _reap()
  left = _alive(psutil.Process().children(recursive=True))
  if not left:
    return rc
  workers = [p for p in left if runtime_testing.is_worker_process(p)]
  log(f"{len(left)} process(es) started by this run outlived it, killing them:")
  for process in left:
    log(f"  pid {process.pid}: {_describe(process)}")
  terminate(left)
  if workers and rc == 0:
    log("FAILED: a TFF worker_binary outlived the run")
    return 1
  return rc


def all_workers() -> list[psutil.Process]:
  return [
    p for p in psutil.process_iter() if runtime_testing.is_worker_process(p)
  ]


def _is_ours(
  process: psutil.Process, run_id: str, reaper_pid: int | None
) -> bool:
  try:
    if reaper_pid is not None and any(
      parent.pid == reaper_pid for parent in process.parents()
    ):
      return True
    return process.environ().get(RUN_ID_VARIABLE) == run_id
  except psutil.Error:
    return False


def leftovers(
  run_id: str, reaper_pid: int | None, preexisting: set[int]
) -> int:
  ours = [
    p
    for p in all_workers()
    if p.pid not in preexisting and _is_ours(p, run_id, reaper_pid)
  ]
  if not ours:
    log(
      "no worker_binary started by this run is left (worker_binary"
      f" processes of others on this host: {len(all_workers())})"
    )
    return 0
  log(
    f"ERROR: {len(ours)} TFF worker_binary process(es) started by this run"
    " outlived it:"
  )
  for process in ours:
    log(f"  pid {process.pid}: {_describe(process)}")
  terminate(ours)
  log("killed them; a worker must be stopped by the code that started it")
  return 1


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="what", required=True)
  run = commands.add_parser("supervise")
  run.add_argument("command", nargs=argparse.REMAINDER)
  left = commands.add_parser("leftovers")
  left.add_argument("--run-id", required=True)
  left.add_argument("--reaper-pid", type=int, default=None)
  left.add_argument("--preexisting", default="")
  commands.add_parser("workers")
  args = parser.parse_args(argv)
  if args.what == "supervise":
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
      parser.error("supervise needs a command after --")
    return supervise(command)
  if args.what == "leftovers":
    preexisting = {int(p) for p in args.preexisting.split()}
    return leftovers(args.run_id, args.reaper_pid, preexisting)
  print(" ".join(str(p.pid) for p in all_workers()))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
