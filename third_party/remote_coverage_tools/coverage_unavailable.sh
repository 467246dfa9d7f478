#!/bin/sh
echo "bazel coverage is unavailable offline (remote_coverage_tools is a local stand-in)" >&2
exit 1
