#!/usr/bin/env bash
# One device call on the GPU machine (16 cores, root; CPU tensors): ring order across switches.
# Builds the extension in place, brings up an emulated cluster of SWITCHES (4) switches x
# HOSTS_PER_SWITCH (3) hosts at RATE (5gbit) whose uplinks (none for SWITCHES=1) run at UPLINK_RATE (default: the host
# rate), with the bundled ip/tc (bench/bundle_iproute.sh -> .tools/iproute, carried along; nothing
# else is needed: iperf3 comes from the bundle when it is there, else the Python socket fallback),
# measures single-stream goodput inside a switch and across an uplink, then runs all_reduce at
# SIZES (16M,64M) with ROUNDS (2) rounds of ITERS (4) timed iterations, ranks launched with
# --rank-order RANK_ORDER (shuffle:1: with 4x3 hosts every ring neighbour of the launcher's order
# sits on another switch), mccl and gloo side by side, in three configurations, each its own
# mccl.bench invocation:
#
#   a-topology  MCCL_ALGO=ring                       the flat ring in topology order: subnet /24
#                                                    groups (one per switch), each switch's ranks
#                                                    together, so one ring stream per uplink and way
#   b-unordered MCCL_ALGO=ring MCCL_TOPOLOGY_GROUP=all   the same group name for every rank: one
#                                                    group, the ring follows the shuffled rank order,
#                                                    so every hop crosses an uplink (3 streams each)
#   c-twolevel  MCCL_ALGO=twolevel                   reduce-scatter in each switch, all-reduce across
#                                                    switches per shard, all-gather in each switch
#
# A configuration may carry more variables for its run: NAME@K=V,K2=V2 (e.g.
# a-topology@MCCL_RUNTIME_CONNECT=1). SIZES=a+b, ROUNDS=k and ITERS=k there set that run's sizes,
# rounds and iterations; a relative MCCL_TRACE lands under the results folder (created). Its files
# are named NAME@K=V,... ('/' as '_'). A configuration listed again runs again (alternate two to
# compare them round by round); its files get ~2, ~3, ...
#
# MCCL_ALGO and MCCL_TOPOLOGY_GROUP as csrc/algo/select.c and csrc/core/topology.c read them
# (ring | tree/doubling | twolevel/two-level; MCCL_TOPOLOGY_GROUP overrides the group of the rank
# that has it). gloo ignores both: its rows are the same job three times (its ring is rank order).
# MCCL_DEBUG=INFO MCCL_DEBUG_SUBSYS=INIT,COLL logs each rank's topology group, the number of
# groups, the ring order and the algorithm every all_reduce runs as; checks.txt holds PASS/FAIL
# lines read from those logs (one group in b, SWITCHES groups in a and c, ring or two-level).
#
# Everything lands in bench/results/device-switches-<date>/ (RES overrides it), tarred into
# $OUT/results.tgz on every exit path, the cluster torn down.
#
#   bash bench/device_switches.sh
#   BUILD=0 PY=.venv/bin/python SWITCHES=2 HOSTS_PER_SWITCH=2 RATE=200mbit SIZES=256K,1M ROUNDS=1 \
#     ITERS=2 RES=/tmp/sw bash bench/device_switches.sh           # the 2-core machine, end to end
#
# Environment: SWITCHES, HOSTS_PER_SWITCH, RATE, UPLINK_RATE, SIZES, ROUNDS, ITERS, WARMUP (1),
# TCP_CC (every host's TCP congestion control, e.g. cubic, macOS's default; unset: the machine's;
# not CC, which make reads as its C compiler), RANK_ORDER, CONFIGS ("a-topology b-unordered
# c-twolevel"), BACKENDS (mccl,gloo), GOODPUT_SECONDS (5 for the cluster tool, 3 inside each
# benchmark), DEADLINE (seconds per benchmark, 110: every rank is killed after it, so a hung job
# costs one configuration), ID (cluster id, s0), BUILD (1: build the extension first), PY
# (python3), IPROUTE_DIR (.tools/iproute).
#
# Time on the 16-core machine, 4x3 hosts at 5 Gbit/s (an estimate, not yet run there; the script
# logs every phase's start in timing.txt): build 30-90 s, up + connectivity check ~10 s, two
# goodputs 12 s; per configuration ~15 s to start 12 ranks and their groups, 8 s for its two
# goodputs, then 2 rounds x 2 sizes x 2 backends of a check pass, 1 warm-up and 4 timed calls: at
# 0.6 GB/s busbw a 64 MiB all-reduce on 12 ranks takes 2 x 11/12 x 64 MiB / 0.6 GB/s = 0.21 s
# (three times that where 3 ring streams share an uplink: gloo everywhere, mccl in b), the check
# pass ~2 s at 64 MiB (12 source patterns of 16M elements per rank): 20-30 s; so 45-55 s per
# configuration, 3.5-4.5 minutes in all; with every deadline hit at most 90 + 25 + 3 x 115 s, 7.7
# minutes, inside the 10-minute call. The scaled-down run above (2x2 at 200mbit, 4 ranks on 2
# cores) took 68 s: 18 s of goodput, 15 s per configuration.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
SWITCHES=${SWITCHES:-4} HOSTS_PER_SWITCH=${HOSTS_PER_SWITCH:-3} RATE=${RATE:-5gbit}
UPLINK_RATE=${UPLINK_RATE:-$RATE} SIZES=${SIZES:-16M,64M} ROUNDS=${ROUNDS:-2} ITERS=${ITERS:-4} WARMUP=${WARMUP:-1}
RANK_ORDER=${RANK_ORDER:-shuffle:1} CONFIGS=${CONFIGS:-a-topology b-unordered c-twolevel} BACKENDS=${BACKENDS:-mccl,gloo}
GOODPUT_SECONDS=${GOODPUT_SECONDS:-5} DEADLINE=${DEADLINE:-110} ID=${ID:-s0} PY=${PY:-python3}
IPROUTE_DIR=${IPROUTE_DIR:-$PWD/.tools/iproute}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
if [ "${BUILD:-1}" = 1 ]; then
  "$PY" setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
