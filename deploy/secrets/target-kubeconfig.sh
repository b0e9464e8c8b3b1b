#!/bin/sh
# Writes a self-contained kubeconfig for the proxy's identity on the target from
# a server URL, the target's CA and the identity's client certificate and key
# (all embedded, so the file alone is the Secret's content).
#
#   deploy/secrets/target-kubeconfig.sh https://target.example:6443 ca.crt client.crt client.key \
#     loft:vcluster:p-default:client ./kubeconfig
set -eu
server=${1:?usage: target-kubeconfig.sh SERVER CA_CRT CLIENT_CRT CLIENT_KEY USER OUT}
ca=${2:?target CA certificate}
cert=${3:?client certificate}
key=${4:?client key}
user=${5:?user name}
out=${6:?output kubeconfig}
umask 077
rm -f "$out"
kubectl --kubeconfig "$out" config set-cluster target --server="$server" \
  --certificate-authority="$ca" --embed-certs=true >/dev/null
kubectl --kubeconfig "$out" config set-credentials "$user" \
  --client-certificate="$cert" --client-key="$key" --embed-certs=true >/dev/null
kubectl --kubeconfig "$out" config set-context target --cluster=target --user="$user" >/dev/null
kubectl --kubeconfig "$out" config use-context target >/dev/null
echo "wrote $out for $user"
