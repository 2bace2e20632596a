# pjserve - the commands a person types. CMake does the building.
#
#   make            build everything into build/ (bootstraps dependencies first)
#   make serve      export the demo models and serve them (gRPC :8001, HTTP :8000, metrics :8002)
#   make test       unit tests, corpus replays, end-to-end, protocol (against serve and against
#                   a two-worker node), gateway, node and deployment tests, PyTorch exports
#                   (in .venv-torch), a short fuzz run
#   make models     export the demo model bundles into models/
#   make docs-check run every command block of README.md and docs/*.md that is marked to run
#                   (tests/docs; make test runs all but the slow ones)
#   make demo       export the demo models and run each once with pjserve run
#   make asan       unit, end-to-end, protocol (against serve and a node), gateway, client and
#                   CLI tests on an AddressSanitizer+UBSan build (build-asan/)
#   make tsan       the same on a ThreadSanitizer build (build-tsan/)
#   make fuzz       build the libFuzzer drivers (build-fuzz/) and fuzz each for FUZZ_SECONDS
#   make bench      server overhead vs the raw limit and the peers (docs/benchmarks.md)
#   make bench-scheduler  coalescing and fair shares on a compute-bound convnet (same doc);
#                   bench/scheduler.py --model resnet50 the same on ResNet-50
#   make models-large  export ResNet-50 and -18 (JAX), ResNet-50 and BERT-base (PyTorch), random
#                   weights, into models-large/
#   make bench-residency  weight loads vs size and many models under a weight budget (same doc)
#   make bench-meta  the detector as a meta vs client-orchestrated vs Triton BLS (same doc)
#   make bench-shared-weights  memory of 1-4 workers with and without --shared-weights (same doc)
#   make bench-catalogue  10,000 models under a bursty Zipf trace: pjserve's host tier vs every
#                   floor in memory, Ray Serve and PyTriton (bench/catalogue.py)
#   make bench-gateway  one hop through pjserve gateway, and 1 vs 2 workers behind it (same doc)
#   make gpu-check  package pjserve for a GPU machine (.gpu-check/) and check the CUDA path there
#   make gpu-bench  package the request-path benchmark for a GPU machine (.gpu-bench/) and run it
#                   there: raw PJRT, pjserve's levers, jax/PyTorch peers (scripts/gpu-bench)
#   make zoo        export and serve 45 public PyTorch architectures, compare with eager
#                   (scripts/zoo.py; writes the table in docs/exporter.md)
#   make gpu-catalogue  package the catalogue benchmark for a GPU machine (.gpu-catalogue/) and
#                   run it there: 1,000 ResNet-50s, 99.9 % within 100 ms, cold requests
#                   (scripts/gpu-catalogue)
#   make container-check  build deploy/Dockerfile's image from a clean clone of the commit with
#                   podman, serve the demo models from it, and podman kube play the KServe
#                   runtime's container as a Pod (root, podman; minutes; docs/kubernetes.md)
#   make install    install pjserve, libpjserve-client (shared, static, header, pjserve-client.pc)
#                   and the bundle ABI header under PREFIX (default /usr/local)
#   make clean

JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 20
PYTHON := .venv/bin/python
PYTEST := $(PYTHON) -m pytest -q -p no:cacheprovider

.PHONY: all bootstrap bootstrap-torch build test unit e2e e2e-node e2e-torch docs docs-check models models-large demo serve asan tsan fuzz fuzz-build fuzz-smoke clean install bench bench-scheduler bench-residency bench-meta bench-shared-weights bench-host-tier bench-catalogue bench-gateway bench-detection bench-catalogue-scale bench-tracing gpu-check gpu-bench gpu-catalogue zoo container-check

all: build

bootstrap:
	@scripts/bootstrap --check >/dev/null 2>&1 || scripts/bootstrap

# .venv-torch (PyTorch, about 3 GB): only the PyTorch exporter's tests need it.
bootstrap-torch: bootstrap
	@scripts/bootstrap --check --torch >/dev/null 2>&1 || scripts/bootstrap --torch

# $(1): build directory, $(2): extra CMake arguments
define cmake_build
	@test -f $(1)/CMakeCache.txt || cmake -S . -B $(1) $(2) >/dev/null
	cmake --build $(1) -j $(JOBS)
endef

build: bootstrap
	$(call cmake_build,build,)

unit: build
	cd build && ctest --output-on-failure -j $(JOBS)

