"""Exec a program that will receive a signal when its parent dies.

    python -I -S _pdeathsig_exec.py PARENT_PID SIGNUM PROGRAM [ARGS...]

Sets `prctl(PR_SET_PDEATHSIG, SIGNUM)` (kept across `execv`), exits with
status 1 if the parent is no longer PARENT_PID (it died before the prctl, so
the signal would never come), then replaces itself with PROGRAM.

Why a helper process instead of `subprocess.Popen(preexec_fn=...)`: a
`preexec_fn` makes Python use `fork()`, which runs gRPC's `pthread_atfork`
handlers in a process that has gRPC channels; those handlers were seen to
deadlock the parent inside `fork()` forever (TFF 0.87, grpcio 1.74). Without
a `preexec_fn`, `subprocess` uses `vfork()`, which runs no fork handlers.

Standard library only, run with `-I -S`: about 10 ms.
"""

import ctypes
import os
import sys

_PR_SET_PDEATHSIG = 1


def main(argv):
  if len(argv) < 4:
    sys.stderr.write(
      "usage: _pdeathsig_exec.py PARENT_PID SIGNUM PROGRAM ...\n"
    )
    return 2
  parent_pid, signum, program = int(argv[1]), int(argv[2]), argv[3]
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
    errno = ctypes.get_errno()
    sys.stderr.write(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}\n")
    return 1
  if os.getppid() != parent_pid:
    return 1  # Orphaned already: nobody would ever stop the program.
  try:
    os.execv(program, argv[3:])
  except OSError as e:
    sys.stderr.write(f"cannot execute {program}: {e.strerror}\n")
    return 127
  return 1  # Unreachable.


if __name__ == "__main__":
  sys.exit(main(sys.argv))
