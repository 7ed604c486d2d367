package client

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// The roles of flow's users (CONTRACT.md, "Security"), each allowed everything the one
// before it is. A role is enforced by the NATS server as subject permissions (every
// operation has its own subject, Subject.<op>): flowd checks no role itself.
const (
	RoleViewer   = "viewer"   // every read; approve and reject (the step's approvers role is the node's to check)
	RoleOperator = "operator" // workflow apply, run start/retry/cancel/signal, dlq retry, cron pause/resume/backfill, cluster snapshot/hold, log dump
	RoleAdmin    = "admin"    // dlq purge, drill zombie, cluster forget/unhold/repair
	RoleNode     = "node"     // a flowd process: the log, the buckets, flow's streams; not the API
)

// Roles are the roles, the least first.
var Roles = []string{RoleViewer, RoleOperator, RoleAdmin, RoleNode}

// opRoles is the least role each API operation needs.
var opRoles = map[string]string{
	"workflow.list": RoleViewer, "workflow.show": RoleViewer, "workflow.validate": RoleViewer,
	"run.get": RoleViewer, "run.list": RoleViewer, "run.wait": RoleViewer, "run.history": RoleViewer, "run.verify": RoleViewer,
	"run.logs": RoleViewer, // what steps printed is read as their outputs are
	"dlq.list": RoleViewer, "dlq.show": RoleViewer, "cron.list": RoleViewer, "cron.next": RoleViewer, "cluster.status": RoleViewer,
	"limits": RoleViewer,
	// Anyone may ask to approve or reject: the node checks the person against the
	// approval step's approvers role (engine.Decide).
	"run.approve": RoleViewer, "run.reject": RoleViewer,

	"workflow.apply": RoleOperator, "run.start": RoleOperator, "run.retry": RoleOperator, "run.cancel": RoleOperator,
	"run.signal": RoleOperator, "dlq.retry": RoleOperator, "cluster.snapshot": RoleOperator,
	"cron.pause": RoleOperator, "cron.resume": RoleOperator, "cron.backfill": RoleOperator,
	"log.dump": RoleOperator, "cluster.hold": RoleOperator,

	"dlq.purge": RoleAdmin, "drill.zombie": RoleAdmin,
	// Forgetting a node, or releasing a hold, lets the cluster version move past what
	// the nodes still running read.
	"cluster.forget": RoleAdmin, "cluster.unhold": RoleAdmin,
	// Repair deletes and recreates flow's buckets and the tasks stream (sealed or
	// reconfigured ones): it ends every lease and the term held.
	"cluster.repair": RoleAdmin,
}

