#!/bin/sh
# Creates the CA every crproxy replica signs its serving certificate with:
# DIR/ca.crt and DIR/ca.key (ECDSA P-256, 10 years). The leader publishes ca.crt
# as the APIService caBundle; all replicas must share the pair, which is why it
# is a Secret and not generated per pod.
#
#   deploy/secrets/serving-ca.sh ./serving-ca
#   kubectl -n kube-system create secret generic crproxy-serving-ca \
#     --from-file=ca.crt=./serving-ca/ca.crt --from-file=ca.key=./serving-ca/ca.key
set -eu
dir=${1:?usage: serving-ca.sh DIR}
mkdir -p "$dir"
umask 077
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -days 3650 -subj "/CN=crproxy-serving-ca" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
echo "wrote $dir/ca.crt and $dir/ca.key"
