#!/usr/bin/env bash
# Installs every build and test dependency of pdserve from Debian's archive.
# Idempotent: packages already present are not fetched again. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  clang clang-format clang-tidy libclang-rt-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev nlohmann-json3-dev libsentencepiece-dev libpcre2-dev
  libcli11-dev libspdlog-dev libfmt-dev
  libfabric-dev libfabric-bin libhwloc-dev hwloc
  libcpp-httplib-dev qemu-user
  iproute2 procps curl
  etcd-server etcd-client  # cluster membership (--etcd) and its tests (tests/messenger/membership_test.cc)
  gnuplot-nox  # the PNG plots of `pdserve bench sweep`
  python3-jinja2  # the chat-template reference renders (tests/chat/fixtures/render_reference.py)
  python3-numpy  # the float64 reference forward pass (tests/reference/hf_reference.py)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# kubectl for the manifests' checks (tests/deploy): Debian's kubernetes-client, unless some
# kubectl is installed already (another package's would conflict with it).
if ! command -v kubectl >/dev/null 2>&1; then missing+=(kubernetes-client); fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
