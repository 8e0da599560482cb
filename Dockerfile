# One image for every Shardline service: PostgreSQL aside, the API, the Ray head and the
# Ray workers (GPU or CPU) all run the same installed package (docker-compose.yml picks
# the command). .dockerignore keeps the build context to what is copied below.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

WORKDIR /build
COPY pyproject.toml constraints.txt README.md ./
COPY api ./api
COPY service ./service
COPY workers ./workers
COPY migrations ./migrations
COPY src ./src
# A regular (non-editable) install: the status page, the docs assets and the migrations
# are in the package, so nothing below depends on this folder. torch comes from PyPI as
# its CUDA build, which the GPU workers need; constraints.txt pins its version.
RUN pip install -c constraints.txt '.[postgres]' && rm -rf /build

RUN useradd --create-home --uid 1000 shardline \
    && mkdir -p /srv/shardline/storage /srv/shardline/data /srv/shardline/state \
    && chown -R shardline /srv/shardline
# The example specs, so that `docker compose exec api shardline submit examples/demo.yaml`
# works with nothing installed on the host.
COPY examples /srv/shardline/examples
USER shardline
WORKDIR /srv/shardline
EXPOSE 8000
CMD ["shardline", "serve"]
