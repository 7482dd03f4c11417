#!/usr/bin/env bash
# On a GPU machine (the H200): build, run every test, run the GPU tests under compute-sanitizer
# (memcheck, racecheck), prepare the production peers, bench every chapter (with Nsight Compute
# DRAM bytes) and refresh the results; grade the exercise trees. Uses the machine's own python3
# (torch, numpy, ml_dtypes, nanobind, pytest must be there); writes logs and results under $OUT
# (default ./device-out).
#   tools/device_check.sh build test sanitize peers bench ncu layer promotion grade  # any subset, in this order
# peers: where the ignored folder .peers/ holds copies of the peer kit (../shared/peers/README.md:
# its wheels, fi_aot_*.tar.xz, vllm_so/), install the wheels into $LKW_PEERS_SITE (default
# /tmp/site), put it on PYTHONPATH and point LKW_PEERS_DIR at .peers/, so the bench (lkw.peers)
# finds vLLM, FlashInfer and Liger; without .peers/ the bench skips them and says why. The bench,
# ncu and layer stages prepare them too, unless LKW_NO_PEERS=1.
# LKW_BENCH_ARGS: more arguments of tools/bench.py (e.g. "--op X --merge"); LKW_BENCH_PARTS:
# ';'-separated argument sets, each a run of its own merged into $out/results (see the stage; a
# chapter's own parts: "--part N", listed by tools/bench.py --parts).
# LKW_CHAPTERS="06_int4_gemv": only these chapters; LKW_SANITIZE_FILTER="*v14*:*V14*": the GPU tests
# the sanitizers run (a gtest filter; default every GPU test of the chapters); LKW_SANITIZE_TIMEOUT
# (seconds a run, default 900) and LKW_SANITIZE_RESUMES (runs resumed past a hung test, default 3).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
out="${OUT:-$repo/device-out}"
mkdir -p "$out"
stages="${*:-build test sanitize peers bench ncu grade}"
archs="${LKW_ARCHS:-90a}"
tree=solutions; [ -d solutions ] || tree=chapters  # a student hand-out has no solutions/
chapters="${LKW_CHAPTERS:-$(ls -d $tree/[0-9][0-9]_* | xargs -n1 basename | tr '\n' ' ')}"  # LKW_CHAPTERS="02_int4_dequant": only these
only="$(echo ${LKW_CHAPTERS:-} | tr ' ' ';')"  # and only these are built (with what they link: CMakeLists.txt)
py="$(command -v python3)"
log="$out/device.log"
status=0
has() { [[ " $stages " == *" $1 "* ]]; }
step() { echo; echo "=== $*" | tee -a "$log"; }
# The recorded runs (results/<gpu>/*.json) into $out/results: a merged run starts from them. A file
# there newer than the recorded one (an earlier stage's or invocation's merge in the same $OUT) is
# kept: two bench invocations in one call must not lose the first one's rows.
copy_recorded() {
  for d in results/*/; do
    compgen -G "$d*.json" >/dev/null && mkdir -p "$out/results/$(basename "$d")" && cp -u "$d"*.json "$out/results/$(basename "$d")/"
  done
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$log"

if has build; then
  step "build (sm_$archs)"
  cmake -S . -B build -G Ninja -Wno-dev -DCMAKE_CUDA_ARCHITECTURES="$archs" \
    -DPython_EXECUTABLE="$py" -DLKW_ONLY="$only" >>"$log" 2>&1 && cmake --build build -j 16 >>"$log" 2>&1 \
    || { echo "build failed"; tail -40 "$log"; exit 1; }
fi

if has test; then
  step "ctest"
  # A kernel that waits on a barrier nobody arrives at hangs its test binary: the timeouts turn
  # that into a failure that names the test, instead of the machine's call limit.
  ctest --test-dir build --output-on-failure -j 4 --timeout "${LKW_TEST_TIMEOUT:-300}" 2>&1 | tee -a "$log" | tail -25
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  step "pytest"
  "$py" -m pytest tests/python -q -x -p no:cacheprovider 2>&1 | tee -a "$log" | tail -8
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if has sanitize; then
  # The golden data is written by the ctest fixture; a sanitize stage without the test stage makes
  # it here, or the sanitizers would find no case to run.
  for c in $chapters; do
    [ -f "build/golden/$c/manifest.txt" ] || PYTHONPATH=reference "$py" -m lkw.golden --out build/golden \
      --chapter "$c" >>"$log" 2>&1 || { echo "golden data for $c failed (see $log)"; status=1; }
  done
  # Does racecheck follow mbarrier ordering? A correct two-slot ring (mode 0) and one released
  # before its read (mode 2, a real race) under the tool: where the correct ring is flagged as
  # well, the tool cannot judge shared memory that threads write and mbarriers order, and chapter
  # 08's blockwise v5 kernels (the scale warp's slots) are memchecked only, saying so.
  mbarrier_blind=""
  if [ -x build/lkw_racecheck_probe ]; then
    step "racecheck probe: a correct mbarrier ring, then a racy one"
    compute-sanitizer --tool racecheck --error-exitcode 9 build/lkw_racecheck_probe 0 >>"$log" 2>&1; rc0=$?
    compute-sanitizer --tool racecheck --error-exitcode 9 build/lkw_racecheck_probe 2 >>"$log" 2>&1; rc2=$?
    [ $rc2 = 9 ] || { echo "racecheck missed the probe's real race (rc $rc2)"; status=1; }
    if [ $rc0 = 9 ]; then
      mbarrier_blind=1
      # v6 (and its one-knob ablations) hand M > 16 to v5: they go with v5; the GEMV stays racechecked
      # through the ablations (ablation_v6_gemv_only runs it on every case). v7's scale warp fills
      # its slots as v5's does: v7 and its ablations go with v5 too.
      echo "racecheck flags the correct mbarrier ring too: blockwise v5 and v7 (08) are left to memcheck"
    elif [ $rc0 != 0 ]; then
      echo "the racecheck probe's correct ring failed (rc $rc0)"; status=1
    else
      echo "racecheck follows mbarrier ordering: every kernel is racechecked"
    fi
  fi
  for tool in memcheck racecheck; do
    for c in $chapters; do
      t=build/test_$c
      step "compute-sanitizer --tool $tool $t"
      # Versions that call cuBLAS (their id says so) are memchecked but not racechecked: racecheck
      # reports hazards inside cuBLAS's own kernels (nvjet*), which order their shared memory with
      # TMA and wgmma barriers it does not follow, and excluding those kernels by name crashes it.
      # Mutants are left out: a slip that shows only when copies race (a missing wait) may not show
      # under a sanitizer, which serializes the kernel; ctest runs them, and the race mutants have
      # their own racecheck run below.
      filter="${LKW_SANITIZE_FILTER:--*Host*:*Validation*:Chapter/Mutant.*}"
      # A filter given by hand keeps the cuBLAS exclusion of racecheck (gtest: "POS-NEG:NEG").
      if [ "$tool" = racecheck ]; then [[ "$filter" == *-* ]] && filter="$filter:*cublas*" || filter="$filter-*cublas*"; fi
      [ "$tool" = racecheck ] && [ -n "$mbarrier_blind" ] &&
        filter="$filter:*fp8_gemm_blockwise__v5_*:*fp8_gemm_blockwise__ablation_v5_*:*fp8_gemm_blockwise__v6_small_m_*:*fp8_gemm_blockwise__ablation_v6_no_pdl_*:*fp8_gemm_blockwise__ablation_v6_one_row_tile_*:*fp8_gemm_blockwise__v7_*:*fp8_gemm_blockwise__ablation_v7_*"
      run_log="$out/sanitize_${tool}_$c.log"
      : >"$run_log"
      # A test that hangs under the tool (it serializes the blocks: a barrier across CTAs may never
      # complete) would take the rest of the chapter with it. Each test's "[ RUN ]" line is in the
      # log (no --gtest_brief), so a run the timeout stops names the test it stopped in; the run
      # then resumes without that test and those that passed, up to LKW_SANITIZE_RESUMES times,
      # and the hung tests count as failures, named.
      hung="" ran=0 resumes=0 pass_filter="$filter"
      # LKW_GRAPH_STEPS: chapter 11's graph test replays its decode step 2 times, not 100, under
      # racecheck: the tool's host memory grows by about 1.5 GB a replay of the W4A16 layer, and
      # 100 replays ran the machine out of memory (killed, no report). memcheck replays all 100.
      steps_cap=""; [ "$tool" = racecheck ] && steps_cap=2
      while :; do
        part_log="$run_log.part"
        LKW_GRAPH_STEPS=$steps_cap LKW_GOLDEN_DIR=build/golden timeout "${LKW_SANITIZE_TIMEOUT:-900}" compute-sanitizer --tool "$tool" \
          --error-exitcode 9 "$t" --gtest_filter="$pass_filter" >"$part_log" 2>&1
        rc=$?
        cat "$part_log" >>"$run_log"
        n=$(grep -aoE '^\[==========\] [0-9]+ tests? from' "$part_log" | tail -1 | grep -oE '[0-9]+' | head -1)
        ran=$((ran + ${n:-0}))
        [ $rc = 124 ] || break
        stuck=$(grep -a '^\[ RUN' "$part_log" | tail -1 | sed -E 's/^\[ RUN +\] //')
        echo "$tool timed out in: $stuck" >>"$run_log"
        hung="$hung $stuck"
        passed=$(grep -aE '^\[ +OK \] ' "$part_log" | sed -E 's/^\[ +OK \] ([^ ]+).*/\1/')
        npassed=$(echo "$passed" | grep -c .)
        ran=$((ran + npassed))
        [ -n "$stuck" ] && [ $resumes -lt "${LKW_SANITIZE_RESUMES:-3}" ] || break
        resumes=$((resumes + 1))
        skip=$(echo $passed $stuck | tr ' ' ':')
        [[ "$pass_filter" == *-* ]] && pass_filter="$pass_filter:$skip" || pass_filter="$pass_filter-$skip"
        echo "$tool: resuming without the hung test and the $npassed that passed" >>"$run_log"
      done
      rm -f "$run_log.part"
      cat "$run_log" >>"$log"
      tail -4 "$run_log"
      # A filter that matches no test checks nothing: say so, and count it as a failure.
      echo "$tool ran $ran tests of $t"
      [ $rc = 0 ] && [ "$ran" = 0 ] && { echo "$tool: no test of $t matched the filter"; rc=8; }
      [ -n "$hung" ] && { echo "$tool hung in:$hung"; rc=124; }
      [ $rc = 0 ] || { echo "$tool FAILED on $t (rc $rc)"; status=1; }
      # A race mutant (tests/cpp/golden_main.cu) must make racecheck report hazards.
      if [ "$tool" = racecheck ] && LKW_GOLDEN_DIR=build/golden "$t" --gtest_list_tests 2>/dev/null | grep -q "mutant_race_"; then
        step "racecheck must catch the race mutants of $c"
        LKW_RACE_MUTANTS=1 LKW_GOLDEN_DIR=build/golden compute-sanitizer --tool racecheck --error-exitcode 9 \
          "$t" --gtest_filter="*mutant_race_*" --gtest_brief=1 >>"$log" 2>&1
        rc=$?
        tail -2 "$log"
        [ $rc = 9 ] && echo "race mutants of $c caught by racecheck" | tee -a "$log" \
          || { echo "racecheck did NOT catch the race mutants of $c (rc $rc)"; status=1; }
      fi
    done
  done
fi

# The stages that time the peers prepare them too where the kit is here (LKW_NO_PEERS=1: not):
# a bench or layer run without the peers stage would skip them all.
if has peers || { [ -z "${LKW_NO_PEERS:-}" ] && [ -d .peers ] && { has bench || has ncu || has layer; }; }; then
  step "peers (the kit in .peers/)"
  if compgen -G ".peers/*.whl" >/dev/null || [ -d .peers/vllm_so ]; then
    site="${LKW_PEERS_SITE:-/tmp/site}"
    mkdir -p "$site"
    if compgen -G ".peers/*.whl" >/dev/null; then
      "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .peers/*.whl \
        >>"$log" 2>&1 || { echo "peers: pip install into $site failed (see $log)"; status=1; }
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" LKW_PEERS_DIR="$repo/.peers" LKW_PEERS_SITE="$site"
    export LKW_PEERS_CACHE="${LKW_PEERS_CACHE:-/tmp/lkw_peers}"
    # Loads each library once (extracting the FlashInfer AOT modules and the vLLM libraries), so a
    # broken kit shows here, before the bench.
    PYTHONPATH="reference:$PYTHONPATH" "$py" - <<'PY' 2>&1 | tee -a "$log"
from lkw import peers
for lib, st in peers.status().items():
    print("peers:", lib, "loaded:" if st["available"] else "SKIPPED:", st["detail"])
PY
  else
    echo "peers: no kit in .peers/ (../shared/peers/README.md): the bench skips the production peers" | tee -a "$log"
  fi
fi

if has bench; then
  step "bench"
  args=(--write-results --results-dir "$out/results")
  for c in $chapters; do args+=(--chapter "$c"); done
  has ncu && args+=(--ncu)
  # LKW_BENCH_ARGS="--op per_group_fp8 --merge": a partial run, merged into the recorded results.
  read -r -a extra <<<"${LKW_BENCH_ARGS:-}"
  args+=("${extra[@]}")
  # A merged run (--merge, or parts) starts from the recorded runs.
  if [[ " ${LKW_BENCH_ARGS:-} " == *" --merge "* || -n "${LKW_BENCH_PARTS:-}" ]]; then
    copy_recorded
  fi
  if [ -n "${LKW_BENCH_PARTS:-}" ]; then
    # LKW_BENCH_PARTS="--op a;--op b --shape 'e=256,'": each part its own run (LKW_PART_TIMEOUT
    # seconds, default 280), merged into $out/results in turn: a part cut short loses only its rows.
    IFS=';' read -r -a parts <<<"$LKW_BENCH_PARTS"
    for part in "${parts[@]}"; do
      step "bench part: $part"
      eval "set -- $part"
      PYTHONPATH="reference${PYTHONPATH:+:$PYTHONPATH}" LKW_COMMIT="${LKW_COMMIT:-}" PYTHONUNBUFFERED=1 \
        timeout "${LKW_PART_TIMEOUT:-280}" "$py" tools/bench.py "${args[@]}" --merge "$@" 2>&1 | tee -a "$log" | grep -vE "^  |^bench:"
      rc=${PIPESTATUS[0]}
      [ "$rc" = 0 ] || { echo "bench part '$part' failed or timed out (rc $rc)" | tee -a "$log"; status=1; }
    done
  else
    PYTHONPATH="reference${PYTHONPATH:+:$PYTHONPATH}" LKW_COMMIT="${LKW_COMMIT:-}" "$py" tools/bench.py "${args[@]}" 2>&1 | tee -a "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  fi
fi

if has layer; then
  # Chapter 11's layer bench (python -m lkw.layer_bench), merged into the recorded run: the whole
  # matrix is more than one device call, so LKW_LAYER_ARGS names a part, e.g.
  # "--formats w4a16 --cases 'decode 1,decode 32'" (the peers, for the production-kernel layer,
  # prepared above).
  step "layer bench"
  copy_recorded
  eval "set -- ${LKW_LAYER_ARGS:-}"
  PYTHONPATH="reference${PYTHONPATH:+:$PYTHONPATH}" LKW_RESULTS_DIR="$out/results" LKW_COMMIT="${LKW_COMMIT:-}" \
    PYTHONUNBUFFERED=1 timeout "${LKW_PART_TIMEOUT:-480}" "$py" -m lkw.layer_bench --write-results --merge "$@" 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "layer bench failed or timed out"; status=1; }
