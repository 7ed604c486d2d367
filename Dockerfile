# flow's image: flowd and flowctl, static, no shell needed. flowd runs as root in its
# container and its exec steps as the unprivileged flow-steps (65533, FLOWD_EXEC_USER), so
# that a step reads nothing of flowd's (its environment, the users file, the data dir:
# docs/security.md); nats-server, the wallet and flowctl run as flow (65532), as
# deploy/compose.yaml says (user:). compose gives the flow nodes only the capabilities
# flowd needs for that (cap_add there).
# Also in it: nats-server (the same version flowd embeds, for the compose cluster's
# NATS containers) and the payout example (`payout node`: flowd with the payout's step
# kinds; `payout wallet`: its wallet), so that deploy/compose.yaml needs no other image.
#
# Two ways to build it:
#   docker build -t flow:dev .              the builder stage compiles in golang:1.26
#   deploy/build-image.sh                   binaries built on this machine, then the
#                                           "prebuilt" stage: no image is pulled at all
# The runtime stages are FROM scratch: there is no shell, no package manager, nothing
# but the binaries, CA certificates, the data directory and /tmp (1777: the steps'
# working directories, which flow-steps may not make in flowd's /data).

# --- prebuilt: the binaries deploy/build-image.sh compiled into deploy/out ----------------
FROM scratch AS prebuilt
COPY deploy/out/rootfs/ /
COPY --chown=65532:65532 deploy/out/datafs/ /
USER 0:0
ENV FLOWD_DATA_DIR=/data FLOWD_HTTP=0.0.0.0:8080 FLOWD_EXEC_USER=flow-steps TMPDIR=/tmp
WORKDIR /data
VOLUME ["/data"]
EXPOSE 4222 8080
ENTRYPOINT ["/usr/local/bin/flowd"]

# --- build: compile in a Go image (needs a registry) ---------------------------------------
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN sh deploy/rootfs.sh /out

# --- image: the default target ------------------------------------------------------------
FROM scratch
COPY --from=build /out/rootfs/ /
COPY --from=build --chown=65532:65532 /out/datafs/ /
USER 0:0
ENV FLOWD_DATA_DIR=/data FLOWD_HTTP=0.0.0.0:8080 FLOWD_EXEC_USER=flow-steps TMPDIR=/tmp
WORKDIR /data
VOLUME ["/data"]
EXPOSE 4222 8080
ENTRYPOINT ["/usr/local/bin/flowd"]
