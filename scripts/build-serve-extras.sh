#!/usr/bin/env bash
# What `vllm serve` (and the HTTP engine's /metrics parser) import beyond the vLLM GPU bundle (`.gpukit`,
# docs/gpu-validation.md) and the device image: pure-Python wheels (plus markupsafe and
# watchfiles for CPython 3.12), unpacked into OUTDIR (default ./.gpukit-serve, ignored by git).
# Put OUTDIR on PYTHONPATH in the device call; docs/gpu-validation.md has the command.
set -euo pipefail
out=${1:-.gpukit-serve}
wheels=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$wheels" \
  uvicorn==0.54.0 h11==0.16.0 click==8.5.1 prometheus_client==0.26.0 prometheus-fastapi-instrumentator==8.1.0 \
  python-multipart==0.0.34 jinja2==3.1.6 markupsafe==3.0.4 watchfiles==1.3.0 email-validator==2.4.0 \
  dnspython==2.9.2 model-hosting-container-standards==0.1.16 jmespath==1.1.0 supervisor==4.3.0
mkdir -p "$out"
for w in "$wheels"/*.whl; do python3 -m zipfile -e "$w" "$out"; done
rm -rf "$wheels"
du -sh "$out"
