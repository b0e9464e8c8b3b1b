# The crproxy image: a static binary on an empty base, running as a non-root
# user. Nothing else is in the image: no shell, no libc, no CA bundle (crproxy
# takes every CA it trusts from its kubeconfigs and the service account mount).
#
#   docker build -t registry.example/crproxy:0.1.0 .
#   (or: buildah bud -t registry.example/crproxy:0.1.0 .)
#
# Without network access to a base image registry, build the static binary on
# the host and wrap it with deploy/image/Containerfile instead (see
# docs/operations.md, "Deploy on real clusters").

FROM docker.io/library/rust:1.90-bookworm AS build
WORKDIR /src
COPY . .
# Profile-guided (scripts/pgo-build): the benchmark drives an instrumented build
# on loopback inside this stage, then crproxy is built again with that profile;
# three release builds, some 25 minutes on 2 cores. `--build-arg PGO=0` builds
# it once, plain (more CPU per request: docs/performance.md).
ARG PGO=1
# glibc linked statically (crt-static): the binary runs on `scratch`.
RUN target="$(uname -m)-unknown-linux-gnu" \
 && export RUSTFLAGS="-C target-feature=+crt-static" \
 && if [ "$PGO" = 1 ]; then \
      binary="$(scripts/pgo-build --locked --no-default-features)"; \
    else \
      cargo build --release --locked -p crproxy --no-default-features --bin crproxy --target "$target" \
      && binary="target/$target/release/crproxy"; \
    fi \
 && cp "$binary" /crproxy

FROM scratch
COPY --from=build /crproxy /crproxy
# The uid/gid the manifests' securityContext expects (runAsNonRoot).
USER 65532:65532
ENTRYPOINT ["/crproxy"]
CMD ["run", "--config", "/etc/crproxy/config.yaml"]
