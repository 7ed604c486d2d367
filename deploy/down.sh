#!/bin/sh
# down.sh [--volumes]: the teardown of up.sh's compose cluster: stops and removes its
# containers and network (docker-compose down). The volumes (the log, the nodes' state,
# the wallet) stay unless --volumes; deploy/run (certificates, passwords) always stays.
# docs/operations.md, "Containers".
set -eu
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
-h | --help)
	cat <<USAGE
usage: deploy/down.sh [--volumes] [other docker-compose down options]

Stops and removes the containers and the network of deploy/up.sh's cluster
(docker-compose down). The volumes stay, and up.sh starts the same cluster again.
  --volumes   also removes the volumes: the log, the nodes' state and the wallet's
              ledger (every run is gone)
deploy/run (certificates and passwords) stays; sudo rm -rf deploy/run forgets them too.
USAGE
	exit 0
	;;
esac
docker-compose -f "$here/compose.yaml" --profile workers --profile tools down "$@"