fi

if has promotion; then
  # Chapter 08's promotion experiment (tools/promotion.py): v4 with and without promotion against K.
  step "promotion experiment"
  # The results folder of this GPU (lkw.results.gpu_slug: h100, h200, ...).
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | PYTHONPATH=reference "$py" -c \
    "import sys; from lkw.results import gpu_slug; print(gpu_slug(sys.stdin.read().strip()))")
  PYTHONPATH="reference${PYTHONPATH:+:$PYTHONPATH}" LKW_COMMIT="${LKW_COMMIT:-}" "$py" tools/promotion.py \
    --write "$out/results/$gpu/experiments/08_promotion.json" 2>&1 | tee -a "$log" || status=1
fi

if has grade; then
  for chapter in $chapters; do
    step "grade $chapter from chapters/"
    LKW_ONLY="$only" "$py" tools/grade.py --chapter "$chapter" --archs "$archs" --build-dir "build-grade-$chapter" \
      --out "$out/grade_$chapter.json" 2>&1 | tail -30 | tee -a "$log"
  done
fi

# What a device call brings back is a few files, two folders deep (8 at most on the lent H100s and
# H200s): the recorded runs copied in above that no stage changed are removed, with the folders
# left empty, and an experiment's file (results/<gpu>/experiments/x.json, a folder too deep) comes
# up beside its GPU's runs as experiments--x.json. LKW_KEEP_RECORDED=1 keeps them all as they are.
# Bring them home: cp $OUT/results/<gpu>/*.json results/<gpu>/, experiments--x.json to
# results/<gpu>/experiments/x.json.
prune_results() {
  [ -d "$out/results" ] && [ -z "${LKW_KEEP_RECORDED:-}" ] || return 0
  local f rel
  for f in "$out"/results/*/*.json "$out"/results/*/experiments/*.json; do
    [ -f "$f" ] || continue
    rel="${f#"$out"/}"
    if [ -f "$rel" ] && cmp -s "$f" "$rel"; then
      rm -f "$f"
    elif [[ "$rel" == results/*/experiments/* ]]; then
      mv "$f" "$(dirname "$(dirname "$f")")/experiments--$(basename "$f")"
    fi
  done
  find "$out/results" -depth -type d -empty -delete
  echo "device_check: the results that changed: $(cd "$out" && find results -type f 2>/dev/null | sort | tr '\n' ' ')"
  echo "device_check: $(find "$out" -type f | wc -l) files under \$OUT (a device call brings back 8)"
}
prune_results

echo; echo "device_check: status $status"
exit $status
