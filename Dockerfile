# The easyrl image: one image for every role; `easyrl` is the entrypoint, so a pod's args
# are `run --role R --task I ...` (see `easyrl k8s`).
#
#   docker build -t easyrl:0.1.0 .                                 # CPU (TensorFlow CPU)
#   docker build --build-arg VARIANT=gpu -t easyrl:0.1.0-gpu .     # GPU learners
#
# Both variants start from python:3.11-slim. The GPU variant installs easyrl[gpu], i.e.
# tensorflow[and-cuda], whose wheels bring the CUDA and cuDNN libraries TensorFlow was built
# against; the NVIDIA driver comes from the node (NVIDIA container toolkit / device plugin).
# A CUDA base image would add a second, possibly mismatched CUDA. Atari (ale-py, with its
# ROMs) is installed in both.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ARG VARIANT=cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=2

WORKDIR /opt/easyrl
COPY setup.py pyproject.toml README.md ./
COPY easyrl ./easyrl
RUN case "$VARIANT" in \
        cpu) extras=atari ;; \
        gpu) extras=atari,gpu ;; \
        *) echo "VARIANT must be cpu or gpu, got '$VARIANT'" >&2; exit 1 ;; \
    esac \
    && pip install ".[$extras]" \
    && useradd --uid 1000 --create-home easyrl \
    && mkdir -p /var/easyrl/run \
    && chown -R 1000:1000 /var/easyrl

# The uid the generated pods run as (runAsUser / fsGroup 1000 in `easyrl k8s`).
USER 1000
WORKDIR /var/easyrl
ENTRYPOINT ["easyrl"]
CMD ["--help"]
