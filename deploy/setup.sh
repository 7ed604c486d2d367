#!/bin/sh
# setup.sh DIR: what deploy/compose.yaml mounts at /etc/flow, made fresh in DIR: a CA and
# the NATS servers' certificate (TLS on the client port and on the routes), a random
# password per user, each NATS server's configuration with the users and their
# permissions from `flowctl auth permissions` (node, and an operator "ops"), and the
# environment files of the flowd nodes (node.env) and of flowctl (ops.env).
# Needs openssl and the flowctl that deploy/build-image.sh built (or FLOWCTL=path).
set -eu
dir=${1:?usage: setup.sh DIR}
if [ "$(id -u)" != 0 ]; then
	echo "setup.sh: run it as root (sudo): its files must belong to root or to the NATS containers' user, 65532, and no one else" >&2
	exit 1
fi
here=$(cd "$(dirname "$0")" && pwd)
flowctl=${FLOWCTL:-$here/out/rootfs/usr/local/bin/flowctl}
mkdir -p "$dir"
cd "$dir"

# The CA and one certificate for the three servers (their names on the compose network,
# and localhost for the published port).
openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=flow compose CA" \
	-keyout ca-key.pem -out ca.pem 2>/dev/null
cat > server.ext <<EXT
subjectAltName = DNS:nats-1, DNS:nats-2, DNS:nats-3, DNS:localhost, IP:127.0.0.1
extendedKeyUsage = serverAuth, clientAuth
EXT
openssl req -newkey rsa:2048 -nodes -subj "/CN=nats" -keyout server-key.pem -out server.csr 2>/dev/null
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 365 \
	-extfile server.ext -out server.pem 2>/dev/null
rm -f server.csr server.ext ca.srl

pw() { openssl rand -hex 16; }
node_pw=$(pw)
ops_pw=$(pw)
"$flowctl" auth permissions node -o json > node.json
"$flowctl" auth permissions operator --user ops -o json > ops.json

for i in 1 2 3; do
	cat > "nats-$i.conf" <<CONF
server_name: nats-$i
listen: 0.0.0.0:4222
max_payload: 8MB
jetstream { store_dir: /data/jetstream, sync_interval: always }
tls { cert_file: /etc/flow/server.pem, key_file: /etc/flow/server-key.pem }
cluster {
  name: flow
  listen: 0.0.0.0:6222
  routes: [nats-route://nats-1:6222, nats-route://nats-2:6222, nats-route://nats-3:6222]
  tls { cert_file: /etc/flow/server.pem, key_file: /etc/flow/server-key.pem, ca_file: /etc/flow/ca.pem, verify: true }
}
accounts {
  FLOW {
    jetstream: enabled
    users: [ {user: node, password: "$node_pw", permissions: $(cat node.json)} ]
    exports: [ {service: "flow.v1.>", response_threshold: "24h"} ]
  }
  FLOW_USERS {
    users: [ {user: ops, password: "$ops_pw", permissions: $(cat ops.json)} ]
    imports: [ {service: {account: FLOW, subject: "flow.v1.>"}, share: true} ]
  }
}
CONF
done

servers=tls://nats-1:4222,tls://nats-2:4222,tls://nats-3:4222
cat > node.env <<ENV
FLOWD_NATS_URL=$servers
FLOWD_NATS_USER=node
FLOWD_NATS_PASSWORD=$node_pw
FLOWD_NATS_TLS_CA=/etc/flow/ca.pem
ENV
# The people (flowd --auth): the web UI's sign-in and the approvers' roles. Their names
# and passwords are the NATS servers' (FLOW_USERS above).
cat > people.yaml <<YAML
users:
  - {user: ops, password: "$ops_pw", role: operator}
YAML
cat > ops.env <<ENV
FLOW_SERVER=$servers
FLOW_USER=ops
FLOW_PASSWORD=$ops_pw
FLOW_TLS_CA=/etc/flow/ca.pem
ENV

# Who reads what (the directory is /etc/flow in every container): the NATS servers
# (65532) their configuration (every user's password) and the server's key; flowd (root
# in its container) people.yaml; docker-compose, on this host, node.env and ops.env;
# nobody the CA's key (kept for issuing more certificates). Certificates are public.
# No secret is readable by anyone else: not by the flow nodes' exec steps (flow-steps,
# 65533), nor, on this host, by other users (internal/testkit/dockertest checks it).
chown 0:0 ./*
chmod 600 ./*
chmod 400 ca-key.pem
chmod 644 ca.pem server.pem node.json ops.json
chown 65532:65532 nats-1.conf nats-2.conf nats-3.conf server-key.pem
chmod 755 .
echo "wrote $dir: CA and certificate, nats-{1,2,3}.conf, people.yaml, node.env, ops.env (the ops user's password is in ops.env)"
