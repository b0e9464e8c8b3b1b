#!/bin/sh
# Builds the crproxy image without any registry: a static binary from the host's
# toolchain, wrapped by deploy/image/Containerfile on `scratch` with buildah,
# then checks that the image's binary runs and is static. Writes an OCI archive
# (load it with `kind load image-archive`, `ctr -n k8s.io images import`, or push
# it with `skopeo copy oci-archive:... docker://REGISTRY/crproxy:TAG`).
#
# The binary is profile-guided, as the Dockerfile builds it (scripts/pgo-build,
# some 25 minutes on 2 cores); PGO=0 builds it once, plain.
#
#   deploy/image/build-local.sh [TAG] [ARCHIVE]
set -eu
tag=${1:-crproxy:dev}
archive=${2:-crproxy-image.tar}
root=$(cd "$(dirname "$0")/../.." && pwd)
target="$(uname -m)-unknown-linux-gnu"
cd "$root"
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
export RUSTFLAGS
if [ "${PGO:-1}" = 1 ]; then
  # Its only output is the binary's path.
  binary=$(scripts/pgo-build --locked --no-default-features)
else
  cargo build --release --locked -p crproxy --no-default-features --bin crproxy --target "$target"
  binary="${CARGO_TARGET_DIR:-$root/target}/$target/release/crproxy"
fi
# A static executable has no program interpreter: `ldd` says so.
ldd "$binary" 2>&1 | grep -q "statically linked" || { echo "$binary is not static" >&2; exit 1; }
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$binary" "$context/crproxy"
# vfs needs no kernel overlay support; chroot isolation no user namespaces.
buildah --storage-driver vfs bud -f deploy/image/Containerfile -t "$tag" "$context"
container=$(buildah --storage-driver vfs from "$tag")
buildah --storage-driver vfs run --isolation chroot "$container" -- /crproxy --version
buildah --storage-driver vfs rm "$container" >/dev/null
rm -f "$archive"
buildah --storage-driver vfs push "$tag" "oci-archive:$archive:$tag"
echo "image $tag written to $archive"
