#!/usr/bin/env bash
# Alternating before/after runs of the pipeline and relay benchmarks, two pairs, each side
# started only once the 1-minute load is under 0.5 (nothing else may build or test meanwhile).
# BEFORE_DIR and AFTER_DIR are two checkouts (git worktree add --detach DIR REV), each with its
# own cargo target directory and target/plugins linked to a built one (scripts/build-plugins.sh).
#
#   bench/ab.sh BEFORE_DIR BEFORE_TARGET AFTER_DIR AFTER_TARGET OUT
set -u
bdir=$1 btarget=$2 adir=$3 atarget=$4 out=$5
quiet() { for i in $(seq 1 120); do awk -v l="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN{exit !(l<0.5)}' && return; sleep 5; done; }
cd "$(dirname "${BASH_SOURCE[0]}")/.." && source scripts/services.sh >/dev/null
for pair in "$bdir $btarget" "$adir $atarget"; do
  set -- $pair
  (cd $1 && CARGO_TARGET_DIR=$2 cargo bench -p carteiro --bench pipeline --bench relay --no-run -q) || exit 1
done
echo "load before: $(uptime)" | tee "$out"
for run in 1 2; do
  for side in before after; do
    if [ $side = before ]; then dir=$bdir t=$btarget; else dir=$adir t=$atarget; fi
    quiet
    echo "=== $side ($(git -C $dir rev-parse --short HEAD)) run $run, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
    for b in pipeline relay; do
      echo "--- $b" | tee -a "$out"
      (cd $dir && CARGO_TARGET_DIR=$t BENCH_ROUNDS=1 cargo bench -q -p carteiro --bench $b 2>&1 | grep -v -E "^\s*(Compiling|Finished|Running)") | tee -a "$out"
    done
  done
done
echo "load after: $(uptime)" | tee -a "$out"
