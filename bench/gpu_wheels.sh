#!/usr/bin/env bash
# The pure-Python packages probtorch needs that the GPU machine's image lacks (it has torch,
# numpy, scipy, pandas, xarray, h5py, matplotlib, tqdm, JAX and NumPyro, and no network),
# downloaded here into .whl/ for bench/gpu_check.py's run there (bench/README.md, "GPU
# check"). About 2.6 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 -d .whl \
    pyro-ppl==1.9.2 pyro-api==0.1.2 arviz==0.23.4 xarray-einstats==0.11.0 h5netcdf==1.8.3 \
    platformdirs==4.14.9
ls .whl
