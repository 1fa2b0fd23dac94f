# Steps with time limits, for scripts/gpu-check.sh (sourced; bash only).
#
#   steps_begin BUDGET_S [KILL_UNDER] [ONLY]
#                                       start; the whole run gets BUDGET_S;
#                                       ONLY (an extended regex) runs only
#                                       the steps whose names match
#   steps_part NAME BUDGET_S            the steps after it (to the next
#                                       part) keep within BUDGET_S, and
#                                       within the whole run's budget
#   step NAME LIMIT_S CMD [ARGS...]     run CMD (a program, or a function
#                                       exported with export -f) under
#                                       `timeout -k 10`; STEPS_LAST is then
#                                       PASS, FAIL or NOT RUN
#   steps_stop WHY PARTS...             the check cannot go on: name the
#                                       parts left as not run, and why
#   steps_summary                       print the summary; return the failures
#
# Each step runs under `timeout -k 10 LIMIT` (SIGTERM to the step's process
# group at LIMIT, SIGKILL 10 s later), capped so that its part ends within
# the part's budget and the whole run within BUDGET_S (15 s of each stay for
# the kill grace and the summary): a step the budget no longer allows is
# reported as not run (a failure) instead of started. Its elapsed time is printed as soon as it
# ends, and a timed-out step is named as such. After each step, processes
# left running from executables under KILL_UNDER (the bundle's binaries)
# are killed and named, so the next step finds the GPU free.

steps_begin() {
  STEPS_END=$((SECONDS + $1))
  STEPS_KILL_UNDER=${2:-}
  STEPS_ONLY=${3:-}
  STEPS_SUMMARY=()
  STEPS_FAILED=0
  STEPS_LAST=
  STEPS_PART=
  STEPS_PART_END=$STEPS_END
}

steps_part() {
  STEPS_PART=$1
  STEPS_PART_END=$((SECONDS + $2))
  [ "$STEPS_PART_END" -le "$STEPS_END" ] || STEPS_PART_END=$STEPS_END
  printf '\n######## part %s (budget %d s)\n' "$1" "$2"
}

steps_stop() {
  local why=$1 p
  shift
  printf '\n==== STOP: %s; not run: %s\n' "$why" "${*:-nothing}"
  for p in "$@"; do
    STEPS_SUMMARY+=("NOT RUN  part $p: the check stopped (STOP above)")
  done
}

# Kills what is left of the bundle's programs (by executable path).
steps_leftovers() {
  [ -n "$STEPS_KILL_UNDER" ] || return 0
  local p exe left=()
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case $exe in "$STEPS_KILL_UNDER"/*) left+=("${p#/proc/}") ;; esac
  done
  [ ${#left[@]} -gt 0 ] || return 0
  echo "left running after the step, killed: ${left[*]}" >&2
  kill -KILL "${left[@]}" 2>/dev/null
  # Until they are gone (at most 10 s), so the next step finds the GPU free.
  local pid alive
  for _ in $(seq 100); do
    alive=0
    for pid in "${left[@]}"; do
      exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
      case $exe in "$STEPS_KILL_UNDER"/*) alive=1 ;; esac
    done
    [ "$alive" = 1 ] || break
    sleep 0.1
  done
  return 1
}

step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "$STEPS_ONLY" ] && ! printf '%s\n' "$name" | grep -Eq -- "$STEPS_ONLY"; then
    printf '\n==== %s: not selected\n' "$name"
    STEPS_LAST=
    return 0
  fi
  # 15 s of the budget stay for the kill grace and the summary.
  local left=$((STEPS_PART_END - SECONDS - 15)) whose=
  [ -z "$STEPS_PART" ] || whose=" (part $STEPS_PART's)"
  if [ "$left" -lt 5 ]; then
    printf '\n==== %s: NOT RUN (the budget%s is spent)\n' "$name" "$whose"
    STEPS_SUMMARY+=("NOT RUN  $name: the budget is spent$whose")
    STEPS_FAILED=$((STEPS_FAILED + 1))
    STEPS_LAST="NOT RUN"
    return 0
  fi
  [ "$limit" -le "$left" ] || limit=$left
  printf '\n==== %s (limit %d s)\n$ %s\n' "$name" "$limit" "$*"
  # `timeout` runs programs: a shell function (exported with `export -f`)
  # runs in a child bash.
  if declare -F "$1" >/dev/null; then
    set -- bash -c '"$@"' "$1" "$@"
  fi
  local t0=$SECONDS rc
  timeout -k 10 "$limit" "$@"
  rc=$?
  local dt=$((SECONDS - t0)) verdict
  case $rc in
    0) verdict="PASS  $name" ;;
    124 | 137) verdict="FAIL  $name: timed out after $limit s" ;;
    *) verdict="FAIL  $name: exit status $rc" ;;
  esac
  if ! steps_leftovers && [ "$rc" -eq 0 ]; then
    verdict="FAIL  $name: left processes running"
  fi
  case $verdict in FAIL*) STEPS_FAILED=$((STEPS_FAILED + 1)) ;; esac
  STEPS_LAST=${verdict%% *}
  printf '==== %s (%d s)\n' "$verdict" "$dt"
  STEPS_SUMMARY+=("$verdict ($dt s)")
}

steps_summary() {
  printf '\n==== summary\n'
  printf '%s\n' "${STEPS_SUMMARY[@]}"
  echo "failed steps: $STEPS_FAILED"
  return "$STEPS_FAILED"
}
