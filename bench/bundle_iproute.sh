#!/usr/bin/env bash
# Bundle iproute2's `ip`, `tc` and `ss` (and iperf3 when installed) with every shared library `ldd`
# lists (the dynamic loader included) into a git-ignored folder, for machines that have no iproute2, such as the team's GPU
# machine (see shared/design/TESTBED.md). Run it on a Debian machine that has iproute2
# (apt-get install iproute2), then carry the folder along with the run:
#
#   bench/bundle_iproute.sh                 # writes .tools/iproute (the default)
#   bench/bundle_iproute.sh /some/folder    # or elsewhere
#
# The folder holds bin/{ip,tc,ss,iperf3}, lib/*.so*, and wrapper scripts `ip`, `tc`, `ss`, `iperf3` that start the
# binaries through the bundled loader with --library-path, so the bundled libraries are used
# without setting LD_LIBRARY_PATH for anything else (a command started inside a namespace keeps
# the machine's own libraries). `python -m mccl.cluster` finds .tools/iproute by itself when ip/tc
# are not on PATH, or takes --iproute-dir FOLDER / MCCL_IPROUTE_DIR. Only built-in qdiscs (tbf,
# htb, pfifo) are needed; tc's /usr/lib/tc distribution files are not bundled.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/.tools/iproute}
mkdir -p "$dest/bin" "$dest/lib"

libs_of() {  # every absolute path ldd prints: "libx.so => /path (0x..)" and "/lib64/ld-linux... (0x..)"
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
}

tools="ip tc ss"   # ss: per-connection TCP state (cwnd, retransmits), sampled by bench/device_trace.sh
if command -v iperf3 >/dev/null; then
  tools="$tools iperf3"  # optional: the goodput measurement falls back to Python sockets without it
else
  echo "bundle_iproute.sh: no iperf3 here (apt-get install iperf3); bundling ip, tc and ss only" >&2
fi

loader=""
for tool in $tools; do
  src=$(command -v "$tool" || true)
  if [ -z "$src" ]; then
    echo "bundle_iproute.sh: no '$tool' on this machine; install iproute2 first (apt-get install iproute2)" >&2
    exit 1
  fi
  cp -L "$src" "$dest/bin/$tool"
  for lib in $(libs_of "$src"); do
    cp -L "$lib" "$dest/lib/"
    case "$(basename "$lib")" in ld-linux*) loader=$(basename "$lib") ;; esac
  done
done
if [ -z "$loader" ]; then
  echo "bundle_iproute.sh: ldd named no ld-linux loader; cannot write the wrappers" >&2
  exit 1
fi

for tool in $tools; do
  cat > "$dest/$tool" <<WRAP
#!/bin/sh
# Runs the bundled $tool through the bundled loader and libraries (written by bench/bundle_iproute.sh).
d=\$(dirname "\$(readlink -f "\$0")")
exec "\$d/lib/$loader" --library-path "\$d/lib" "\$d/bin/$tool" "\$@"
WRAP
  chmod +x "$dest/$tool"
done

"$dest/ip" -V
"$dest/tc" -V
[ -x "$dest/iperf3" ] && "$dest/iperf3" --version | head -n 1
echo "bundled into $dest ($(du -sh "$dest" | cut -f1)): $(ls "$dest/lib" | tr '\n' ' ')"
