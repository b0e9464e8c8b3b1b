#!/bin/sh
# Writes the CA certificate (PEM) a kubeconfig trusts for its current cluster to
# OUT, whether the kubeconfig embeds it (certificate-authority-data) or names a
# file (certificate-authority, as minikube and hand-written kubeconfigs do).
# Fails if the kubeconfig names no CA: the proxy trusts only the CA its target
# kubeconfig gives.
#
#   deploy/secrets/target-ca.sh target-admin.kubeconfig ./target-ca.crt
set -eu
kubeconfig=${1:?usage: target-ca.sh KUBECONFIG OUT}
out=${2:?output CA file}
# --flatten inlines a certificate-authority file as certificate-authority-data.
data=$(kubectl --kubeconfig "$kubeconfig" config view --minify --flatten \
  -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
if [ -z "$data" ]; then
  echo "target-ca.sh: the current cluster of $kubeconfig names no certificate-authority; add the target's CA to that kubeconfig" >&2
  exit 1
fi
printf '%s' "$data" | base64 -d > "$out"
