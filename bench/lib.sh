# shellcheck shell=bash
# bench/lib.sh — shared by bench/run.sh and bench/gpu.sh (sourced, not run).
# Each function prints its progress on stderr and dies with a message naming
# what failed.

die() { echo "${BENCH_NAME:-bench}: $*" >&2; exit 1; }

# build_tfuse OUTDIR CMAKE_ARGS...: configure and build build-bench/ in
# Release; where Release does not build (a warning that only -O3 shows,
# turned into an error by -Werror), say so and build the project's default
# optimized type, RelWithDebInfo, instead. Sets TFUSE and BUILD_TYPE.
build_tfuse() {
    local out="$1"; shift
    BUILD_TYPE=Release
    echo "== building tfuse ($BUILD_TYPE, build-bench/)" >&2
    if ! { cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release "$@" &&
           cmake --build build-bench -j"$(nproc)"; } > "$out/build.log" 2>&1; then
        echo "   the Release build failed (log: $out/build.log):" >&2
        grep -m3 'error' "$out/build.log" | sed 's/^/     /' >&2 || true
        echo "   building RelWithDebInfo (-O2 -g, the project's default) instead; the results say so" >&2
        BUILD_TYPE="RelWithDebInfo (Release failed to build)"
        { cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" &&
          cmake --build build-bench -j"$(nproc)"; } > "$out/build-relwithdebinfo.log" 2>&1 ||
            { tail -20 "$out/build-relwithdebinfo.log" >&2; die "the tfuse build failed (log: $out/build-relwithdebinfo.log)"; }
    fi
    TFUSE=build-bench/tfuse
}

# ensure_venv VENV INSTALL(0|1) TORCH_INDEX(cpu|default) PACKAGES...: a venv at
# VENV whose python imports torch and PACKAGES; installs them with pip when
# missing and INSTALL is 1. Sets PY.
ensure_venv() {
    local venv="$1" install="$2" index="$3"; shift 3
    local mods="torch" p
    for p in "$@"; do mods="$mods, $p"; done
    if [ ! -x "$venv/bin/python" ]; then
        echo "== creating venv $venv" >&2
        python3 -m venv "$venv" || die "cannot create a venv at $venv (is python3-venv installed?)"
    fi
    PY="$venv/bin/python"
    "$PY" -c "import $mods" 2>/dev/null && return 0
    [ "$install" = 1 ] || die "$venv lacks some of: $mods (and --no-install was given)"
    echo "== installing $mods into $venv" >&2
    "$PY" -m pip install -q --upgrade pip >&2 || true
    if [ "$index" = cpu ]; then
        # the CPU-only wheel is far smaller; where that index is unreachable, PyPI's torch runs on CPUs too
        "$PY" -m pip install -q --timeout 20 --retries 1 torch --index-url https://download.pytorch.org/whl/cpu >&2 ||
            "$PY" -m pip install -q torch >&2 || die "pip could not install torch"
    else
        "$PY" -m pip install -q torch >&2 || die "pip could not install torch"
    fi
    [ $# -eq 0 ] || "$PY" -m pip install -q "$@" >&2 || die "pip could not install $*"
    "$PY" -c "import $mods" || die "$venv still cannot import $mods"
}

# machine_lines: markdown bullet lines describing this machine and checkout.
machine_lines() {
    local cpu mem commit
    cpu="$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1 || true)"
    mem="$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null)"
    commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    git diff --quiet HEAD 2>/dev/null || commit="$commit (with uncommitted changes)"
    echo "- machine: ${cpu:-unknown CPU}, $(nproc) CPUs, ${mem:-? GiB}; $(uname -sr)"
    echo "- tfuse: commit $commit, ${TFUSE:-?} (${BUILD_TYPE:-prebuilt})"
    [ -z "${LOAD_AT_START:-}" ] ||
        echo "- load average (1 min) when the run started: $LOAD_AT_START$(awk -v l="$LOAD_AT_START" \
             'BEGIN { if (l + 0 > 0.5) print " — other work was running: these timings are skewed" }')"
}

# append_results SECTION_FILE: append a section to bench/RESULTS.md (made with a header if new).
append_results() {
    if [ ! -f bench/RESULTS.md ]; then
        printf '# Benchmark results\n\nEach section is appended by bench/run.sh (CPU) or bench/gpu.sh (GPU); bench/README.md says how they measure.\n\n' \
            > bench/RESULTS.md
    fi
    cat "$1" >> bench/RESULTS.md
    echo "== appended to bench/RESULTS.md" >&2
}