# End-to-end (pjserve run vs JAX), protocol (pjserve serve vs tritonclient),
# gateway, deployment (deploy/: manifests, Dockerfile; plain build only) and
# client (libpjserve-client, its example and pjserve infer/models/...) and
# command-line (pjserve top, under tmux) tests.
PYTESTS := tests/e2e tests/protocol tests/gateway tests/deploy tests/node tests/client tests/cli \
           --ignore=tests/e2e/test_torch_export.py --ignore=tests/e2e/test_onnx_export.py \
           --ignore=tests/e2e/test_import_triton.py --ignore=tests/e2e/test_faster_rcnn.py
# The sanitizer builds skip the hostile-client suite (bombs and floods: heavy,
# and its memory bounds are the plain build's) and the node's (worker processes
# killed, stopped and restarted: fault injection runs once, in the plain build).
SANITIZER_PYTESTS := tests/e2e tests/protocol tests/gateway tests/client tests/cli \
                     --ignore=tests/protocol/hostile --ignore=tests/e2e/test_torch_export.py \
                     --ignore=tests/e2e/test_onnx_export.py --ignore=tests/e2e/test_import_triton.py \
                     --ignore=tests/e2e/test_faster_rcnn.py
# The protocol suite again in node mode: a gateway in front of two workers.
SANITIZER_NODE_PYTESTS := tests/protocol --ignore=tests/protocol/hostile

e2e: build
	PJSERVE_BIN=$(CURDIR)/build/pjserve $(PYTEST) -s $(PYTESTS)

# PyTorch and ONNX exports (export_torch: torchvision's ResNet-18 and a tiny
# BERT against eager PyTorch; export_onnx: eleven ONNX files from torchvision
# and transformers against onnxruntime), pjserve import-triton (a Triton
# repository of ONNX, TorchScript, sequence and ensemble models against
# onnxruntime and TorchScript) and export_faster_rcnn (two torchvision
# Faster R-CNNs served as meta models against torchvision's detections), in
# .venv-torch, once, in the plain build.
# Which public PyTorch architectures export and serve as eager PyTorch
# computes them (scripts/zoo.py): minutes, so not part of make test.
zoo: build bootstrap-torch
	.venv-torch/bin/python scripts/zoo.py

e2e-torch: build bootstrap-torch
	PJSERVE_BIN=$(CURDIR)/build/pjserve .venv-torch/bin/python -m pytest -q -p no:cacheprovider \
	  -s tests/e2e/test_torch_export.py tests/e2e/test_onnx_export.py \
	  tests/e2e/test_import_triton.py tests/e2e/test_faster_rcnn.py

# The protocol suite again, against `pjserve node --workers 2`: every call
# through the gateway to two workers (tests of one serve process's own
# gauges, logs and gates are skipped there).
e2e-node: build
	PJSERVE_PROTOCOL_NODE_WORKERS=2 PJSERVE_BIN=$(CURDIR)/build/pjserve \
	  $(PYTEST) tests/protocol --ignore=tests/protocol/hostile

# The docs' command blocks (tests/docs/test_docs.py says how they are
# marked and run). `make test` runs them without the blocks marked slow
# (2.7 minutes on 2 busy CPUs); the slow ones are those that export the
# demo models again (make models, make demo), compile every demo bundle
# cold (pjserve check models/*) or start a node of several workers, and
# only docs-check runs them (4.9 minutes for every marked block, on the
# same machine).
docs: build
	PJSERVE_BIN=$(CURDIR)/build/pjserve $(PYTEST) -rs tests/docs

docs-check: build
	PJSERVE_DOCS_CHECK_ALL=1 PJSERVE_BIN=$(CURDIR)/build/pjserve $(PYTEST) -rs tests/docs

test: unit e2e e2e-node e2e-torch docs fuzz-smoke

models: build
	$(PYTHON) examples/make_demo_models.py models --pjserve build/pjserve

# ResNet-50 and ResNet-18 (JAX), ResNet-50 and BERT-base (PyTorch), random
# weights, for benchmarks: not built by `make test`; about 700 MiB of bundles
# in models-large/.
models-large: build bootstrap-torch
	.venv-torch/bin/python examples/make_large_models.py models-large

demo: models
	$(PYTHON) examples/run_demo.py --pjserve build/pjserve models

serve: models
	build/pjserve serve --model-repository models

asan: bootstrap
	$(call cmake_build,build-asan,-DPJSERVE_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)
	PJSERVE_BIN=$(CURDIR)/build-asan/pjserve $(PYTEST) $(SANITIZER_PYTESTS)
	PJSERVE_PROTOCOL_NODE_WORKERS=2 PJSERVE_BIN=$(CURDIR)/build-asan/pjserve \
	  $(PYTEST) $(SANITIZER_NODE_PYTESTS)

# The PJRT plugin is not instrumented; tests/tsan.supp explains what that hides.
TSAN_ENV := TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1"