fi
RES=${RES:-bench/results/device-switches-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$RES"
stamp() { echo "$(( $(date +%s) - T0 )) s  $*" | tee -a "$RES/timing.txt"; }
cl() { "$PY" -m mccl.cluster --iproute-dir "$IPROUTE_DIR" "$@"; }
trap 'cl down --id "$ID" >/dev/null 2>&1; stamp "end"; tar czf "${OUT:-/tmp}/results.tgz" "$RES"' EXIT
trap 'exit 130' INT TERM HUP
stamp "built (BUILD=${BUILD:-1})"
if [ "$(id -u)" != 0 ]; then echo "device_switches.sh: needs root (network namespaces, veths, tc)" >&2; exit 2; fi

cl down --id "$ID" >/dev/null 2>&1   # whatever a crashed earlier run left
UPLINK=(--uplink-rate "$UPLINK_RATE"); [ "$SWITCHES" = 1 ] && UPLINK=()  # one switch has no uplink
cl up --id "$ID" --switches "$SWITCHES" --hosts-per-switch "$HOSTS_PER_SWITCH" --rate "$RATE" \
  "${UPLINK[@]}" > "$RES/cluster.txt" || { cat "$RES/cluster.txt"; exit 1; }
stamp "cluster up: $SWITCHES switches x $HOSTS_PER_SWITCH hosts at $RATE, uplinks $UPLINK_RATE"
if [ -n "${TCP_CC:-}" ]; then  # every host's TCP congestion control (a netns may pick only what the host allows)
  A=/proc/sys/net/ipv4/tcp_allowed_congestion_control
  grep -qw "$TCP_CC" $A || echo "$(cat $A) $TCP_CC" > $A || exit 1
  for i in $(seq 0 $(( SWITCHES * HOSTS_PER_SWITCH - 1 ))); do
    "$IPROUTE_DIR/ip" netns exec "mccl-$ID-h$i" sh -c "echo $TCP_CC > /proc/sys/net/ipv4/tcp_congestion_control" || exit 1
  done
  echo "# congestion control: $("$IPROUTE_DIR/ip" netns exec "mccl-$ID-h0" cat /proc/sys/net/ipv4/tcp_congestion_control)" \
    | tee -a "$RES/cluster.txt"
fi
cl goodput --id "$ID" --seconds "$GOODPUT_SECONDS" | tee -a "$RES/cluster.txt"
[ "$SWITCHES" = 1 ] || cl goodput --id "$ID" --seconds "$GOODPUT_SECONDS" --across-switches | tee -a "$RES/cluster.txt"
{ echo "# $(date -Is) $(uname -srm), $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# git $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | grep -q . && echo '(dirty)')"
  env | grep -E '^MCCL_' || true; } >> "$RES/cluster.txt"
stamp "goodput measured"

: > "$RES/checks.txt"
check() {  # check NAME COUNT_WANTED PATTERN FILE: PASS when grep -cF finds PATTERN COUNT_WANTED times
  local got; got=$(grep -cF -- "$3" "$4"); got=${got:-0}
  if [ "$got" = "$2" ]; then echo "PASS $1: '$3' x $got" >> "$RES/checks.txt"
  else echo "FAIL $1: '$3' x $got, wanted $2" >> "$RES/checks.txt"; fi
}
NRANKS=$(( SWITCHES * HOSTS_PER_SWITCH ))
declare -A seen
NAMES=""
for spec in $CONFIGS; do
  seen[$spec]=$(( ${seen[$spec]:-0} + 1 ))
  cfg=${spec//\//_}; [ "${seen[$spec]}" -gt 1 ] && cfg="$cfg~${seen[$spec]}"  # a file name
  NAMES="$NAMES $cfg"
  base=${spec%%@*}
  case $base in
    a-topology)  envs=(MCCL_ALGO=ring) ;;
    b-unordered) envs=(MCCL_ALGO=ring MCCL_TOPOLOGY_GROUP=all) ;;
    c-twolevel)  envs=(MCCL_ALGO=twolevel) ;;
    *) echo "device_switches.sh: unknown configuration '$cfg'" >&2; exit 2 ;;
  esac
  sizes=$SIZES rounds=$ROUNDS iters=$ITERS extra=()
  [ "$base" != "$spec" ] && IFS=, read -ra extra <<< "${spec#*@}"
  for kv in "${extra[@]}"; do  # SIZES, ROUNDS and ITERS are this run's; the rest its environment
    case $kv in
      SIZES=*) sizes=${kv#SIZES=}; sizes=${sizes//+/,} ;;
      ROUNDS=*) rounds=${kv#ROUNDS=} ;;
      ITERS=*) iters=${kv#ITERS=} ;;
      MCCL_TRACE=*) tr=${kv#MCCL_TRACE=}; [ "${tr#/}" = "$tr" ] && tr=$(cd "$RES" && pwd)/$tr  # relative: under RES
        mkdir -p "$(dirname "$tr")"; envs+=("MCCL_TRACE=$tr") ;;
      *) envs+=("$kv") ;;
    esac
  done
  stamp "$cfg: ${envs[*]} sizes $sizes, $rounds rounds of $iters"
  env "${envs[@]}" MCCL_DEBUG=INFO MCCL_DEBUG_SUBSYS=INIT,COLL \
    "$PY" -m mccl.bench --cluster "$ID" --rank-order "$RANK_ORDER" --backends "$BACKENDS" --ops all_reduce \
      --sizes "$sizes" --rounds "$rounds" -n "$iters" -w "$WARMUP" --goodput measure --goodput-seconds 3 \
      --deadline "$DEADLINE" --json "$RES/$cfg.json" > "$RES/$cfg.txt" 2>&1
  echo "exit $?" >> "$RES/$cfg.txt"
  log=$RES/$cfg.txt
  check "$cfg exit" 1 "exit 0" "$log"
  case $base in
    b-unordered)
      check "$cfg one group" "$NRANKS" "topology group 'all' (from MCCL_TOPOLOGY_GROUP); 1 group" "$log"
      check "$cfg ring in rank order" 0 "rings visit the ranks in the order" "$log"
      check "$cfg ring" "$NRANKS" "runs as ring (forced, MCCL_ALGO)" "$log" ;;
    *)
      if [ "$SWITCHES" = 1 ]; then  # one group: nothing to reorder, so no order line
        check "$cfg subnet group" "$NRANKS" "(from the subnet); 1 group" "$log"
        check "$cfg ring in rank order" 0 "rings visit the ranks in the order" "$log"
      else
        check "$cfg subnet groups" "$NRANKS" "(from the subnet); $SWITCHES groups" "$log"
        check "$cfg ring in topology order" 1 "rings visit the ranks in the order" "$log"
      fi
      if [ "$base" = c-twolevel ]; then check "$cfg two-level" "$NRANKS" "runs as two-level (forced, MCCL_ALGO)" "$log"
      else check "$cfg ring" "$NRANKS" "runs as ring (forced, MCCL_ALGO)" "$log"; fi ;;
  esac
  links=$(grep -cE "tcp_connect.c:[0-9]+ rank [0-9]+: connected to rank" "$log")
  echo "INFO $cfg: $links peer links opened (one 'connected to rank' line per link; eager mesh: $(( NRANKS * (NRANKS - 1) / 2 )))" >> "$RES/checks.txt"
