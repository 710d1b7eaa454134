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
)

step() {
  printf '\n==> %s\n' "$*"
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
