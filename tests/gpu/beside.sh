#!/bin/bash
# bloomery beside llama.cpp on a machine with a card, in one run: the benchmark files
# written there by bloomery-mkmodel (into /dev/shm: the real shapes take 3-75 GiB and
# such machines' disks are small; each file is removed after its shape), bloomery-bench
# and llama-bench with the same tests one after the other, and with --serve
# bloomery-serve against llama-server under tools/bloomery-load. Prints a table of
# both and their ratio for each shape (docs/performance.md wants both from the same
# machine and hour). Builds nothing: see tests/gpu/run.sh for the build.
#
#   tests/gpu/beside.sh --peer DIR [--build DIR] [--tests "ARGS"] [--cpu-moe]
#                       [--vary VAR=V1,V2,...] [--serve N,...] [--tokenizer DIR]
#                       [--layers N] [--dir DIR] [--threads N] [--dry-run] SHAPE...
#
# SHAPE: qwen3-30b-a3b (Qwen3-30B-A3B's shape, q4_K + q6_K, 18.44 GiB), deepseek-v3-4
# (DeepSeek-V3's attention and widths, 4 layers, 16 experts, 2.78 GiB), gpt-oss-120b
# (59.02 GiB), glm-4.5-air (74.25 GiB: more than an 80 GB card holds with its cache),
# qwen3.5-35b-a3b (qwen35moe: DeltaNet and attention layers, 256 experts, 21.45 GiB).
#   --peer DIR      llama.cpp's programs (llama-bench, llama-server) and libraries
#   --build DIR     a build with -Dgpu=enabled: its programs in DIR/bin (make links
#                   them there) or meson's DIR/tools, router, worker, hosttier, and
#                   the libraries ../shared/device/bundle put in DIR/lib (default
#                   build-gpu)
#   --tests ARGS    the tests both benches run (default "-p 512 -n 128 -r 2"; -p, -n,
#                   -d and -r mean the same to both)
#   --vary VAR=V,.. bloomery-bench once for each value of the environment variable
#                   VAR (a knob such as BLOOMERY_CUDA_GG_ROWS), llama-bench once; a
#                   table for each value against the same llama.cpp rows
#   --cpu-moe       every routed expert in host RAM: bloomery-bench -cmoe
#                   --no-residency (no expert copied to the card while it runs, as
#                   llama.cpp) against llama-bench -ncmoe 999, both with --threads
#   --serve N,...   also the servers with -np N, N streaming clients of 128 tokens for
#                   20 s each (both get the same request body)
#   --tokenizer DIR Qwen3's tokenizer files: the qwen3-30b-a3b file gets its real
#                   vocabulary, and the servers' requests ban its tokens that are not
#                   whole UTF-8 and its control tokens (llama-server's output parser
#                   refuses a stream of pieces that are not whole UTF-8, which a random
#                   model emits)
#   --layers N      each shape cut to its first N layers (bloomery-mkmodel --layers):
#                   with --cpu-moe, a file small enough that bloomery's hosttier may
#                   copy its experts into huge pages beside the file (a tmpfs file of
#                   more than about a third of the RAM leaves too little: the experts
#                   are then read through the file's 4 KiB pages, at about half the
#                   rate; llama.cpp reads them through the mapping either way)
#   --dir DIR       where the files are written (default /dev/shm); a disk's page
#                   cache can be given back, so a whole file there leaves room for
#                   the copy
#   --threads N     CPU threads for bloomery-mkmodel and bloomery-bench (default nproc)
#   --dry-run       print the commands, run nothing
# Exit status 1 when a program failed or printed no result.
set -u
cd "$(dirname "$0")/../.." || exit 2
root=$PWD
build=build-gpu peer='' tests="-p 512 -n 128 -r 2" serve='' tok='' dry=0 threads=$(nproc) cpu_moe=0 vary=
layers='' dir=/dev/shm
shapes=()
while [ $# -gt 0 ]; do
    case $1 in
    --peer) peer=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --serve) serve=$2; shift 2 ;;
    --tokenizer) tok=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --cpu-moe) cpu_moe=1; shift ;;
    --vary) vary=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "beside: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    *) shapes+=("$1"); shift ;;
    esac
