#!/bin/sh
# up.sh: the compose cluster with one command: builds flow:dev (no image pulled), makes
# its certificates, passwords and NATS configuration in deploy/run (once), and starts
# three NATS servers, three flow nodes and the wallet. docs/operations.md, "Containers".
# Teardown: deploy/down.sh.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
compose() { docker-compose -f "$here/compose.yaml" "$@"; }
case "${1:-}" in
-h | --help)
	cat <<USAGE
usage: deploy/up.sh [docker-compose up arguments, e.g. --scale worker=2 or a SERVICE]

Builds the image flow:dev, makes deploy/run (certificates and passwords; once, as root)
and starts the cluster in the background (docker-compose up -d). The UIs are published
on 127.0.0.1, ports FLOW_UI_PORT_1..3 (default 8081..8083); up.sh prints the ones used.

Teardown:
  deploy/down.sh              stops and removes the containers and the network; the
                              volumes (the log, the nodes' state, the wallet) stay, and
                              up.sh starts the same cluster again
  deploy/down.sh --volumes    also removes the volumes: every run and the wallet's ledger
  sudo rm -rf deploy/run      also forgets the certificates and passwords (up.sh makes
                              new ones)
USAGE
	exit 0
	;;
esac
"$here/build-image.sh"
[ -f "$here/run/nats-1.conf" ] || "$here/setup.sh" "$here/run"
compose up -d "$@"
# The port each node's UI was published on, as compose has it (FLOW_UI_PORT_n, or the
# default): "127.0.0.1:8081" -> 8081.
ui_port() {
	p=$(compose port "flowd-$1" 8080 2>/dev/null | tail -n 1) || p=
	p=${p##*:}
	[ -n "$p" ] || p=$2
	echo "$p"
}
p1=$(ui_port 1 "${FLOW_UI_PORT_1:-8081}")
p2=$(ui_port 2 "${FLOW_UI_PORT_2:-8082}")
p3=$(ui_port 3 "${FLOW_UI_PORT_3:-8083}")
echo "UI: http://localhost:$p1/ui/ (the other nodes: $p2, $p3; sign in as ops, password in $here/run/ops.env)"
echo "flowctl: docker-compose -f $here/compose.yaml run --rm flowctl cluster status"
echo "teardown: $here/down.sh (keeps the data; --volumes removes it)"
