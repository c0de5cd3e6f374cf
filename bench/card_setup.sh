# Source at the start of every call on a lent card machine (the device tool's `run`), from the checkout:
#     source bench/card_setup.sh
# The card machines have Python 3.12, numpy, torch, cuda-bindings, but not pyzmq, gguf or the ASGI stack:
# their wheels travel in .whl (ignored by git; name `.whl` in `carry` on every call), fetched here once:
#     mkdir -p .whl && P="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
#     python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $P -d .whl \
#         pyzmq gguf fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn prometheus-client \
#         opentelemetry-api annotated-doc anyio sniffio h11 idna typing-extensions
# (fastapi 0.165 imports opentelemetry-api and annotated-doc; anyio wants typing-extensions >= 4.16, newer than the
# card's torch environment may hold.)
# Then the wheels go into /tmp/site (once while the machine stays warm) and the checkout is mapped under
# `radiance.` (bench/checkout_shim.py) on PYTHONPATH for this shell and every process it starts.
if [ ! -f /tmp/site/.done ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && touch /tmp/site/.done || return 1
fi
SHIM=$(PYTHONPATH=/tmp/site python3 -c "import sys; sys.path.insert(0, 'bench'); import checkout_shim; print(checkout_shim.SHIM_PATH)")
export PYTHONPATH=$SHIM:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
