#!/usr/bin/env bash
# Install the Debian packages the tests need when they are missing: chromium (browser test of
# the dashboard), prometheus (+ promtool) for the Prometheus ingest and alert-rule tests, and
# prometheus-alertmanager (amtool) to check the Alertmanager example, redis-server for the
# gateway's shared registry and permit gate (tests start their own on a loopback port),
# gcc and libssl-dev to compile the replay loops (replay/_native.c links OpenSSL's libcrypto;
# `make test` runs this before the venv's install, which builds it).
# Needs root for apt-get; as another user it only reports what is missing.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v promtool >/dev/null 2>&1 || { [[ " ${missing[*]-} " == *" prometheus "* ]] || missing+=(prometheus); }
command -v amtool >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
[ -f /usr/include/openssl/sha.h ] || missing+=(libssl-dev)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "install-system-deps: missing ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
  exit 0
fi
echo "install-system-deps: apt-get install ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
