#!/usr/bin/env bash
# The alternating comparison of the performance ledger (docs/ledger.md): builds the tree at
# hand (side B) and a base commit's headers (side A) into one harness (bench/ab/), runs every
# ledger row on both in one process, call by call, and prints per row the two best times,
# B / A and B's throughput against the in-run baselines (FMA peak, streaming read), flagging
# any row where B is more than 10% slower. Run it before a kernel change lands, on the CPU
# at hand; --record appends the run to the ledger under this CPU's model.
#
#   scripts/ab_compare.sh [--base REV] [--reps N] [--rows i,j,...] [--record] [--smoke]
#
# --base REV   side A (default: the last commit the ledger records)
# --reps N     alternating rounds per row (default 10; the best call of each side counts)
# --rows LIST  only these rows (indices into bench/ab/ab_rows.hpp's kRows)
# --record     append this run to docs/ledger.md (CPU model, commits, date, figures)
# --smoke      two small rows, one round: checks that the harness builds and runs
# --a-cxxflags STR, --b-cxxflags STR   extra flags for one side's build, e.g. the same tree
#              on both sides with -DAB_DECODE_PREFETCH=Off on one (a run-time choice compared)
# Environment: CXX (default g++), EIGEN_INCLUDE (default /usr/include/eigen3).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ledger="$root/docs/ledger.md"
base="" reps=10 rows="" record=0 smoke=0 a_flags="" b_flags="" 
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --record) record=1; shift ;;
    --smoke) smoke=1; shift ;;
    --a-cxxflags) a_flags=$2; shift 2 ;;
    --b-cxxflags) b_flags=$2; shift 2 ;;
    *) echo "ab_compare.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [ -z "$base" ]; then
  base=$(sed -n 's/^<!-- ledger: tree=\([0-9a-f]*\).*/\1/p' "$ledger" 2>/dev/null | tail -n 1)
  [ -n "$base" ] || base=HEAD
fi
base_commit=$(git -C "$root" rev-parse --short=12 "$base^{commit}")
tree_commit=$(git -C "$root" rev-parse --short=12 HEAD)
if [ -n "$(git -C "$root" status --porcelain -- include bench/ab)" ]; then
  tree_commit="$tree_commit+changes"
fi
cxx=${CXX:-g++}
eigen=${EIGEN_INCLUDE:-/usr/include/eigen3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/a"
git -C "$root" archive "$base_commit" include | tar -x -C "$work/a"
flags=(-std=c++17 -O3 -march=native -fopenmp -DNDEBUG -isystem "$eigen" -I "$root/bench/ab")
echo "ab_compare: A = $base_commit (headers), B = $tree_commit (this tree); building" >&2
"$cxx" "${flags[@]}" -I "$work/a/include" -Dattnkit=attnkit_a -DAB_SIDE=ab_a $a_flags \
  -c "$root/bench/ab/ab_side.cpp" -o "$work/a.o" &
side_a=$!
"$cxx" "${flags[@]}" -I "$root/include" -Dattnkit=attnkit_b -DAB_SIDE=ab_b $b_flags \
  -c "$root/bench/ab/ab_side.cpp" -o "$work/b.o" &
side_b=$!
# The FMA-peak loop needs its multiply-adds fused (ISO C++ modes do not contract them).
"$cxx" "${flags[@]}" -ffp-contract=fast -c "$root/bench/ab/ab_main.cpp" -o "$work/main.o"
# Both sides finish before anything fails (no compiler left writing into a removed folder).
built=0
wait "$side_a" || built=1
wait "$side_b" || built=1
[ "$built" = 0 ] || { echo "ab_compare: a side did not build" >&2; exit 1; }
"$cxx" -fopenmp "$work/a.o" "$work/b.o" "$work/main.o" -o "$work/ab"
args=(--reps "$reps")
[ -n "$rows" ] && args+=(--rows "$rows")
[ "$smoke" = 1 ] && args+=(--smoke)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
echo "ab_compare: CPU: $cpu; $(nproc) cores; running" >&2
OMP_WAIT_POLICY=PASSIVE "$work/ab" "${args[@]}" | tee "$work/out.tsv"
if [ "$record" = 1 ]; then
  {
    echo
    echo "### $cpu -- $(date -u +%Y-%m-%d), B = $tree_commit against A = $base_commit"
    echo
    echo "<!-- ledger: tree=${tree_commit%+changes} base=$base_commit cpu=$cpu -->"
    awk -F '\t' '
      $1 == "baseline" { printf "- in-run baseline: %s %s\n", $2, $3; next }
      $1 == "row" { print ""; print "| row | A ms | B ms | B / A | B | of baseline | |"; print "|---|---|---|---|---|---|---|"; next }
      NF >= 6 { printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }
    ' "$work/out.tsv"
  } >>"$ledger"
  echo "ab_compare: appended to $ledger" >&2
fi
