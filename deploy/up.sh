#!/bin/sh
# up.sh: the compose cluster with one command: builds flow:dev (no image pulled), makes
# its certificates, passwords and NATS configuration in deploy/run (once), and starts
# three NATS servers, three flow nodes and the wallet. docs/operations.md, "Containers".
set -eu
here=$(cd "$(dirname "$0")" && pwd)
"$here/build-image.sh"
[ -f "$here/run/nats-1.conf" ] || "$here/setup.sh" "$here/run"
docker-compose -f "$here/compose.yaml" up -d "$@"
echo "UI: http://localhost:8081/ui/   flowctl: docker-compose -f $here/compose.yaml run --rm flowctl cluster status"
