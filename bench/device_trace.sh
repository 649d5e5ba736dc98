#!/usr/bin/env bash
# One device call for issue 17's link-level questions: what the 8-host ring's links did during
# large all-reduces, next to gloo's, and what the trace costs. Everything lands in one tarball in
# $OUT (the device tool's return folder). Carry .tools/iproute (bench/bundle_iproute.sh: ip, tc,
# ss, iperf3). Stages (STAGES, in order; default "base tcp trace cost trace4"); a stage
# NAME@VAR=VAL[,VAR=VAL] runs with those variables set, and its files carry them in their names:
#   base      mccl and gloo alternating round by round (--rounds ROUNDS), OPS (all_reduce) at SIZES;
#             base@OPS=all_gather+broadcast,SIZES=16M+64M sets them for one stage (ITERS= and
#             ROUNDS= too, in base and ab)
#   cc-NAME   every host's TCP congestion control set to NAME (cubic, bbr) for the later stages
#   ab        mccl alone at OPS / SIZES (all_reduce, 64M), ROUNDS rounds of two invocations: the stage's
#             settings (A), then those plus AB_ENV (B; default MCCL_SEND_THREAD_LOAD=0); bench/ab_summary.py
#             tabulates time, engine CPU and exactness per round
#   pin       the cluster again, each host pinned to 2 CPUs of its own (later stages run on it)
#   hosts-N   the cluster again with N hosts (later stages run on it)
#   rate-R    the cluster again with links at R (tc units: 10gbit; later stages run on it)
#   tcp       per run of TCP_RUNS ("mccl gloo"; a run may be BACKEND@VAR=VAL): each host's TCP and
#             tc counters before and after NTCP 64 MiB all-reduces (bench/netdiag.py reads them),
#             and `ss -tin` of host 1's connections sampled every 20 ms while they run
#   trace     MCCL_TRACE on the cluster as it is: 64 MiB all-reduce, -n 5, `python -m mccl.trace
#             summary`; `python -m mccl.trace gap <dir>/summary.json --goodput G` decomposes it
#   cost      the trace's cost: invocations alternating MCCL_TRACE unset / set, COST_ROUNDS times
#   skew      memory under skew: 256 MiB all-reduces, mccl and gloo, the last rank delayed by a
#             random 0..1000 ms before every iteration (--skew-ms); per rank +RSS in the JSON
#   trace4    the cluster again with 4 hosts: the trace of 64 MiB all-reduces and its summary,
#             and mccl / gloo alternating at 64 MiB (last: it replaces the 8-host cluster)
# Usage on the device: STAGES="base base@MCCL_SEND_THREAD=0 pin base" bash bench/device_trace.sh
# (HOSTS, RATE: 8, 5gbit; ITERS: timed iterations of base and ab, 8; PY: python3; here: PY=.venv/bin/python HOSTS=3 RATE=1gbit ...)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
"$PY" setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
RES=bench/results/device-trace-$(date +%Y%m%d-%H%M%S); mkdir -p "$RES"
export PYTHONPATH=$PWD/python IPROUTE_DIR=$PWD/.tools/iproute
IPR=$IPROUTE_DIR
cl() { "$PY" -m mccl.cluster --iproute-dir "$IPR" "$@"; }
trap 'cl down --id t0 >/dev/null 2>&1; tar czf "${OUT:-/tmp}/results.tgz" "$RES"' EXIT
trap 'exit 143' TERM  # `timeout` ends it: the EXIT trap still packs what the stages wrote
up() {  # up HOSTS [CPUS]: a fresh cluster t0 (each host pinned to CPUS CPUs of its own) and its goodput in $GP
  NH=$1; TAG=$1${2:+p$2}${RATE:+-$RATE}  # e.g. 8, 8p2 when pinned, 8-10gbit with RATE set
  cl down --id t0 >/dev/null 2>&1
  cl up --id t0 --hosts "$1" --rate "${RATE:-5gbit}" ${2:+--cpus-per-host $2} > "$RES/cluster-$TAG.txt"
  # --ring: also every host to the next at once (what the ring's streams cost each host, kept in the JSON)
  cl goodput --id t0 --seconds 5 --ring --json > "$RES/goodput-$TAG.json" || exit 1
  "$PY" -c "import json, sys; from mccl import cluster as c; g = json.load(open(sys.argv[1]))
print('single-stream TCP goodput:', c.format_goodput(g)); print(c.format_ring_floor(g['ring_floor']))" \
    "$RES/goodput-$TAG.json" | tee -a "$RES/cluster-$TAG.txt"
  GP=$(grep -o '[0-9.]* Gbit/s' "$RES/cluster-$TAG.txt" | head -1 | cut -d' ' -f1)gbit
}
snap() {  # snap FILE: TCP and tc counters of every host (the format bench/netdiag.py reads)
  for i in $(seq 0 $((NH - 1))); do
    echo "## host $i"
    "$IPR/ip" netns exec "mccl-t0-h$i" cat /proc/net/snmp /proc/net/netstat
    "$IPR/tc" -s -n "mccl-t0-h$i" qdisc show dev eth0
    "$IPR/tc" -s qdisc show dev "mccl-t0-v$i"
  done > "$1" 2>&1
  { echo "## softnet"; cat /proc/net/softnet_stat; } >> "$1" 2>&1
}
sample_ss() {  # sample_ss FILE: host 1's TCP connections every 20 ms until killed
  while :; do
    echo "@ $(date +%s.%N)"
    "$IPR/ip" netns exec mccl-t0-h1 "$IPR/ss" -tin state established
    sleep 0.02
  done > "$1" 2>&1
}
B="$PY -m mccl.bench"
trace_run() {  # trace_run [SUFFIX]: MCCL_TRACE on the cluster as it is (with the stage's ENVS): 64 MiB
  T=$RES/trace$TAG${1:-}; mkdir -p "$T"  # all-reduces, their summary in $RES/trace<TAG><SUFFIX>
  MCCL_TRACE=$T/t env "${ENVS[@]}" $B --cluster t0 --backends mccl --goodput "$GP" --ops all_reduce --sizes 64M -n 5 -w 1 \
    --json "$T/bench.json" > "$T/bench.txt" 2>&1
  "$PY" -m mccl.trace summary "$T"/t.*.json --json "$T/summary.json" > "$T/summary.txt" 2>&1
  tail -3 "$T/summary.txt"
}
up "${HOSTS:-8}"
envtag() {  # envtag "A=1,B=2" -> "-A_1_B_2" (a file-name suffix), "" for ""
  [ -n "$1" ] && echo "-$1" | tr -c 'A-Za-z0-9\n-' '_'
}
stageKnobs() {  # a base or ab stage's OPS=, SIZES=, ITERS=, ROUNDS= (the benchmark's, not the library's)
  iters=${ITERS:-8}; rounds=${ROUNDS:-3}
  for kv in "${ENVS[@]}"; do case $kv in OPS=*) ops=${kv#OPS=};; SIZES=*) sizes=${kv#SIZES=};;
    ITERS=*) iters=${kv#ITERS=};; ROUNDS=*) rounds=${kv#ROUNDS=};; esac; done
}
ENVS=(); k=0
for item in ${STAGES:-base tcp trace cost trace4}; do
  st=${item%%@*}; E=; [ "$st" != "$item" ] && E=${item#*@}
  SUF=$(envtag "$E"); read -r -a ENVS <<< "${E//,/ }"
  echo "=== $item $(date +%T)"
  case $st in
    base) ops=${OPS:-all_reduce}; sizes=${SIZES:-16M,64M,256M}  # a stage's OPS= / SIZES= ('+' for ',')
          stageKnobs
          F=$RES/base$TAG$SUF; n=2  # a stage repeated in one call: base8-2, base8-3, ...
          while [ -e "$F.txt" ]; do F=$RES/base$TAG$SUF-$n; n=$((n + 1)); done
          env "${ENVS[@]}" $B --cluster t0 --backends mccl,gloo --goodput "$GP" --ops "${ops//+/,}" \
            --sizes "${sizes//+/,}" --rounds "$rounds" -n "$iters" --json "$F.json" > "$F.txt" 2>&1
          tail -30 "$F.txt" ;;
    ab) ops=${OPS:-all_reduce}; sizes=${SIZES:-64M}  # mccl alone, invocations alternating the stage's settings (A)
        stageKnobs
        read -r -a BENVS <<< "${AB_ENV:-MCCL_SEND_THREAD_LOAD=0}"  # and those plus AB_ENV (B), round by round
        F=$RES/ab$TAG$SUF; mkdir -p "$F"
        for r in $(seq 1 "$rounds"); do for side in A B; do
          extra=(); [ $side = B ] && extra=("${BENVS[@]}")
          env "${ENVS[@]}" "${extra[@]}" $B --cluster t0 --backends mccl --goodput "$GP" --ops "${ops//+/,}" \
            --sizes "${sizes//+/,}" -n "$iters" -w 2 --json "$F/$r-$side.json" > "$F/$r-$side.txt" 2>&1
        done; done
        "$PY" bench/ab_summary.py "$F" | tee "$F/summary.txt" ;;
    pin) up "$NH" 2 ;;
    hosts-*) up "${st#hosts-}" ;;
    rate-*) RATE=${st#rate-}; up "$NH" ;;
    cc-*) A=/proc/sys/net/ipv4/tcp_allowed_congestion_control  # a netns may pick only what the host allows
          grep -qw "${st#cc-}" $A || echo "$(cat $A) ${st#cc-}" > $A || exit 1
          for i in $(seq 0 $((NH - 1))); do  # every host's TCP congestion control (cc-cubic, cc-bbr)
            "$IPR/ip" netns exec "mccl-t0-h$i" sh -c "echo ${st#cc-} > /proc/sys/net/ipv4/tcp_congestion_control" || exit 1
          done; "$IPR/ip" netns exec mccl-t0-h0 cat /proc/sys/net/ipv4/tcp_congestion_control | tee -a "$RES/cluster-$TAG.txt" ;;
    tcp) mkdir -p "$RES/net"; tags=()  # runs numbered across tcp stages (k): no name is reused
         for run in ${TCP_RUNS:-mccl gloo}; do
           b=${run%%@*}; RE=; [ "$b" != "$run" ] && RE=${run#*@}; k=$((k + 1))
           tag=$TAG-$k-$b$(envtag "$RE"); tags+=("$tag"); read -r -a RENVS <<< "${RE//,/ }"
           snap "$RES/net/$tag-before.txt"
           sample_ss "$RES/net/ss-$tag.txt" & sp=$!
           env "${RENVS[@]}" $B --cluster t0 --backends "$b" --goodput "$GP" --ops all_reduce --sizes 64M \
             -n "${NTCP:-10}" -w 1 --json "$RES/net/$tag.json" > "$RES/net/$tag.txt" 2>&1
           kill $sp; wait $sp 2>/dev/null
           snap "$RES/net/$tag-after.txt"
         done
         "$PY" bench/netdiag.py "$RES/net" "${tags[@]}" | tee -a "$RES/net/counters.txt" ;;
    trace) trace_run "$SUF" ;;
    skew) env "${ENVS[@]}" $B --cluster t0 --backends mccl,gloo --goodput "$GP" --ops all_reduce --sizes 256M -n 4 -w 1 \
            --skew-ms 1000 --json "$RES/skew$TAG$SUF.json" > "$RES/skew$TAG$SUF.txt" 2>&1
          "$PY" -c "import json,sys; [print('skew', r['backend'], '+RSS MiB per rank', [round(x, 2) for x in r['per_rank']['rss_extra_mib']]) for r in json.load(open(sys.argv[1]))['results']]" "$RES/skew$TAG$SUF.json" ;;
    cost) for r in $(seq 1 "${COST_ROUNDS:-3}"); do for on in 0 1; do
            if [ $on = 1 ]; then tr=$RES/cost/t$r; mkdir -p "$RES/cost"; else tr=; fi
            MCCL_TRACE=$tr $B --cluster t0 --backends mccl --goodput "$GP" --ops all_reduce,all_gather --sizes 64K,1M,16M,64M \
              -n 8 --json "$RES/cost-$r-$on.json" > "$RES/cost-$r-$on.txt" 2>&1
            rm -f "$RES"/cost/t$r.*; done; done ;;
    trace4) up 4; trace_run
            $B --cluster t0 --backends mccl,gloo --goodput "$GP" --ops all_reduce --sizes 64M --rounds 3 -n 8 \
              --json "$RES/trace4/rounds.json" > "$RES/trace4/rounds.txt" 2>&1; tail -8 "$RES/trace4/rounds.txt" ;;
    *) echo "device_trace.sh: unknown stage '$st'" >&2; exit 2 ;;
  esac
done
gzip -9 "$RES"/trace*/t.*.json "$RES"/net/ss-*.txt 2>/dev/null  # every rank's trace (about 0.25 MB each) and the ss samples (netdiag.py reads .txt.gz)
echo "results in $RES"
