// Package api is flow's request/reply API over NATS (a nats.go micro service named
// "flow", subjects flow.v1.<op>), the JSON shapes of ../shared/CONTRACT.md, and the
// client flowctl uses. Requests are versioned JSON ({"v":1,...}) and validated on the
// server; errors carry a code (bad_request, not_found, conflict, internal) and a message.
package api
