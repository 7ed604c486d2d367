// Package audit carries who asked for a change, from the API request that names them
// to the log entries it writes: the NATS user the server vouches for (its
// Nats-Request-Info header, which it writes on requests that cross from the users'
// account into flow's: docs/security.md).
package audit

import (
	"context"
	"encoding/json"
)

// RequestInfoHeader is the header the NATS server writes on a request that crossed a
// service import with the requester's identity shared (it replaces any the client set).
const RequestInfoHeader = "Nats-Request-Info"

type actorKey struct{}

// WithActor returns ctx carrying the actor of the writes made under it ("" is none).
func WithActor(ctx context.Context, actor string) context.Context {
	if actor == "" {
		return ctx
	}
	return context.WithValue(ctx, actorKey{}, actor)
}

// Actor is the actor ctx carries, or "".
func Actor(ctx context.Context) string {
	a, _ := ctx.Value(actorKey{}).(string)
	return a
}

// ActorFromRequestInfo is the user named by a Nats-Request-Info header's value, as
// "user" or "user@account" when the account is not the users' default one; "" when the
// header is absent or names no user (a request from flow's own account: a node's).
func ActorFromRequestInfo(header string) string {
	if header == "" {
		return ""
	}
	var info struct {
		User    string `json:"user"`
		Name    string `json:"name"`
		Account string `json:"acc"`
	}
	if json.Unmarshal([]byte(header), &info) != nil || info.User == "" {
		return ""
	}
	if len(info.User) > 256 {
		info.User = info.User[:256]
	}
	return info.User
}

// Requester is who sent a request whose Nats-Request-Info header is header, as one
// key: the account and the user ("FLOW_USERS/otto"); "" when the header names no user
// (no header: a request from flow's own account, or a server without accounts). The
// API's per-user limits count by it.
func Requester(header string) string {
	if header == "" {
		return ""
	}
	var info struct {
		User    string `json:"user"`
		Account string `json:"acc"`
	}
	if json.Unmarshal([]byte(header), &info) != nil || info.User == "" {
		return ""
	}
	return info.Account + "/" + info.User
}
