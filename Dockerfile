# dupguard container image.
#
# Two stages: the builder creates a virtual environment at /opt/dupguard, dependencies first (their
# own layer, rebuilt only when pyproject.toml changes) and then the dupguard wheel; the final stage
# is a plain slim Python with that venv copied in: no compilers, no pip cache, no source tree.
# The install steps live in deploy/docker/install.sh, which tests/deploy/test_deploy_image.py also runs;
# tests/deploy/test_release.py builds this file with buildah and runs the image (docs/release.md).
#
#   deploy/docker/build.sh registry.example.com/airflow-dupguard   # tags and OCI labels from git
#   docker run --rm --read-only airflow-dupguard:1.0.0 --help
#
# Tag scheme (docs/how-to/deploy-kubernetes.md, section 1): <version> for a release (immutable), <version>-<short sha>
# for any other commit; never `latest` in manifests.

ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DUPGUARD_VENV=/opt/dupguard
WORKDIR /src
COPY deploy/docker/install.sh deploy/docker/requirements.txt deploy/docker/
COPY pyproject.toml ./
RUN sh deploy/docker/install.sh deps
COPY README.md ./
COPY detector/ detector/
RUN sh deploy/docker/install.sh app

FROM ${PYTHON_IMAGE}
# OCI annotations: deploy/docker/build.sh passes the package version, the git commit and the
# repository URL; the defaults mark an image built without them.
ARG VERSION=1.0.0
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="airflow-dupguard" \
      org.opencontainers.image.description="Detects, alerts on and stops duplicate asset-triggered Airflow DAG runs." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
# A fixed UID/GID so that runAsUser/runAsGroup in the manifests match and runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 dupguard \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin dupguard
COPY --from=builder /opt/dupguard /opt/dupguard
# Read-only root filesystem: no .pyc writes (the builder compiled them), unbuffered logs to stdout,
# and the only writable place a pod needs to provide is /tmp (an emptyDir in the manifests).
ENV PATH=/opt/dupguard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    DUPGUARD_HTTP_PORT=9469
USER 10001:10001
WORKDIR /tmp
EXPOSE 9469
ENTRYPOINT ["dupguard"]
CMD ["run"]
