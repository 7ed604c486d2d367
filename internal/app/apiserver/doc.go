// Package apiserver serves flow's request/reply API over NATS for one node: a nats.go
// micro service named "flow", one subject per operation (flow.v1.<op>), the JSON shapes
// of package client (the public client, which flowctl is built on). Requests are
// versioned JSON ({"v":1,...}) and validated here; errors carry a code (bad_request,
// not_found, conflict, internal) and a message.
//
// The server sits beside the engine and uses it only through the Node interface: what it
// needs, in client's wire types, and nothing of the engine's store, log or election
// (this package links no engine, checkpoint, epoch or logstream). The engine's adapter,
// engine.Engine.API, implements it; flowd wires the two.
package apiserver