done
if [ -z "$peer" ] || [ ${#shapes[@]} -eq 0 ]; then
    echo "beside: give --peer DIR and at least one shape (--help)" >&2
    exit 2
fi
case $serve in *[!0-9,]*) echo "beside: --serve takes stream counts such as 1,8,32" >&2; exit 2 ;; esac
case $threads in '' | *[!0-9]*) echo "beside: --threads takes a number" >&2; exit 2 ;; esac
case $layers in *[!0-9]* | 0*) echo "beside: --layers takes a number of layers, at least 1" >&2; exit 2 ;; esac
[ -d "$dir" ] || { echo "beside: --dir $dir: not a folder" >&2; exit 2; }
# --vary: the variable's name and its values (one empty value: the bench's own default)
vary_var='' vary_vals=('')
if [ -n "$vary" ]; then
    vary_var=${vary%%=*}
    case $vary in
    *=*) ;;
    *) vary_var='' ;;
    esac
    case $vary_var in '' | [0-9]* | *[!A-Za-z0-9_]*)
        echo "beside: --vary takes VAR=V1,V2,... (a variable name, then values)" >&2; exit 2 ;;
    esac
    IFS=, read -r -a vary_vals <<<"${vary#*=}"
    [ ${#vary_vals[@]} -gt 0 ] || { echo "beside: --vary $vary_var: no values" >&2; exit 2; }
    for v in "${vary_vals[@]}"; do
        case $v in '' | *[!A-Za-z0-9_.+-]*)
            echo "beside: --vary $vary_var: the value '$v' is empty or not a plain word" >&2; exit 2 ;;
        esac
    done
fi

# The mkmodel flags of a shape; empty for a name it does not know.
shape_flags() {
    case $1 in
    qwen3-30b-a3b)
        echo "--layers 48 --n-embd 2048 --heads 32 --kv-heads 4 --head-dim 128 --experts 128 --experts-used 8" \
             "--expert-ff 768 --ff 6144 --ctx 40960${tok:+ --tokenizer $tok}" ;;
    deepseek-v3-4) echo "--preset deepseek-v3 --layers 4 --experts 16" ;;
    gpt-oss-120b) echo "--preset gpt-oss-120b" ;;
    glm-4.5-air) echo "--preset glm-4.5-air" ;;
    qwen3.5-35b-a3b) echo "--preset qwen3.5-35b-a3b" ;;
    esac
}
for s in "${shapes[@]}"; do
    [ -n "$(shape_flags "$s")" ] || { echo "beside: unknown shape $s (--help lists them)" >&2; exit 2; }
done