// Operations are the API's operations, sorted.
func Operations() []string {
	ops := make([]string, 0, len(opRoles))
	for op := range opRoles {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	return ops
}

// RoleFor is the least role that may call op ("" for an operation flow does not have).
func RoleFor(op string) string { return opRoles[op] }

// RoleAllows says whether role may call op.
func RoleAllows(role, op string) bool {
	need, ok := opRoles[op]
	return ok && roleRank(role) >= roleRank(need) && roleRank(need) >= 0
}

func roleRank(role string) int { return slices.Index(Roles, role) }

// Permissions is a NATS user's permissions block, as the server's configuration writes
// it (and as flowd gives its embedded server for --auth).
type Permissions struct {
	Publish   SubjectPermission `json:"publish"`
	Subscribe SubjectPermission `json:"subscribe"`
	// Responses, when set, lets the user answer the requests it receives (once each,
	// within Expires) whatever Publish says: the node's answers to people, whose reply
	// subjects it cannot know in advance.
	Responses *ResponsePermission `json:"allow_responses,omitempty"`
}

// SubjectPermission lists the subjects allowed (and denied) to publish or subscribe to.
type SubjectPermission struct {
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// ResponsePermission is the server's allow_responses: Max answers to each request
// received, within Expires (a Go duration) of receiving it.
type ResponsePermission struct {
	Max     int    `json:"max"`
	Expires string `json:"expires"`
}

// NodeResponseExpiry is how long after a request reaches a node the node may still
// answer it (the server's allow_responses): longer than any API request is handled (two
// minutes) plus the time one waits for a free slot.
const NodeResponseExpiry = 10 * time.Minute

// InboxPrefix is the prefix of the subjects the answers to user's requests come to
// (nats.CustomInboxPrefix), and the only ones a person's permissions let them read:
// "_INBOX_" and the user name (for an nkey user, its public key), every character but
// letters, digits and '-' written as '_' and two hex digits, so that the prefix is one
// subject token and two users never share one ("ann" cannot read "ann.smith"'s). A
// connection without a user (anonymous, a token) keeps NATS's "_INBOX".
//
// Dial uses it for the user its credentials name; PermissionsOf gives each person
// subscribe rights on InboxPrefix(user)+".>" only. A connection made by the caller and
// given to New needs nats.CustomInboxPrefix(client.InboxPrefix(user)).
func InboxPrefix(user string) string {
	if user == "" {
		return "_INBOX"
	}
	var b strings.Builder
	b.WriteString("_INBOX_")
	for i := 0; i < len(user); i++ {
		c := user[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "_%02X", c)
	}
	return b.String()
}

// ErrUserNeeded is PermissionsOf's error for a person's role without a user: a person's
// block names their own inbox (InboxPrefix).
var ErrUserNeeded = errors.New("client: a person's permissions name their inbox: give the user name (or an nkey user's public key)")

// PermissionsOf is the NATS permissions of a user of role. A person (viewer, operator,
// admin) may publish to the subjects of the operations the role may call and subscribe
// to their own inbox (InboxPrefix(user)), nothing else: not the log, not a bucket, not
// the JetStream API, not another person's answers. A node may do what flowd does
// (nodePublish) and no more; it never calls the API (so it can never claim to be a
// person in the audit: docs/security.md), and it reads whatever it likes (user does not
// change a node's block).
func PermissionsOf(role, user string) (Permissions, error) {
	switch role {
	case RoleNode:
		return Permissions{
			Publish:   SubjectPermission{Allow: nodePublish()},
			Subscribe: SubjectPermission{Allow: []string{">"}},
			Responses: &ResponsePermission{Max: 1, Expires: NodeResponseExpiry.String()},
		}, nil
	case RoleViewer, RoleOperator, RoleAdmin:
		if user == "" {
			return Permissions{}, ErrUserNeeded
		}
		var subjects []string
		for _, op := range Operations() {
			if RoleAllows(role, op) {
				subjects = append(subjects, Subject+"."+op)
			}
		}
		return Permissions{Publish: SubjectPermission{Allow: subjects}, Subscribe: SubjectPermission{Allow: []string{InboxPrefix(user) + ".>"}}}, nil
	}
	return Permissions{}, fmt.Errorf("client: unknown role %q: use one of %s", role, strings.Join(Roles, ", "))
}

// flowStreams are flow's JetStream streams (the buckets' and the object store's
// included), named as the engine names them (engine's TestNodeRoleDoesAllAFlowdDoes
// fails if a node needs another).
var flowStreams = []string{"FLOW_LOG", "FLOW_TASKS", "FLOW_DLQ", "KV_FLOW_LEADER", "KV_FLOW_LEASES", "KV_FLOW_NODES", "KV_FLOW_CLUSTER", "OBJ_FLOW_SNAPSHOTS", "FLOW_STEPLOGS", "FLOW_EVENTS", "KV_FLOW_RATES"}

// FlowStreams are flow's JetStream streams, the buckets' and the object store's
// included (a copy).
func FlowStreams() []string { return slices.Clone(flowStreams) }

// NodePurges are the streams a node may purge: compaction's two, the log below a
// snapshot and the snapshots that one replaces (nats.go's object store deletes and
// renames by purging a subject), and the step logs (retention removes a retired run's). It may update none, and purge no bucket: a term raise
// (a purge of the leader bucket) goes through a node's admin path (engine
// raisingElector).
var NodePurges = []string{"FLOW_LOG", "OBJ_FLOW_SNAPSHOTS", "FLOW_STEPLOGS", "FLOW_EVENTS"}

// nodePublish is what flowd publishes to, read from what it does (a traced node that
// starts, leads, snapshots, compacts and joins from a snapshot): on each of flow's
// streams, creating it, its info, reading messages, and consumers (create, info, next,
// delete, acks, flow control); purging only the log (compaction), the leader bucket (a
// term raise) and the snapshots (an old one removed: nats.go's ObjectStore.Delete purges
// its chunks); the log, the tasks, the DLQ, the buckets and the object store; the node
// scatter of cluster status, the API's probe of itself, and the server's sync policy.
// Not: updating any stream or bucket (an update can seal it, and a sealed stream is never
// unsealed), deleting a stream or a message, anything of other streams, any API
// operation (flow.v1.<op>). A stream flowd finds differing from what it wants is
// reconfigured by an admin path only (docs/security.md, "Sealing and repair").
//
// The purges beyond the log's are a narrow exception: a purge can neither seal,
// reconfigure nor delete a stream, and what it can do to these (end the term held,
// remove a snapshot, remove step logs) a node can already do with the publishes it needs
// (a purge marker on the leader key, a rollup on a snapshot's subjects; step logs decide
// nothing and any node may write them).
func nodePublish() []string {
	out := []string{"$JS.API.INFO"}
	for _, s := range flowStreams {
		out = append(out,
			"$JS.API.STREAM.CREATE."+s, "$JS.API.STREAM.INFO."+s, "$JS.API.STREAM.MSG.GET."+s,
			"$JS.API.DIRECT.GET."+s, "$JS.API.DIRECT.GET."+s+".>",
			"$JS.API.CONSUMER.CREATE."+s, "$JS.API.CONSUMER.CREATE."+s+".>", "$JS.API.CONSUMER.INFO."+s+".*",
			"$JS.API.CONSUMER.MSG.NEXT."+s+".*", "$JS.API.CONSUMER.DELETE."+s+".*",
			"$JS.ACK."+s+".>", "$JS.FC."+s+".>")
	}
	for _, s := range NodePurges {
		out = append(out, "$JS.API.STREAM.PURGE."+s)
	}
	return append(out,
		"flow.log", "flow.tasks", "flow.dlq.>", "flow.steplogs.>",
		"$KV.FLOW_LEADER.>", "$KV.FLOW_LEASES.>", "$KV.FLOW_NODES.>", "$KV.FLOW_CLUSTER.>", "$KV.FLOW_RATES.>", "$O.FLOW_SNAPSHOTS.>",
		Subject+".node", "$SRV.PING.flow.*", "$SYS.REQ.SERVER.*.VARZ")
}
