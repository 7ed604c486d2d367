package client

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// The roles of flow's users (CONTRACT.md, "Security"), each allowed everything the one
// before it is. A role is enforced by the NATS server as subject permissions (every
// operation has its own subject, Subject.<op>): flowd checks no role itself.
const (
	RoleViewer   = "viewer"   // every read
	RoleOperator = "operator" // workflow apply, run start/retry/cancel, dlq retry, cluster snapshot
	RoleAdmin    = "admin"    // dlq purge, drill zombie
	RoleNode     = "node"     // a flowd process: the log, the buckets, the streams, everything
)

// Roles are the roles, the least first.
var Roles = []string{RoleViewer, RoleOperator, RoleAdmin, RoleNode}

// opRoles is the least role each API operation needs.
var opRoles = map[string]string{
	"workflow.list": RoleViewer, "workflow.show": RoleViewer, "workflow.validate": RoleViewer,
	"run.get": RoleViewer, "run.list": RoleViewer, "run.wait": RoleViewer, "run.history": RoleViewer, "run.verify": RoleViewer,
	"dlq.list": RoleViewer, "dlq.show": RoleViewer, "cron.list": RoleViewer, "cluster.status": RoleViewer,

	"workflow.apply": RoleOperator, "run.start": RoleOperator, "run.retry": RoleOperator, "run.cancel": RoleOperator,
	"dlq.retry": RoleOperator, "cluster.snapshot": RoleOperator,

	"dlq.purge": RoleAdmin, "drill.zombie": RoleAdmin,
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
}

// SubjectPermission lists the subjects allowed (and denied) to publish or subscribe to.
type SubjectPermission struct {
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// PermissionsOf is the NATS permissions of role: for a user (viewer, operator, admin),
// publishing to the subjects of the operations the role may call, and subscribing to
// the inboxes that answers come to; nothing else (not the log, not a bucket, not the
// JetStream API). A node may do everything.
func PermissionsOf(role string) (Permissions, error) {
	switch role {
	case RoleNode:
		return Permissions{Publish: SubjectPermission{Allow: []string{">"}}, Subscribe: SubjectPermission{Allow: []string{">"}}}, nil
	case RoleViewer, RoleOperator, RoleAdmin:
		var subjects []string
		for _, op := range Operations() {
			if RoleAllows(role, op) {
				subjects = append(subjects, Subject+"."+op)
			}
		}
		return Permissions{Publish: SubjectPermission{Allow: subjects}, Subscribe: SubjectPermission{Allow: []string{"_INBOX.>"}}}, nil
	}
	return Permissions{}, fmt.Errorf("client: unknown role %q: use one of %s", role, strings.Join(Roles, ", "))
}