tsan: bootstrap
	$(call cmake_build,build-tsan,-DPJSERVE_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug)
	cd build-tsan && $(TSAN_ENV) ctest --output-on-failure -j $(JOBS)
	$(TSAN_ENV) PJSERVE_BIN=$(CURDIR)/build-tsan/pjserve $(PYTEST) $(SANITIZER_PYTESTS)
	$(TSAN_ENV) PJSERVE_PROTOCOL_NODE_WORKERS=2 PJSERVE_BIN=$(CURDIR)/build-tsan/pjserve \
	  $(PYTEST) $(SANITIZER_NODE_PYTESTS)

FUZZERS := fuzz_safetensors fuzz_manifest fuzz_npy fuzz_config fuzz_rest_infer fuzz_grpc_infer \
            fuzz_control_json fuzz_auth_header fuzz_bytes \
            fuzz_hook_abi fuzz_gateway_http fuzz_weight_segment fuzz_gateway_route fuzz_relay_inputs \
            fuzz_client_decode fuzz_load_config fuzz_image_decode fuzz_shm_json fuzz_traceparent \
            fuzz_trace_settings

fuzz-build: bootstrap
	@test -f build-fuzz/CMakeCache.txt || \
	  cmake -S . -B build-fuzz -DPJSERVE_FUZZ=ON -DCMAKE_C_COMPILER=clang-14 >/dev/null
	cmake --build build-fuzz -j $(JOBS) --target $(FUZZERS)

# Fuzz each driver from its seed corpus for FUZZ_SECONDS; new inputs go to a
# scratch directory so the committed corpus only changes by hand.
fuzz: fuzz-build
	@for name in $(FUZZERS); do \
	  f=build-fuzz/$$name; mkdir -p build-fuzz/corpus-$$name; \
	  echo "fuzzing $$name for $(FUZZ_SECONDS)s"; \
	  if ! $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	      build-fuzz/corpus-$$name fuzz/corpus/$$name > build-fuzz/$$name.log 2>&1; then \
	    tail -n 40 build-fuzz/$$name.log; echo "$$name found a failure; see build-fuzz/$$name.log"; exit 1; \
	  fi; \
	  grep -E "number_of_executed_units|new_units_added" build-fuzz/$$name.log; \
	done

fuzz-smoke:
	$(MAKE) fuzz FUZZ_SECONDS=10

clean:
	rm -rf build build-asan build-tsan build-fuzz

PREFIX ?= /usr/local

install: build
	cmake --install build --prefix $(PREFIX)

# Server overhead vs the raw PJRT limit, a bare gRPC echo server
# (build/pjs_bench_grpc_floor, bench/grpc_floor.c), Triton and MLServer
# (docs/benchmarks.md); the peers live in their own venvs
# (scripts/bootstrap-bench). About 10 minutes.
bench: build
	scripts/bootstrap-bench
	$(PYTHON) bench/server_overhead.py

# The scheduler: coalescing (images/s vs concurrency against the raw limit of
# each compiled batch size) and fair shares of device time between two
# saturated models (docs/benchmarks.md). Needs only matplotlib besides .venv
# and perf_analyzer. About 7 minutes.
bench-scheduler: build
	scripts/bootstrap-bench plot
	$(PYTHON) bench/scheduler.py

# The device weight cache: cold-load time and bandwidth against model size
# (vs a host memory copy), N models under a budget of 20 % of their weights
# with Zipf traffic, and throughput and p99 against 5 to 200 models at budgets
# of 10 and 20 % per eviction configuration (docs/benchmarks.md). Needs only
# matplotlib besides .venv. About 10 minutes.
bench-residency: build
	scripts/bootstrap-bench plot
	$(PYTHON) bench/residency.py

# Composition: the two-stage detector as a pjserve meta, against the same
# stages orchestrated by the client over gRPC and against Triton's BLS in
# .venv-bench-pytriton; and the added cost of one sub-call
# (docs/benchmarks.md). About 5 minutes.
bench-meta: build
	scripts/bootstrap-bench pytriton plot
	$(PYTHON) bench/meta_pipeline.py

# Shared host weights: Rss and Pss of 1-4 pjserve serve workers on three 64 MiB
# models, with private host weights and with --shared-weights on /dev/shm
# (docs/benchmarks.md). Needs only .venv. Under a minute.
bench-shared-weights: build
	$(PYTHON) bench/shared_weights.py

# The host tier: how fast a model's weights are read from its file into host
# memory (--host-weight-budget), cold and from the page cache, against raw
# buffered and direct-I/O reads of the same file (bench/host_tier.py).
bench-host-tier: build
	$(PYTHON) bench/host_tier.py

