#!/usr/bin/env bash
# The SGLang installer, where README, CI and habit look for it. It lives in
# scripts/sglang/ with its pins so a wheel can ship the two together
# (`vmfuzz install-sglang` runs that copy); `--help` there says what it does.
exec bash "$(dirname "$0")/sglang/install_sglang.sh" "$@"
