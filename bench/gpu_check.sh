#!/bin/sh
# The prepared GPU check of issue 46 (item 4): bench/gpu_check.py's three figures, one summary
# line each (its docstring says what each means). For a machine with torch (CUDA),
# transformers and peft; no vLLM, no network. Run from anywhere in a clone:
#
#   sh bench/gpu_check.sh [--json figures.json]        # python3, or PYTHON=/path/to/python
#
# At most 8 minutes: the module starts no part after 420 s and ends its transfer by 470 s;
# this kills the run at 475 s whatever it is doing. Without CUDA it runs its CPU half.
set -eu
cd "$(dirname "$0")/.."
exec timeout -k 5 475 "${PYTHON:-python3}" -m bench.gpu_check "$@"
