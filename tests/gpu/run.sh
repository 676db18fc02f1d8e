#!/bin/bash
# Runs the CUDA tests on a machine with a GPU: every tests/gpu program, then each
# kernel test again under compute-sanitizer memcheck and racecheck (small shapes),
# and prints a table last. The whole-model test (test_worker_cuda) runs once, outside
# the sanitizers (it runs the models for minutes there); it needs the oracle:
# BLOOMERY_SHARED, or ../shared beside the checkout. Builds nothing: point it at a build folder made elsewhere
# with -Dgpu=enabled and a gpu_archs list that includes the card's.
#
#   tests/gpu/run.sh [BUILD]        BUILD defaults to build-gpu
#
# Programs come from BUILD/tests/gpu/test_kcuda_*; shared libraries from BUILD/lib
# (../shared/device/bundle puts them there) and CUDA's own lib64. The seed is
# printed; BLOOMERY_TEST_SEED=N replays a run. Logs are kept in a folder it names
# (GPU_TEST_LOGS to choose it). Exit status 1 when anything failed.
set -u
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
dir=$build/tests/gpu
sanitizer=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
export LD_LIBRARY_PATH=$PWD/$build/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# test_worker_cuda writes the families' tiny files with the build's bloomery-mkmodel
[ -x "$build/tools/bloomery-mkmodel" ] && export BLOOMERY_MKMODEL=${BLOOMERY_MKMODEL:-$PWD/$build/tools/bloomery-mkmodel}
export BLOOMERY_TEST_SEED=${BLOOMERY_TEST_SEED:-$(( $(date +%s) * 1000 + RANDOM % 1000 ))}
logs=${GPU_TEST_LOGS:-$(mktemp -d /tmp/bloomery-gpu-tests.XXXXXX)}
mkdir -p "$logs"

progs=$(find "$dir" -maxdepth 1 -type f -perm -u+x \( -name 'test_kcuda_*' -o -name 'test_worker_*' \) 2>/dev/null | sort)
if [ -z "$progs" ]; then
    echo "gpu-tests: no test programs in $dir (build with -Dgpu=enabled, then carry $build)"
    exit 1
fi
echo "gpu-tests: seed $BLOOMERY_TEST_SEED (BLOOMERY_TEST_SEED=$BLOOMERY_TEST_SEED replays it); logs in $logs"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    sed 's/^/gpu-tests: device: /'
[ -x "$sanitizer" ] || echo "gpu-tests: $sanitizer not found: the sanitizer columns will say so"

status=0
declare -A plain mem race secs

# Counts a TAP log: "P/T ok", or what went wrong.
tap_summary() {
    local log=$1 rc=$2 pass fail
    pass=$(grep -c '^ok ' "$log")
    fail=$(grep '^not ok ' "$log" | grep -vc '# TODO')  # TAP: a TODO failure is expected
    if grep -q '^1\.\.0 # SKIP' "$log"; then echo "SKIPPED (no GPU)"; return 1; fi
    if grep -q '^Bail out!' "$log"; then echo "BAIL OUT"; return 1; fi
    if [ "$fail" -gt 0 ]; then echo "$pass/$((pass + fail)) ok, $fail FAILED"; return 1; fi
    if [ "$rc" -ne 0 ]; then echo "$pass ok, exit $rc"; return 1; fi
    echo "$pass/$pass ok"
}

# The failing tests of a TAP log, each with the comment lines printed before it
# (the first mismatches: index, got, want, tolerance).
failures() {
    awk '/^#/ { buf = buf $0 "\n"; next }
         /^not ok |^Bail out/ { printf "%s%s\n", buf, $0 }
         { buf = "" }' "$1"
}

for p in $progs; do
    name=$(basename "$p")
    log=$logs/$name.log
    t0=$(date +%s.%N)
    "$p" >"$log" 2>&1
    rc=$?
    secs[$name]=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if ! plain[$name]=$(tap_summary "$log" $rc); then
        status=1
        echo "---- $name failed (rc $rc); its failing tests and first mismatches:"
        failures "$log" | head -60
    fi

    for tool in memcheck racecheck; do
        slog=$logs/$name.$tool.log
        if [[ $name == test_worker_* ]]; then
            res="not run (model test)"
        elif [ ! -x "$sanitizer" ]; then
            res="no sanitizer"
        else
            BLOOMERY_GPU_TEST_SMALL=1 "$sanitizer" --tool $tool --error-exitcode 99 "$p" >"$slog" 2>&1
            src=$?
            if [ $tool = memcheck ]; then
                res=$(grep -Eo 'ERROR SUMMARY: [0-9]+ errors?' "$slog" | tail -1 | sed 's/ERROR SUMMARY: //')
            else
                res=$(grep -Eo 'RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?\)' "$slog" |
                      tail -1 | sed -E 's/RACECHECK SUMMARY: ([0-9]+) hazards? displayed \(([0-9]+) errors?, ([0-9]+) warnings?\)/\1 hazards (\2 err, \3 warn)/')
            fi
            [ -n "$res" ] || res="no summary"
            tap=$(tap_summary "$slog" $src)
            if [ $src -ne 0 ] || ! echo "$res" | grep -Eq '^0 '; then
                status=1
                res="$res, exit $src, tests $tap"
                echo "---- $name under $tool: $res; first reports:"
                grep -E '^=========' "$slog" | grep -vE 'COMPUTE-SANITIZER|SUMMARY' | head -30
            fi
        fi
        if [ $tool = memcheck ]; then mem[$name]=$res; else race[$name]=$res; fi
    done
done

echo
echo "gpu-tests: seed $BLOOMERY_TEST_SEED, logs in $logs"
printf '%-22s | %-22s | %6s | %-18s | %-26s\n' program "tests (full shapes)" "s" "memcheck" "racecheck"
printf '%-22s-+-%-22s-+-%6s-+-%-18s-+-%-26s\n' "" "" "" "" "" | tr ' ' '-'
for p in $progs; do
    name=$(basename "$p")
    printf '%-22s | %-22s | %6s | %-18s | %-26s\n' "$name" "${plain[$name]}" "${secs[$name]}" "${mem[$name]}" "${race[$name]}"
done
[ $status -eq 0 ] && echo "gpu-tests: ALL PASSED" || echo "gpu-tests: FAILURES (see above)"
exit $status
