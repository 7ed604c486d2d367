// Package client calls a flow cluster from Go over NATS: apply workflows, start, get,
// list, wait for, watch, retry and cancel runs, work the dead-letter queue, read
// schedules and the cluster's status. It is what flowctl is built on, and it links no
// server code, no Pebble and no engine: a program that only calls flow stays small.
//
//	c, err := client.Dial("nats://127.0.0.1:4222")
//	if err != nil { ... }
//	defer c.Close()
//	id, err := c.StartRun(ctx, "nightly-payout", client.StartOptions{Inputs: map[string]string{"date": "2026-12-01"}})
//	run, err := c.WatchRun(ctx, id, nil) // run.Status: succeeded, failed, ...
//
// Every operation is a request on its own subject, flow.v1.<op> (a NATS micro service
// named "flow"; any node answers): the wire shapes are the exported types here and
// ../shared/CONTRACT.md's JSON. A server's refusal is an *Error with a Code; an
// operation the NATS server does not allow this user is ErrNotAuthorized (see
// ErrorHandler for connections made with New); no answer at all is ErrUnreachable.
// docs/client.md has more.
package client
