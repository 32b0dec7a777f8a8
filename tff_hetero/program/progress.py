"""A progress bar: round, last accuracy, MiB uploaded (tqdm on stderr)."""

from __future__ import annotations

import math
import sys

import tqdm


class ProgressBar:
  def __init__(self, total_rounds: int, initial: int, enabled: bool = True):
    self._bar = tqdm.tqdm(
      total=total_rounds,
      initial=initial,
      unit="round",
      file=sys.stderr,
      disable=not enabled,
      dynamic_ncols=True,
      mininterval=0.5,
      bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]"
      " {postfix}",
    )
    self._accuracy = math.nan

  def update(self, round_num: int, accuracy, upload_mib: float) -> None:
    if accuracy is not None and math.isfinite(accuracy):
      self._accuracy = accuracy
    self._bar.set_postfix_str(
      f"round={round_num} acc={self._accuracy:.4f} up={upload_mib:.2f}MiB",
      refresh=False,
    )
    self._bar.update(round_num - self._bar.n)

  def close(self) -> None:
    self._bar.close()
