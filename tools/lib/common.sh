# Shared helpers for tools/test and tools/demo. Sourced, not run.

# Debian packages the build and the tests need, one per line: the package, then a command or
# file whose presence means it is installed.
RAILSHIFT_PACKAGES=(
  "pkg-config:/usr/bin/pkg-config"
  "iproute2:/usr/sbin/ip"
  "fonts-dejavu-core:/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
  "gcc:/usr/bin/cc"
  "libibverbs-dev:/usr/include/infiniband/mlx5dv.h"
  "librdmacm-dev:/usr/include/rdma/rdma_cma.h"
  "libclang-dev:/usr/share/doc/libclang-dev/copyright"
  "tshark:/usr/bin/tshark"
  "redis-server:/usr/bin/redis-server"
  "openssl:/usr/bin/openssl"
  "libc6-dev-arm64-cross:/usr/aarch64-linux-gnu/include/stdio.h"
  # The Linux rxe peer of tools/interop: a Debian kernel with rdma_rxe, rdma-core's tools and
  # provider, and what boots it (tools/rxe-vm).
  "linux-image-amd64:/usr/share/doc/linux-image-amd64/copyright"
  "rdma-core:/usr/share/doc/rdma-core/copyright"
  "ibverbs-providers:/etc/libibverbs.d/rxe.driver"
  "ibverbs-utils:/usr/bin/ibv_rc_pingpong"
  "perftest:/usr/bin/ib_write_bw"
  "busybox-static:/usr/bin/busybox"
  "kmod:/usr/bin/kmod"
  "cpio:/usr/bin/cpio"
  "qemu-system-x86:/usr/bin/qemu-system-x86_64"
)

# Starts a step: closes the one before with its time, and prints the time since the script
# began, so a CI log says where its minutes went. `step "done"` also prints every step's time.
RAILSHIFT_STEP_TIMES=()
RAILSHIFT_STEP_NAME=""
RAILSHIFT_STEP_START=$SECONDS
step() {
  if [ -n "$RAILSHIFT_STEP_NAME" ]; then
    RAILSHIFT_STEP_TIMES+=("$(printf '%5d s  %s' $((SECONDS - RAILSHIFT_STEP_START)) "$RAILSHIFT_STEP_NAME")")
  fi
  RAILSHIFT_STEP_NAME="$*"
  RAILSHIFT_STEP_START=$SECONDS
  printf '\n==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"
  if [ "$*" = "done" ]; then
    printf '%s\n' "time per step:" "${RAILSHIFT_STEP_TIMES[@]}"
  fi
}

# Installs whatever in RAILSHIFT_PACKAGES is missing, with apt-get, after apt-get update.
ensure_packages() {
  local missing=() entry pkg probe
  for entry in "${RAILSHIFT_PACKAGES[@]}"; do
    pkg=${entry%%:*}
    probe=${entry#*:}
    if [ ! -e "$probe" ]; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "all present"
    return 0
  fi
  echo "installing: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# The aarch64 Rust standard library, for the cross-build check (rustup's; a toolchain without
# rustup cannot add targets, which is said plainly).
ensure_aarch64_target() {
  if rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    echo "aarch64-unknown-linux-gnu present"
    return 0
  fi
  if ! command -v rustup >/dev/null; then
    echo "rustup is not installed: cannot add the aarch64-unknown-linux-gnu target" >&2
    return 1
  fi
  rustup target add aarch64-unknown-linux-gnu
}

# Commands run when the shell exits, in the order they were added: `on_exit 'cmd'`. One EXIT
# trap runs them all, so helpers that clean up do not overwrite each other's traps.
RAILSHIFT_ON_EXIT=()
run_on_exit() {
  local cmd
  for cmd in "${RAILSHIFT_ON_EXIT[@]}"; do
    eval "$cmd" || true
  done
}
on_exit() {
  RAILSHIFT_ON_EXIT+=("$1")
  trap run_on_exit EXIT
}

# Starts a private redis-server on 127.0.0.1 (a free port, no persistence, no files written),
# exports its URL as RAILSHIFT_REDIS_URL for the tests, and stops it when the shell exits.
start_private_redis() {
  local port pid tries
  for tries in 1 2 3 4 5 6 7 8; do
    # 30000-32699: above the ports the apps tests use (20000-29999), below the ephemeral range.
    port=$((30000 + RANDOM % 2700))
    redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
      --dir /tmp --logfile "" --loglevel warning >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 50); do
      if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
        RAILSHIFT_REDIS_PID=$pid
        on_exit 'kill "$RAILSHIFT_REDIS_PID" 2>/dev/null'
        export RAILSHIFT_REDIS_URL="redis://127.0.0.1:$port/"
        echo "redis-server (pid $pid) at $RAILSHIFT_REDIS_URL"
        return 0
      fi
      if ! kill -0 "$pid" 2>/dev/null; then
        break # the port was taken: try another
      fi
      sleep 0.1
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo "could not start a private redis-server" >&2
  return 1
}
