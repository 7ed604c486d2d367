// Package clustertest runs flow the way operators do: real nats-server processes
// forming a JetStream cluster on loopback, and real flowd processes joining it, that
// tests SIGKILL, SIGSTOP and restart. The binaries are built from this module (the
// nats-server from its pinned module version).
package clustertest
