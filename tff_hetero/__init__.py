"""tff-hetero: TensorFlow Federated algorithms for federated learning across heterogeneous devices."""

import os as _os

# TensorFlow's C++ start-up chatter hides the one-line errors our pipelines print.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

__version__ = "0.1.0"
