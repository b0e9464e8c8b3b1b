#!/bin/sh
# Issues the client identity's credentials on the TARGET cluster and writes the
# kubeconfig the proxy uses there (the crproxy-target-kubeconfig Secret).
#
# The identity is loft:vcluster:<projectNamespace>:<name> (the client's
# `client.projectNamespace` and `client.name`). It gets a client certificate
# through the target's CertificateSigningRequest API, signed by the target's
# API server client CA; run this with credentials that may create and approve
# CSRs on the target.
#
#   deploy/secrets/target-identity.sh target-admin.kubeconfig p-default client ./target-identity
#   kubectl -n kube-system create secret generic crproxy-target-kubeconfig \
#     --from-file=kubeconfig=./target-identity/kubeconfig
set -eu
admin=${1:?usage: target-identity.sh TARGET_ADMIN_KUBECONFIG PROJECT_NAMESPACE NAME DIR}
project_namespace=${2:?project namespace}
name=${3:?client name}
dir=${4:?output directory}
user="loft:vcluster:${project_namespace}:${name}"
csr="crproxy-${project_namespace}-${name}"
mkdir -p "$dir"
umask 077
# Server and CA of the target, as the admin kubeconfig has them; first, so a
# kubeconfig without a CA fails before anything is created on the target.
server=$(kubectl --kubeconfig "$admin" config view --minify --raw -o jsonpath='{.clusters[0].cluster.server}')
"$(dirname "$0")/target-ca.sh" "$admin" "$dir/ca.crt"
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -subj "/CN=${user}" -keyout "$dir/client.key" -out "$dir/client.csr" 2>/dev/null
kubectl --kubeconfig "$admin" delete csr "$csr" --ignore-not-found >/dev/null
kubectl --kubeconfig "$admin" apply -f - <<YAML
apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata:
  name: ${csr}
spec:
  request: $(base64 < "$dir/client.csr" | tr -d '\n')
  signerName: kubernetes.io/kube-apiserver-client
  expirationSeconds: 31536000
  usages: [client auth]
YAML
kubectl --kubeconfig "$admin" certificate approve "$csr"
for _ in 1 2 3 4 5 6 7 8 9 10; do
  kubectl --kubeconfig "$admin" get csr "$csr" -o jsonpath='{.status.certificate}' \
    | base64 -d > "$dir/client.crt"
  [ -s "$dir/client.crt" ] && break
  sleep 1
done
[ -s "$dir/client.crt" ] || { echo "the target did not issue the certificate" >&2; exit 1; }
"$(dirname "$0")/target-kubeconfig.sh" "$server" "$dir/ca.crt" "$dir/client.crt" "$dir/client.key" "$user" "$dir/kubeconfig"
