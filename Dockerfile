# syntax=docker/dockerfile:1
#
# devicehost node image: the host plus the backends named in BACKENDS, nothing else.
#
#   docker build -t devicehost:0.1.0-example --build-arg BACKENDS="devicehost-example" .
#   docker build -t devicehost:0.1.0-nvidia  --build-arg BACKENDS="devicehost-nvidia" .
#
# Stage "wheels" builds wheels of the host, the chosen backends and all their dependencies;
# stage "runtime" installs only those wheels (no index, no compiler) into a slim Python.
# RUN --mount needs BuildKit (the default builder since Docker 23; buildah and podman have it).

# A tag, never `latest`: a node image must rebuild the same. Override with a digest-pinned
# reference (python:3.12-slim-bookworm@sha256:...) for fully reproducible builds.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheels
# Space-separated distribution names; each one is built from plugins/<name>.
ARG BACKENDS="devicehost-example devicehost-hostdev"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY . .
# One resolver run for the host and every backend: the backends' `devicehost` requirement is then
# satisfied by the local host project, never by a same-named distribution from an index.
RUN set -eu; \
    projects="."; \
    for backend in ${BACKENDS}; do \
        if [ ! -d "plugins/${backend}" ]; then \
            echo "BACKENDS names ${backend}, but there is no plugins/${backend}" >&2; exit 1; \
        fi; \
        projects="${projects} plugins/${backend}"; \
    done; \
    python -m pip wheel --wheel-dir /wheels ${projects}

FROM ${PYTHON_IMAGE} AS runtime
ARG BACKENDS="devicehost-example devicehost-hostdev"
# The user the process runs as. Default 0 (root), because that is what works on a stock node:
# a device plugin creates its sockets in the kubelet's device-plugins and plugins_registry
# directories (hostPath mounts owned by root, mode 0750/0755, emptied and recreated by the
# kubelet on every restart) and connects to kubelet.sock, which needs write permission on the
# socket file, also root's. The DaemonSet still drops every capability and forbids privilege
# escalation, so "root" here is a root without CAP_DAC_OVERRIDE, CAP_SYS_ADMIN and friends.
# Build with --build-arg DEVICEHOST_USER=devicehost (uid 10001) only where the node gives that uid
# write access to those directories (and keeps it across kubelet restarts).
ARG DEVICEHOST_USER=0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin devicehost
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links /wheels devicehost ${BACKENDS} \
    && python -m pip check \
    && command -v devicehost
LABEL org.opencontainers.image.title="devicehost" \
      org.opencontainers.image.description="Python host for Kubernetes device plugins" \
      org.opencontainers.image.licenses="Apache-2.0"
USER ${DEVICEHOST_USER}
# /metrics, /healthz, /readyz when metrics_address is 0.0.0.0:9464 (deploy/base/config.yaml).
EXPOSE 9464
# No HEALTHCHECK: Kubernetes ignores it; the DaemonSet's probes use /healthz and /readyz.
ENTRYPOINT ["devicehost", "run"]
CMD ["--config", "/etc/devicehost/config.yaml"]
