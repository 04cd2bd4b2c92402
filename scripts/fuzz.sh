#!/usr/bin/env bash
# A campaign of the view/mutation property test under fresh random seeds (the test command uses one fixed seed).
# Usage: ./scripts/fuzz.sh [RUNS=10] [EXAMPLES=2000].  Prints each failing seed; exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
runs=${1:-10}
failed=0
for _ in $(seq "$runs"); do
  seed=$(.venv/bin/python -c 'import random; print(random.randrange(1 << 32))')
  if TORCHTPU_FUZZ_SEED=$seed TORCHTPU_FUZZ_EXAMPLES=${2:-2000} .venv/bin/python -m pytest -q -p no:cacheprovider \
       tests/test_views_fuzz.py -k random_view > "/tmp/torchtpu_fuzz_$seed.log" 2>&1; then
    echo "seed $seed: pass"
  else
    echo "seed $seed: FAIL (replay: TORCHTPU_FUZZ_SEED=$seed; log /tmp/torchtpu_fuzz_$seed.log)"
    failed=1
  fi
done
exit $failed