# A program of the build: BUILD/bin (make links them there), else meson's folders.
prog() {
    local d
    for d in bin tools router worker hosttier; do
        [ -x "$build/$d/$1" ] && { echo "$build/$d/$1"; return; }
    done
    echo "$build/bin/$1"
}
case $build in /*) lib=$build/lib ;; *) lib=$root/$build/lib ;; esac
export LD_LIBRARY_PATH=$lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
peer_env="LD_LIBRARY_PATH=$peer:/usr/local/cuda/lib64"
status=0
out=/tmp
[ $dry -eq 1 ] || out=$(mktemp -d /tmp/bloomery-beside.XXXXXX) || exit 1

# run LOG CMD...: runs (or prints) a command, its output into LOG and on.
run() {
    local log=$1
    shift
    echo "+ $*"
    [ $dry -eq 1 ] && return 0
    eval "$*" >"$log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || { echo "beside: exit $rc: $*"; tail -5 "$log"; status=1; }
    return $rc
}

# The (test, t/s) pairs of a bench's markdown table, by its header's column names.
pairs() {
    awk -F'|' '
        !cols && /\| *test *\|/ { for (i = 1; i <= NF; i++) { h = $i; gsub(/ /, "", h); if (h == "test") t = i; if (h == "t/s") v = i } cols = 1; next }
        cols && t && /^\|/ && $t !~ /^ *-+:? *$/ { a = $t; b = $v; gsub(/^ +| +$/, "", a); split(b, w, " "); if (w[1] != "") print a "\t" w[1] }' "$1"
}

# Requests' body for the servers: the tokenizer's bans, or nothing.
body='{}'
if [ -n "$serve" ] && [ -n "$tok" ] && [ $dry -eq 0 ]; then
    body=$(python3 "$root/tests/tools/bpe_bans.py" "$tok/tokenizer.json") || { echo "beside: no bans from $tok/tokenizer.json"; body='{}'; }
fi

# health PORT: waits up to 300 s for the server's /health.
health() {
    local _
    for _ in $(seq 300); do
        python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2)" \
            2>/dev/null && return 0
        sleep 1
    done
    return 1
}

# serve NAME PORT N CMD...: starts a server, loads it with N clients, stops it;
# prints its total tokens/s.
serve_one() {
    local name=$1 port=$2 n=$3
    shift 3
    echo "+ $* --port $port" >&2
    if [ $dry -eq 1 ]; then
        echo "+ tools/bloomery-load --url http://127.0.0.1:$port -c $n -d 20 -n 128 --ignore-eos --mode native --json" >&2
        echo "-"
        return
    fi
    eval "$* --port $port" >"$out/$name-$n.log" 2>&1 &
    local pid=$!
    local rate=-
    if health "$port"; then
        python3 tools/bloomery-load --url "http://127.0.0.1:$port" -c "$n" -d 20 -n 128 --ignore-eos --mode native \
            --body "$body" --json >"$out/$name-$n.json" 2>&1
        rate=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('%.1f' % d['tokens_per_s'], d['errors'])" \
            "$out/$name-$n.json" 2>/dev/null) || rate=-
    fi
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    [ "$rate" != - ] || { echo "beside: $name at $n streams gave no rate ($out/$name-$n.log)" >&2; status=1; }
    echo "$rate"
}

if [ $dry -eq 1 ]; then
    echo "beside: a dry run: the commands, none run"
else
    echo "beside: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); logs in $out"
fi
for s in "${shapes[@]}"; do
    f=$dir/beside-$s.gguf
    echo "== $s ($(date -u +%H:%M) UTC)"
    run "$out/$s-mk.log" "$(prog bloomery-mkmodel) -o $f $(shape_flags "$s")${layers:+ --layers $layers} --bench-fill --threads $threads" || continue
    bplace='' lplace=''
    [ $cpu_moe -eq 0 ] || { bplace=" -cmoe --no-residency"; lplace=" -ncmoe 999 -t $threads"; }
    for i in "${!vary_vals[@]}"; do
        v=${vary_vals[$i]}
        run "$out/$s-bloomery$i.md" "${vary_var:+$vary_var=$v }$(prog bloomery-bench) -m $f -ngl 99$bplace $tests --no-roofline -t $threads"
    done
    run "$out/$s-llama.md" "$peer_env $peer/llama-bench -m $f -ngl 99$lplace -fa 1 $tests"
    for i in "${!vary_vals[@]}"; do
        [ $dry -eq 0 ] || break
        printf '| %s%s%s%s | bloomery | llama.cpp | ratio |\n|---|---:|---:|---:|\n' "$s" "${layers:+ ($layers layers)}" \
            "$([ $cpu_moe -eq 0 ] || echo ', routed experts in host RAM')" "${vary_var:+, $vary_var=${vary_vals[$i]}}"
        join -t $'\t' -a 1 <(pairs "$out/$s-bloomery$i.md" | sort) <(pairs "$out/$s-llama.md" | sort) |
            awk -F'\t' '{ r = ($3 > 0) ? sprintf("%.2f", $2 / $3) : "-"; printf "| %s | %s | %s | %s |\n", $1, $2, ($3 == "" ? "-" : $3), r }'
        [ -n "$(pairs "$out/$s-bloomery$i.md")" ] || { echo "beside: bloomery-bench printed no result"; status=1; }
    done
    if [ -n "$serve" ]; then
        printf '| %s, streams | bloomery-serve tok/s, errors | llama-server tok/s, errors |\n|---|---:|---:|\n' "$s"
        for n in ${serve//,/ }; do
            ctx=$((n * 2048))
            b=$(serve_one bloomery 8180 "$n" "$(prog bloomery-serve) -m $f -ngl 99 -np $n -c $ctx")
            l=$(serve_one llama 8181 "$n" "$peer_env $peer/llama-server -m $f -ngl 99 -fa on -np $n -c $ctx")
            echo "| $n | $b | $l |"
        done
    fi
    [ $dry -eq 1 ] || rm -f "$f"
done
exit $status
