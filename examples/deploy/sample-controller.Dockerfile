# syntax=docker/dockerfile:1
# The sample-controller's image, `sample-controller:dev` in examples/deploy/sample-controller.yaml
# (`cargo xtask manifests`). Build from the workspace root, then make the image reachable by the
# cluster (e.g. `kind load docker-image sample-controller:dev`) and apply the manifests:
#
#   docker build -t sample-controller:dev -f examples/deploy/sample-controller.Dockerfile .
#   kubectl apply -f examples/deploy/sample-controller.yaml
#
# Not built by the tests or CI (they run without Docker); examples/tests/manifests.rs checks the
# manifests against envtest instead.

# Build stage: the workspace's toolchain floor (rust-version in Cargo.toml), the locked
# dependencies, one binary. The cache mounts keep the registry and target/ across builds.
FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p examples --bin sample-controller \
    && cp target/release/sample-controller /sample-controller

# Run stage: glibc and nothing else (TLS is rustls, so no OpenSSL), as the non-root user the
# Deployment's securityContext requires (runAsNonRoot needs a numeric UID).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /sample-controller /sample-controller
USER 65532:65532
ENTRYPOINT ["/sample-controller"]
