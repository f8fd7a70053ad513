# handoff's container image: one fully static binary (musl) on an empty base.
#
#   docker build --build-arg HANDOFF_GIT_COMMIT=$(git rev-parse --short HEAD) -t handoff:dev .
#
# hack/image.sh builds the same image (same file, user, entrypoint and labels) without a Docker
# daemon and without pulling anything. VERSION must equal Cargo.toml's version: a test in
# tests/manifests.rs checks it, so a release bumps Cargo.toml and this line together.
ARG VERSION=0.1.0

# ---- build: a static binary for x86_64-unknown-linux-musl --------------------------------
FROM docker.io/library/rust:1.95-bookworm AS build
# ring compiles C and assembly: musl-gcc comes with Debian's musl-tools.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
# The dependencies first, so that a source change does not rebuild them.
COPY Cargo.toml Cargo.lock build.rs ./
RUN mkdir -p src benches \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && echo 'fn main() {}' > benches/micro.rs \
 && HANDOFF_GIT_COMMIT=deps cargo build --release --locked --target x86_64-unknown-linux-musl \
 && rm -rf src benches
COPY src ./src
COPY benches ./benches
# There is no .git in the build context: the commit comes in as a build argument.
ARG HANDOFF_GIT_COMMIT=unknown
RUN touch src/main.rs src/lib.rs \
 && HANDOFF_GIT_COMMIT=${HANDOFF_GIT_COMMIT} \
    cargo build --release --locked --target x86_64-unknown-linux-musl \
 && cp target/x86_64-unknown-linux-musl/release/handoff /handoff \
 && strip /handoff \
 && /handoff --version

# ---- the image: nothing but the binary ---------------------------------------------------
FROM scratch
ARG VERSION
ARG HANDOFF_GIT_COMMIT=unknown
LABEL org.opencontainers.image.title="handoff" \
      org.opencontainers.image.description="Kubernetes admission webhooks that keep workloads whole while they move between clusters" \
      org.opencontainers.image.source="https://github.com/handoff-dev/handoff" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${HANDOFF_GIT_COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /handoff /handoff
# The manifests run it as 65532 too (runAsNonRoot needs a numeric user: there is no
# /etc/passwd in this image).
USER 65532:65532
EXPOSE 8443 9090
ENTRYPOINT ["/handoff"]
CMD ["serve"]
