#!/bin/bash
# profile's footprint offline (bench_footprint.py offline) for several git revisions on one host,
# in turn, in one call: a GPU host's speed drifts (on the H100 of 2026-12-07 the same tree gave
# 61 µs a step and 0.62 % in one call, 43 µs and 0.46 % in another a quarter of an hour later), so
# two trees are compared only where their runs alternate on the same machine.
#
#   bench/footprint_trees.sh prepare DIR REV...   # here: each revision's checkout (git archive) in DIR/tree_REV
#   bench/footprint_trees.sh run DIR OUT [PASSES]  # on the GPU host: each tree in turn, PASSES times (default 1)
#   bench/footprint_trees.sh served DIR OUT REV... # on the GPU host: bench_footprint.py served, each REV's tree
#                                                  # in the order given (one served run is 5-6 minutes: a call
#                                                  # of the device tool holds one; alternate them over calls)
#
# run and served read MODEL (default /tmp/m8b: bench/make_bench_model.py --size 8b) and ROUNDS (default
# 6); served reads READER (default exporter: the /metrics exporter's reader, a window every 5 s) and
# puts SERVESITE (default /tmp/servesite: the API server's packages) on the path where it exists.
# They write OUT/offline-tree_REV[-PASS].json (served: OUT/served-READER-tree_REV.json) and .log,
# and print each run's share and µs a step. bench_footprint.py puts its own checkout first on
# sys.path, so each tree runs its own doctor.
set -euo pipefail
cmd=${1:?prepare or run}
dir=${2:?a directory}
shift 2
case $cmd in
prepare)
    for rev in "$@"; do
        t="$dir/tree_$rev"
        rm -rf "$t" && mkdir -p "$t"
        git archive "$rev" vllm_doctor bench tests/served.py tests/__init__.py tests/fixtures tests/conftest.py \
            pyproject.toml | tar -x -C "$t"
        echo "$t"
    done
    ;;
run)
    out=${1:?an output directory}
    passes=${2:-1}
    model=${MODEL:-/tmp/m8b}
    mkdir -p "$out"
    [ -d "$model" ] || python3 bench/make_bench_model.py "$model" --size 8b > /dev/null
    for pass in $(seq 1 "$passes"); do
        for t in "$dir"/tree_*; do
            name=$(basename "$t")$([ "$passes" -gt 1 ] && echo "-$pass" || true)
            echo "== $name"
            PYTHONPATH="$t${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 "$t/bench/bench_footprint.py" offline "$model" \
                --load-format dummy --prompts 128 --input-len 128 --output-len 256 --rounds "${ROUNDS:-6}" \
                --modes sampled --json "$out/offline-$name.json" > "$out/offline-$name.log" 2>&1 || true
            grep -v "INFO\|WARN" "$out/offline-$name.log" | grep "profile's\|own clock" | head -2
        done
    done
    ;;
served)
    out=${1:?an output directory}
    shift
    model=${MODEL:-/tmp/m8b}
    reader=${READER:-exporter}
    site=${SERVESITE:-/tmp/servesite}
    mkdir -p "$out"
    [ -d "$model" ] || python3 bench/make_bench_model.py "$model" --size 8b > /dev/null
    for rev in "$@"; do
        t="$dir/tree_$rev"
        name=served-$reader-tree_$rev
        echo "== $name"
        # PYTHONSAFEPATH: the server is `python -m`, which puts its cwd first on sys.path; a tree
        # from before 35ea366 starts it in the caller's cwd (this checkout), whose vllm_doctor then
        # ran in place of the tree's (the served runs of 2026-12-07's twelfth and thirteenth sessions)
        PYTHONSAFEPATH=1 PYTHONPATH="$t${PYTHONPATH:+:$PYTHONPATH}$([ -d "$site" ] && echo ":$site" || true)" timeout 580 \
            python3 "$t/bench/bench_footprint.py" served --serve "$model" \
            --serve-args "--load-format dummy --max-model-len 2048 --gpu-memory-utilization 0.85" --clients 128 \
            --max-tokens 256 --max-tokens-jitter 0.5 --seconds 12 --rounds "${ROUNDS:-6}" --warmup 10 \
            --reader "$reader" --json "$out/$name.json" > "$out/$name.log" 2>&1 || true
        grep -v "INFO\|WARN" "$out/$name.log" | grep "$reader\|own clock\|steady" | head -4
    done
    ;;
*)
    echo "usage: $0 prepare DIR REV... | run DIR OUT [PASSES] | served DIR OUT REV..." >&2
    exit 2
    ;;
esac
