"""Nothing loaded from disk or from the network is unpickled.

Checkpoints are SavedModels with a JSON sidecar, weights and agents `.npz`
files, and TFF workers exchange protocol buffers. This scans the project's
own sources: no pickle-based loader may appear, and every `np.load` must say
`allow_pickle=False` (NumPy's default, written out so that a change of
default or a copied call cannot bring pickle back).
"""

import os
import re

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
_FORBIDDEN = re.compile(
  r"\bimport (c?pickle|dill|shelve|marshal)\b|\bfrom (c?pickle|dill|shelve)"
  r" import|\bjoblib\.load\b|allow_pickle\s*=\s*True|\btorch\.load\b"
)
_NP_LOAD = re.compile(r"\bnp\.load\(")


def _call_text(text, start):
  """The argument text of the call whose '(' ends just before `start`."""
  depth = 1
  for i in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    if depth == 0:
      return text[start:i]
  return text[start:]


def _sources():
  for top in ("tff_hetero", "pipelines", "tools"):
    for root, _, files in os.walk(os.path.join(REPO, top)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(root, name)
          with open(path, encoding="utf-8") as f:
            yield os.path.relpath(path, REPO), f.read()


def test_no_pickle_based_loading():
  found = []
  loads = 0
  for path, text in _sources():
    found += [f"{path}: {m.group(0)}" for m in _FORBIDDEN.finditer(text)]
    for match in _NP_LOAD.finditer(text):
      loads += 1
      call = _call_text(text, match.end())
      if "allow_pickle=False" not in call:
        found.append(f"{path}: np.load without allow_pickle=False")
  assert found == []
  assert loads >= 3  # The scan sees the project's own loaders.
