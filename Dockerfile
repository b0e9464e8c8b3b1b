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
# glibc linked statically (crt-static): the binary runs on `scratch`.
RUN target="$(uname -m)-unknown-linux-gnu" \
 && RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked -p crproxy --no-default-features --bin crproxy --target "$target" \
 && cp "target/$target/release/crproxy" /crproxy

FROM scratch
COPY --from=build /crproxy /crproxy
# The uid/gid the manifests' securityContext expects (runAsNonRoot).
USER 65532:65532
ENTRYPOINT ["/crproxy"]
CMD ["run", "--config", "/etc/crproxy/config.yaml"]
