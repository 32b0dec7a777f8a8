"""Exec a program that will receive a signal when its parent dies.

    python -I -S _pdeathsig_exec.py PARENT_PID SIGNUM [--private-network] \
        PROGRAM [ARGS...]

Sets `prctl(PR_SET_PDEATHSIG, SIGNUM)` (kept across `execv`), exits with
status 1 if the parent is no longer PARENT_PID (it died before the prctl, so
the signal would never come), then replaces itself with PROGRAM.

With `--private-network` it first moves itself into a network namespace of
its own whose only interface is loopback (brought up here), so that PROGRAM
can be reached from nowhere but that namespace (`netns.py` bridges into it).
That needs CAP_SYS_ADMIN (`unshare`) and CAP_NET_ADMIN (loopback up); the
helper exits with status 3 and a one-line reason on stderr without them.
Then, before PROGRAM runs, it empties its capability bounding set (possible
with CAP_SETPCAP, which root has), clears its ambient capabilities and sets
no-new-privileges: PROGRAM (the TFF worker, which runs whatever graph it is
sent) starts with no capability at all, whether the launcher runs as root
or was granted some capabilities to make the namespace. (A root launcher
whose bounding set cannot be emptied exits with status 3: its PROGRAM would
get every capability back at `execv`.)

Why a helper process instead of `subprocess.Popen(preexec_fn=...)`: a
`preexec_fn` makes Python use `fork()`, which runs gRPC's `pthread_atfork`
handlers in a process that has gRPC channels; those handlers were seen to
deadlock the parent inside `fork()` forever (TFF 0.87, grpcio 1.74). Without
a `preexec_fn`, `subprocess` uses `vfork()`, which runs no fork handlers.

Standard library only, run with `-I -S`: about 10 ms.
"""

import ctypes
import fcntl
import os
import socket
import struct
import sys

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_PR_CAPBSET_DROP = 24
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH22x"  # struct ifreq: name, then ifr_flags in the union.
PRIVATE_NETWORK_FAILED = 3


def _enter_private_network(libc) -> str:
  """Unshares the network namespace and brings loopback up; '' on success,
  else the reason."""
  if libc.unshare(_CLONE_NEWNET) != 0:
    return f"unshare(CLONE_NEWNET) failed ({os.strerror(ctypes.get_errno())})"
  try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
      request = struct.pack(_IFREQ, b"lo", 0)
      flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
      fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))
  except OSError as e:
    return f"cannot bring loopback up in the new namespace ({e.strerror})"
  return ""


def _drop_bounding_set(libc) -> str:
  """Drops every capability from the bounding set; '' on success, else the
  reason. Without CAP_SETPCAP (a non-root launcher) that fails, and is no
  failure: a non-root PROGRAM gains nothing from the bounding set."""
  try:
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
      last = int(f.read())
  except (OSError, ValueError) as e:
    return f"cannot read the last capability number ({e})"
  for cap in range(last + 1):
    if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
      if os.geteuid() != 0:
        return ""
      return (
        f"cannot drop capability {cap} from the bounding set"
        f" ({os.strerror(ctypes.get_errno())})"
      )
  return ""


def main(argv):
  private = len(argv) > 3 and argv[3] == "--private-network"
  if private:
    argv = argv[:3] + argv[4:]
  if len(argv) < 4:
    sys.stderr.write(
      "usage: _pdeathsig_exec.py PARENT_PID SIGNUM [--private-network]"
      " PROGRAM ...\n"
    )
    return 2
  parent_pid, signum, program = int(argv[1]), int(argv[2]), argv[3]
  libc = ctypes.CDLL(None, use_errno=True)
  if private:
    reason = _enter_private_network(libc)
    if reason:
      sys.stderr.write(f"cannot isolate the TFF worker: {reason}\n")
      return PRIVATE_NETWORK_FAILED
    # PROGRAM gets none of the capabilities that made the namespace.
    reason = _drop_bounding_set(libc)
    if reason:
      sys.stderr.write(f"cannot isolate the TFF worker: {reason}\n")
      return PRIVATE_NETWORK_FAILED
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
      sys.stderr.write("cannot set no-new-privileges for the TFF worker\n")
      return PRIVATE_NETWORK_FAILED
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