# The catalogue: 10,000 models of 1 MiB under a bursty Zipf trace replayed open
# loop, pjserve with a host tier (2Gi) and with every floor in memory, against
# Ray Serve's @serve.multiplexed (.venv-bench-ray, bench/requirements-ray.txt)
# and PyTriton on the same trace (bench/catalogue.py). About 15 minutes.
RAY_VENV := .venv-bench-ray
bench-catalogue: build
	scripts/bootstrap-bench pytriton plot
	@want=$$(sha256sum bench/requirements-ray.txt | cut -d' ' -f1); \
	if [ "$$(cat $(RAY_VENV)/.requirements.sha256 2>/dev/null)" != "$$want" ]; then \
	  echo "creating $(RAY_VENV) (pinned in bench/requirements-ray.txt)"; \
	  rm -rf $(RAY_VENV) && /usr/bin/python3.11 -m venv $(RAY_VENV) && \
	  $(RAY_VENV)/bin/pip install -q --upgrade pip && \
	  $(RAY_VENV)/bin/pip install -q -r bench/requirements-ray.txt && \
	  $(RAY_VENV)/bin/pip check && echo "$$want" > $(RAY_VENV)/.requirements.sha256; \
	fi
	$(PYTHON) bench/catalogue.py

# What tracing costs: p50 and server CPU per request of the demo mlp over
# gRPC with tracing off, 1 % and 100 % sampled, exporting to an OTLP/HTTP
# receiver in the driver (docs/benchmarks.md). About a minute.
bench-tracing: build
	$(PYTHON) bench/tracing.py

# The gateway: p50/p99 of the demo mlp directly on a worker and through a
# gateway (gRPC and HTTP, concurrency 1 and 8), and the convnet's throughput
# through a gateway over 1 and 2 workers (docs/benchmarks.md). A few minutes.
bench-gateway: build
	$(PYTHON) bench/gateway.py

# torchvision's Faster R-CNN served as a meta model, against eager PyTorch
# in-process and the client orchestrating the two stages (docs/detection.md).
bench-detection: build bootstrap-torch
	.venv-torch/bin/python bench/detection.py

# Catalogue scale: one pjserve serve on 100, 1,000 and 10,000 copies of the mlp
# with distinct weights: start-up, RSS per model, idle CPU, /metrics, index and
# stats endpoints, requests (bench/catalogue_scale.py). A few minutes.
bench-catalogue-scale: build
	$(PYTHON) bench/catalogue_scale.py

# The CUDA path end to end (docs/residency.md, On a GPU): packages build/pjserve,
# the libraries it needs, a link probe and two bundles into .gpu-check/, then
# checks info, check, serve and weight-load bandwidth against the link with the
# CUDA plugin. Without a GPU it says so and fails (exit 2): carry .gpu-check/
# to a GPU machine and run .gpu-check/gpu-check --run-only there.
# TRITON_CLIENT=DIR adds Triton's two cudashm example clients from DIR
# (scripts/gpu-check --help).
gpu-check: build
	$(PYTHON) scripts/gpu-check $(if $(TRITON_CLIENT),--triton-client $(TRITON_CLIENT))

# Packages pjserve, pjs_bench_raw_execute, pjs_bench_grpc_floor, the mlp and a
# ResNet-50 (weights written there) into .gpu-bench/, then measures the request
# path with the CUDA plugin: the raw PJRT floor, pjserve with its defaults and
# each GPU lever, jax.jit and PyTorch in-process (scripts/gpu-bench --help).
# Without a GPU it says so and exits 2: carry .gpu-bench/ to a GPU machine and
# run .gpu-bench/gpu-bench --run-only there.
gpu-bench: build
	$(PYTHON) scripts/gpu-bench

# The catalogue benchmark on a GPU: packages pjserve and ResNet-50 (bf16 and
# f32, whole and in swap-in stages, weights written there) into
# .gpu-catalogue/, then writes 1,000 models of distinct weights, measures cold
# (with and without pipelined swap-in) and warm requests and replays the
# catalogue trace at rising rates (scripts/gpu-catalogue --help). Without a
# GPU it says so and exits 2: carry .gpu-catalogue/ to a GPU machine and run
# .gpu-catalogue/gpu-catalogue --run-only there.
gpu-catalogue: build
	$(PYTHON) scripts/gpu-catalogue

# The container image and the single-machine manifest run for real, with podman
# (scripts/container-check says what it runs; docs/kubernetes.md, Checking the
# image and the manifests): the image built from a clean clone of the commit,
# serving the demo models (live, ready, every model READY, the mlp's answer
# equal to the host's over gRPC and HTTP), then the KServe ServingRuntime's
# container as a Pod under podman kube play, its probes polled. Needs root and
# podman (installed when missing); not part of make test. About 10 minutes.
container-check: models
	$(PYTHON) scripts/container-check
