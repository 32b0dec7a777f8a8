#!/bin/sh
echo "bazel coverage is not supported offline (@remote_coverage_tools is a local stub)." >&2
exit 1