done
stamp "benchmarks done"

"$PY" - "$RES" $NAMES > "$RES/summary.txt" <<'EOF'
import json, os, sys
res, configs = sys.argv[1], sys.argv[2:]
print(f"{'configuration':<12} {'backend':<5} {'size':>10} {'time ms':>9} {'busbw GB/s':>10} {'%goodput':>8} "
      f"{'rounds busbw':>20}  wrong")
for cfg in configs:
    path = os.path.join(res, f"{cfg}.json")
    if not os.path.exists(path):
        print(f"{cfg:<12} no JSON (see {cfg}.txt)")
        continue
    data = json.load(open(path))
    meta = data["meta"]
    for r in data["results"]:
        if "time_us" not in r:
            print(f"{cfg:<12} {r['backend']:<5} {r['size']:>10} {r.get('error') or r.get('unsupported')}")
            continue
        rounds = ",".join(f"{b:.3f}" for b in r.get("rounds_busbw", [r["busbw"]]))
        print(f"{cfg:<12} {r['backend']:<5} {r['size']:>10} {r['time_us'] / 1e3:>9.1f} {r['busbw']:>10.3f} "
              f"{r.get('busbw_pct_goodput', float('nan')):>7.1f}% {rounds:>20}  {r['wrong']}")
gp, up = meta.get("goodput") or {}, meta.get("goodput_uplink") or {}
print(f"# last run's goodput: host link {gp.get('bits_per_s', 0) / 8e9:.4f} GB/s, uplink "
      f"{up.get('bits_per_s', 0) / 8e9:.4f} GB/s; %goodput is against the host link")
pl = meta.get("placement") or {}
print(f"# rank order {pl.get('rank_order')}: hosts {pl.get('hosts')}, switches {pl.get('switches')}")
EOF
cat "$RES/summary.txt" "$RES/checks.txt"
stamp "summary written"
echo "results in $RES"
