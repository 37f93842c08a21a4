# syntax=docker/dockerfile:1
#
# devicehost node image: the host plus the backends named in BACKENDS, nothing else, in a venv.
#
#   docker build -t devicehost:0.1.0-example --build-arg BACKENDS=devicehost-example .
#   docker build -t acme-devicehost:1.0 --build-arg BACKENDS="wheels/acme_devicehost-1.0-py3-none-any.whl" .
#   docker build -t acme-devicehost:1.0 --build-arg BACKENDS="acme-devicehost==1.0" .
#
# BACKENDS is a space-separated list; each word is one of
#   - a bundled backend: a distribution under plugins/ (devicehost-example), built from there;
#   - a wheel file in the build context, ending in .whl (a glob such as wheels/acme-*.whl works);
#   - any other pip requirement specifier (acme-devicehost==1.0), resolved from the index.
# Every wheel under wheels/ in the build context is also offered to pip (--find-links): put your
# backend's wheel and its dependencies there. With --build-arg PIP_NO_INDEX=1 the build uses no
# index at all (offline): wheels/ must then hold every dependency, and setuptools for the build.
# PIP_INDEX_URL and PIP_EXTRA_INDEX_URL are passed to pip as well (your own index).
#
# The base image and its Python are build arguments. Any image with `python$PYTHON_VERSION` and
# its venv module works: the official python:*-slim images, or plain Debian with python3 and
# python3-venv (--build-arg BASE_IMAGE=debian-with-python3 --build-arg PYTHON_VERSION=3.11). pip
# only ever installs into the venv /opt/devicehost, so an "externally managed" system Python
# (PEP 668) is never touched.
# Stage "wheels" builds wheels of the host, the chosen backends and all their dependencies;
# stage "runtime" installs only those wheels (no index, no compiler).
# RUN --mount needs BuildKit (the default builder since Docker 23; buildah and podman have it).

ARG PYTHON_VERSION=3.12
# A tag, never `latest`: a node image must rebuild the same. Override with a digest-pinned
# reference (python:3.12-slim-bookworm@sha256:...) for fully reproducible builds.
ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim-bookworm

FROM ${BASE_IMAGE} AS wheels
ARG PYTHON_VERSION
ARG BACKENDS="devicehost-example devicehost-hostdev"
# pip reads these from the environment; declared without a default, an unset one stays unset.
ARG PIP_NO_INDEX
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_FIND_LINKS=/src/wheels
WORKDIR /src
COPY . .
# One resolver run for the host and every backend: a backend's `devicehost` requirement is then
# satisfied by the local host project, never by a same-named distribution from an index.
# /wheels/install.txt lists what the runtime installs: the host and each backend as named here.
RUN set -euf; \
    mkdir -p /src/wheels /wheels; \
    "python${PYTHON_VERSION}" -m venv /build; \
    projects="."; \
    echo devicehost > /wheels/install.txt; \
    for backend in ${BACKENDS}; do \
        case "${backend}" in \
        *.whl) \
            set +f; found=""; \
            for wheel in ${backend}; do \
                if [ -f "${wheel}" ]; then found=1; projects="${projects} ${wheel}"; \
                    echo "/wheels/$(basename "${wheel}")" >> /wheels/install.txt; fi; \
            done; \
            set -f; \
            if [ -z "${found}" ]; then \
                echo "BACKENDS names ${backend}, but the build context has no such wheel" >&2; exit 1; \
            fi ;; \
        */*) \
            echo "BACKENDS names ${backend}: not a wheel (*.whl), plugins/ name or requirement" >&2; \
            exit 1 ;; \
        *) \
            if [ -d "plugins/${backend}" ]; then \
                projects="${projects} plugins/${backend}"; \
            else \
                projects="${projects} ${backend}"; \
            fi; \
            echo "${backend}" >> /wheels/install.txt ;; \
        esac; \
    done; \
    /build/bin/pip wheel --wheel-dir /wheels ${projects}

FROM ${BASE_IMAGE} AS runtime
ARG PYTHON_VERSION
# The user the process runs as. Default 0 (root), because that is what works on a stock node:
# a device plugin creates its sockets in the kubelet's device-plugins and plugins_registry
# directories (hostPath mounts owned by root, mode 0750/0755, emptied and recreated by the
# kubelet on every restart) and connects to kubelet.sock, which needs write permission on the
# socket file, also root's. The DaemonSet still drops every capability and forbids privilege
# escalation, so "root" here is a root without CAP_DAC_OVERRIDE, CAP_SYS_ADMIN and friends.
# Build with --build-arg DEVICEHOST_USER=10001 (the user "devicehost") only where the node gives
# that uid write access to those directories (and keeps it across kubelet restarts).
ARG DEVICEHOST_USER=0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/devicehost/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The user without useradd (not in every base): one line in passwd and group is all it takes.
RUN grep -q '^devicehost:' /etc/passwd \
    || { echo 'devicehost:x:10001:10001:devicehost:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
         && echo 'devicehost:x:10001:' >> /etc/group; }
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    "python${PYTHON_VERSION}" -m venv /opt/devicehost \
    && pip install --no-index --find-links /wheels -r /wheels/install.txt \
    && pip check \
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
