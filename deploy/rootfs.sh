#!/bin/sh
# rootfs.sh DIR: the image's files: DIR/rootfs, static binaries (flowd, flowctl, the
# nats-server flowd embeds, the payout example), CA certificates, the payout workflow;
# DIR/datafs, the data directory (/data, 0700), which the Dockerfile copies owned by the
# user flow (65532); /tmp (1777) for the working directories of exec steps, which run as
# flow-steps (65533) and may not enter /data. Used by the Dockerfile's build stage and by
# deploy/build-image.sh on the host.
set -eu
top=$1
out=$top/rootfs
rm -rf "$out" "$top/datafs"
mkdir -p "$out/usr/local/bin" "$out/etc/ssl/certs" "$out/usr/share/flow" "$out/tmp" "$top/datafs/data/tmp"
chmod 700 "$top/datafs/data" "$top/datafs/data/tmp"
chmod 1777 "$out/tmp"
export CGO_ENABLED=0
version=$(git describe --always --dirty 2>/dev/null || echo dev)
# timetzdata: schedules name IANA zones, and the image has no /usr/share/zoneinfo.
build() { go build -trimpath -tags timetzdata -ldflags "-s -X github.com/flowrun/flow/engine.version=$version" -o "$@"; }
build "$out/usr/local/bin/flowd" ./cmd/flowd
build "$out/usr/local/bin/flowctl" ./cmd/flowctl
build "$out/usr/local/bin/payout" ./examples/payout
build "$out/usr/local/bin/nats-server" github.com/nats-io/nats-server/v2
cp examples/payout/payout.yaml "$out/usr/share/flow/payout.yaml"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
	cp /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/"
fi
# flow: nats-server, the wallet, flowctl (compose's user:). flow-steps: flowd's exec
# steps (FLOWD_EXEC_USER), who owns nothing and may read none of /etc/flow's secrets.
printf 'root:x:0:0:root:/root:/sbin/nologin\nflow:x:65532:65532:flow:/data:/sbin/nologin\nflow-steps:x:65533:65533:flow steps:/tmp:/sbin/nologin\n' > "$out/etc/passwd"
printf 'root:x:0:\nflow:x:65532:\nflow-steps:x:65533:\n' > "$out/etc/group"
