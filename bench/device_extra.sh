#!/usr/bin/env bash
# One device call (8 hosts, 5 Gbit/s): broadcast and all-to-all tables, the skewed 256 MiB
# all-reduce memory test, socket-buffer settings, then the overlap and throughput benchmarks.
# Everything lands in one tarball in $OUT. Stages: STAGES="tables skew bufsize overlap throughput";
# also "loopback" (no cluster: every collective on 2, 4 and 8 local ranks; LOOP_ARGS for mccl.bench),
# "clsweep" (cluster: segment:depth settings in $CL_CFGS, and gloo), "loopsweep" (loopback:
# segment:depth settings in $CFGS, and gloo), "a2awin" (all-to-all with MCCL_ALLTOALL_WINDOW in
# $WINDOWS, and gloo, ROUNDS times) and "netdiag" (TCP counters of every host and tc counters of
# every veth, dumped before and after each backend's large all-reduces, ROUNDS times;
# bench/netdiag.py reads them), "loopst" (loopback on $LOOP_NPROCS ranks: mccl with
# MCCL_SEND_THREAD in $SEND_THREADS, and gloo), "clst" (the same on the cluster, ROUNDS times).
# OVERLAP_ARGS: extra options for the overlap stage (e.g. --compute-ms 100). CPUS_PER_HOST: pin
# each host to that many CPUs of its own (mccl.cluster up --cpus-per-host; 2 on the 16-core machine).
set -uo pipefail
cd "$(dirname "$0")/.."
python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
RES=bench/results/device-extra-$(date +%Y%m%d-%H%M%S); mkdir -p "$RES"
export PYTHONPATH=$PWD/python IPROUTE_DIR=$PWD/.tools/iproute PY=python3
cl() { python3 -m mccl.cluster --iproute-dir "$IPROUTE_DIR" "$@"; }
trap 'cl down --id x0 >/dev/null 2>&1; tar czf "${OUT:-/tmp}/results.tgz" "$RES"' EXIT
cl down --id x0 >/dev/null 2>&1
cl up --id x0 --hosts 8 --rate 5gbit ${CPUS_PER_HOST:+--cpus-per-host $CPUS_PER_HOST} > "$RES/cluster.txt"
cl goodput --id x0 --seconds 5 | tee -a "$RES/cluster.txt"
GP=$(grep -o '[0-9.]* Gbit/s' "$RES/cluster.txt" | head -1 | cut -d' ' -f1)gbit
B="python3 -m mccl.bench"
for st in ${STAGES:-tables skew bufsize overlap throughput}; do
  echo "=== $st $(date +%T)"
  case $st in
    tables) $B --cluster x0 --backends mccl,gloo --goodput $GP --ops broadcast,all_to_all -b 1K -e 256M -f 4 \
              --json $RES/tables.json > $RES/tables.txt 2>&1 ;;
    skew) $B --cluster x0 --backends mccl,gloo --goodput $GP --ops all_reduce --sizes 256M -n 3 --skew-ms 1000 \
              --json $RES/skew.json > $RES/skew.txt 2>&1 ;;
    bufsize) for bs in 0 4194304 16777216; do MCCL_SOCKET_BUFSIZE=$bs $B --cluster x0 --backends mccl --goodput $GP \
              --ops all_reduce,all_gather --sizes 16M,64M,256M --json $RES/buf$bs.json > $RES/buf$bs.txt 2>&1; done ;;
    overlap) $B overlap --cluster x0 --backends mccl,gloo ${OVERLAP_ARGS:-} --json $RES/overlap.json > $RES/overlap.txt 2>&1 ;;
    loopback) for n in 2 4 8; do timeout ${LOOP_TIMEOUT:-600} $B --nproc $n --backends mccl,gloo --goodput none \
              --ops all_reduce,all_gather,reduce_scatter,broadcast,all_to_all -b 1K -e 256M -f 4 ${LOOP_ARGS:-} \
              --json $RES/loop$n.json > $RES/loop$n.txt 2>&1; done ;;
    netdiag) mkdir -p $RES/net
             snap() { for i in $(seq 0 7); do { echo "## host $i"; $IPROUTE_DIR/ip netns exec mccl-x0-h$i cat /proc/net/snmp /proc/net/netstat
                      $IPROUTE_DIR/tc -s -n mccl-x0-h$i qdisc show dev eth0; $IPROUTE_DIR/tc -s qdisc show dev mccl-x0-v$i; }; done > $RES/net/$1.txt 2>&1; }
             for r in $(seq 1 ${ROUNDS:-2}); do for b in mccl gloo; do snap $r-$b-before
               $B --cluster x0 --backends $b --goodput $GP --ops all_reduce --sizes 16M,64M -n 20 --json $RES/net/$r-$b.json > $RES/net/$r-$b.txt 2>&1
               snap $r-$b-after; done; done ;;
    a2awin) for r in $(seq 1 ${ROUNDS:-2}); do for w in ${WINDOWS:-0 1 2} gloo; do
              if [ $w = gloo ]; then be=gloo; else be=mccl; fi
              MCCL_ALLTOALL_WINDOW=${w/gloo/0} $B --cluster x0 --backends $be --goodput $GP --ops all_to_all -b 64K -e 64M -f 4 \
                --bytes-per-size 256M --max-iters 100 --json $RES/a2a-$r-w$w.json > $RES/a2a-$r-w$w.txt 2>&1; done; done ;;
    loopst) for n in ${LOOP_NPROCS:-4 8}; do for st in ${SEND_THREADS:-1 0} gloo; do
              if [ $st = gloo ]; then be=gloo; st=1; else be=mccl; fi
              MCCL_SEND_THREAD=$st timeout 300 $B --nproc $n --backends $be --goodput none \
                --ops ${LOOP_OPS:-all_reduce,all_gather,reduce_scatter,broadcast,all_to_all} --sizes ${LOOP_SIZES:-1K,64K,1M,16M,64M,256M} \
                --bytes-per-size 256M --json $RES/lst-$n-$be-$st.json > $RES/lst-$n-$be-$st.txt 2>&1
              done; done ;;
    clst) for r in $(seq 1 ${ROUNDS:-1}); do for st in ${SEND_THREADS:-1 0} gloo; do
              if [ $st = gloo ]; then be=gloo; st=1; else be=mccl; fi
              MCCL_SEND_THREAD=$st $B --cluster x0 --backends $be --goodput $GP \
                --ops ${CL_OPS:-all_reduce,all_gather,reduce_scatter,broadcast,all_to_all} --sizes ${CL_SIZES:-1K,64K,1M,4M,16M,64M,256M} \
                --bytes-per-size ${CL_BYTES:-256M} --json $RES/cst-$r-$be-$st.json > $RES/cst-$r-$be-$st.txt 2>&1
              done; done ;;
    loopsweep) for n in ${LOOP_NPROCS:-2 8}; do for c in ${CFGS:-262144:4 1048576:4 4194304:4 262144:16} gloo; do
              if [ $c = gloo ]; then be=gloo; c=262144:4; else be=mccl; fi
              MCCL_SEGMENT_BYTES=${c%:*} MCCL_PIPELINE_DEPTH=${c#*:} timeout 120 $B --nproc $n --backends $be --goodput none \
                --ops ${LOOP_OPS:-all_reduce,broadcast} --sizes ${LOOP_SIZES:-4M,64M} --json $RES/ls-$n-$be-${c/:/-}.json > $RES/ls-$n-$be-${c/:/-}.txt 2>&1
              done; done ;;
    clsweep) for c in ${CL_CFGS:-262144:4 262144:16} gloo; do
              if [ $c = gloo ]; then be=gloo; c=262144:4; else be=mccl; fi
              MCCL_SEGMENT_BYTES=${c%:*} MCCL_PIPELINE_DEPTH=${c#*:} $B --cluster x0 --backends $be --goodput $GP \
                --ops ${CL_OPS:-all_reduce} --sizes ${CL_SIZES:-16M,64M} -n ${CL_ITERS:-10} --json $RES/cs-$be-${c/:/-}.json > $RES/cs-$be-${c/:/-}.txt 2>&1
              done ;;
    throughput) $B throughput --cluster x0 --backends mccl,gloo --json $RES/throughput.json > $RES/throughput.txt 2>&1 ;;
  esac
  for f in "$RES"/*.txt; do tail -n 3 "$f"; done
done
