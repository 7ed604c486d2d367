#!/bin/sh
# rootfs.sh DIR: the image's files under DIR: static binaries (flowd, flowctl, the
# nats-server flowd embeds, the payout example), CA certificates, the payout workflow,
# and /data owned by the image's user (65532). Used by the Dockerfile's build stage and
# by deploy/build-image.sh on the host.
set -eu
out=$1
rm -rf "$out"
mkdir -p "$out/usr/local/bin" "$out/etc/ssl/certs" "$out/usr/share/flow" "$out/data/tmp"
export CGO_ENABLED=0
flags="-trimpath -ldflags=-s"
go build $flags -o "$out/usr/local/bin/flowd" ./cmd/flowd
go build $flags -o "$out/usr/local/bin/flowctl" ./cmd/flowctl
go build $flags -o "$out/usr/local/bin/payout" ./examples/payout
go build $flags -o "$out/usr/local/bin/nats-server" github.com/nats-io/nats-server/v2
cp examples/payout/payout.yaml "$out/usr/share/flow/payout.yaml"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
	cp /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/"
fi
printf 'root:x:0:0:root:/root:/sbin/nologin\nflow:x:65532:65532:flow:/data:/sbin/nologin\n' > "$out/etc/passwd"
printf 'root:x:0:\nflow:x:65532:\n' > "$out/etc/group"
