package natsnode

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/flowrun/flow/client"
)

// User is one user of the embedded server (flowd --auth): a name and a password (plain
// or bcrypt, "$2a$..."), or an nkey's public key, and a role (client.Roles).
type User struct {
	Name     string
	Password string
	NKey     string
	Role     string
}

// UsersAccount is the account of the people's roles (viewer, operator, admin) in the
// embedded server with auth. flow's own account (the server's global one, where the
// streams and buckets are and the nodes connect) exports the API's subjects to it with
// the requester's identity shared, so that every API request carries the
// Nats-Request-Info header the server writes, naming the user (the audit in the log). A
// user of UsersAccount can reach nothing else of flow's account: no stream, no bucket,
// no JetStream API, whatever its permissions say.
const UsersAccount = "FLOW_USERS"

// apiExport is the subject space exported to UsersAccount.
const apiExport = client.Subject + ".>"

// apiResponseThreshold is how long a service answer may take across the import (the
// server's default is two minutes; run.wait waits as long as its caller lets it).
const apiResponseThreshold = 24 * time.Hour

// authOptions sets the users, their permissions and accounts, and this process's own
// user, whose password is made here, lives only in memory and is never logged.
func (cfg Config) authOptions(opts *server.Options) (internalUser, internalPassword string, err error) {
	users := server.NewAccount(UsersAccount)
	opts.Accounts = []*server.Account{users}
	seen := map[string]bool{}
	inboxes := map[string]int{} // a person's inbox prefix: the user's number
	for i, u := range cfg.Users {
		name := u.Name
		if name == "" {
			name = u.NKey // the server names an nkey user by its public key
		}
		perms, err := permissionsOf(u.Role, name)
		if err != nil {
			return "", "", fmt.Errorf("%w: user %d (%s): %v", ErrInvalidConfig, i+1, u.label(), err)
		}
		if u.Role != client.RoleNode {
			prefix := client.InboxPrefix(name)
			if j, ok := inboxes[prefix]; ok {
				return "", "", fmt.Errorf("%w: user %d (%s) would read the answers of user %d: both have the inbox %s; rename one", ErrInvalidConfig, i+1, u.label(), j, prefix)
			}
			inboxes[prefix] = i + 1
		}
		p, err := ServerPermissions(perms)
		if err != nil {
			return "", "", fmt.Errorf("%w: user %d (%s): %v", ErrInvalidConfig, i+1, u.label(), err)
		}
		var acc *server.Account // a node's user is in flow's account
		if u.Role != client.RoleNode {
			acc = users
		}
		switch {
		case u.NKey != "" && u.Name == "" && u.Password == "":
			if !nkeys.IsValidPublicUserKey(u.NKey) {
				return "", "", fmt.Errorf("%w: user %d: nkey %q is not a user's public key (it starts with U; make one with `nk -gen user -pubout`)", ErrInvalidConfig, i+1, u.NKey)
			}
			if seen["nkey:"+u.NKey] {
				return "", "", fmt.Errorf("%w: user %d: nkey %s is listed twice", ErrInvalidConfig, i+1, u.NKey)
			}
			seen["nkey:"+u.NKey] = true
			opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: u.NKey, Permissions: p, Account: acc})
		case u.NKey == "" && u.Name != "" && u.Password != "":
			if seen["user:"+u.Name] {
				return "", "", fmt.Errorf("%w: user %d: %s is listed twice", ErrInvalidConfig, i+1, u.Name)
			}
			seen["user:"+u.Name] = true
			opts.Users = append(opts.Users, &server.User{Username: u.Name, Password: u.Password, Permissions: p, Account: acc})
		default:
			return "", "", fmt.Errorf("%w: user %d (%s): give either user and password, or nkey (and a role)", ErrInvalidConfig, i+1, u.label())
		}
	}
	var secret [24]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return "", "", fmt.Errorf("natsnode: make this process's own password: %w", err)
	}
	internalUser = "flowd-internal-" + hex.EncodeToString(secret[:4])
	internalPassword = hex.EncodeToString(secret[4:])
	opts.Users = append(opts.Users, &server.User{Username: internalUser, Password: internalPassword})
	return internalUser, internalPassword, nil
}

// ServerPermissions is p as the server's options take it.
func ServerPermissions(p client.Permissions) (*server.Permissions, error) {
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
		Subscribe: &server.SubjectPermission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
	}
	if p.Responses != nil {
		expires, err := time.ParseDuration(p.Responses.Expires)
		if err != nil {
			return nil, fmt.Errorf("allow_responses: expires %q: %v", p.Responses.Expires, err)
		}
		sp.Response = &server.ResponsePermission{MaxMsgs: p.Responses.Max, Expires: expires}
	}
	return sp, nil
}

// oldInboxes and oldNodeRole, set at link time (-ldflags "-X
// .../natsnode.oldInboxes=1") and empty in every build of flowd, each give back one part
// of the permissions from before per-user inboxes and the narrowed node role, so that
// each guard has a control of its own: oldInboxes lets people subscribe to every
// "_INBOX.>" (a viewer reads an operator's answers); oldNodeRole lets a node publish and
// subscribe to anything (">"), the API included (a node's forged request names a person
// in the history; it deletes flow's streams). Only the negative controls of
// docs/testing.md set them.
var oldInboxes, oldNodeRole string

// oldNodeUpdates, set at link time (-ldflags "-X .../natsnode.oldNodeUpdates=1") and
// empty in every build of flowd, gives the node role back only the update and purge
// rights it had before updates moved to an admin path (STREAM.UPDATE of the tasks
// stream and three buckets, STREAM.PURGE of the leader bucket and the snapshots), nothing
// else of the old set: the negative control of the tests that a node cannot seal flow's
// streams.
var oldNodeUpdates string

// revokedNodeUpdates are those rights.
var revokedNodeUpdates = []string{
	"$JS.API.STREAM.UPDATE.FLOW_TASKS", "$JS.API.STREAM.UPDATE.KV_FLOW_LEADER", "$JS.API.STREAM.UPDATE.KV_FLOW_LEASES",
	"$JS.API.STREAM.UPDATE.KV_FLOW_NODES", "$JS.API.STREAM.PURGE.KV_FLOW_LEADER", "$JS.API.STREAM.PURGE.OBJ_FLOW_SNAPSHOTS",
}

// permissionsOf is client.PermissionsOf, or the old permissions of oldInboxes,
// oldNodeRole or oldNodeUpdates.
func permissionsOf(role, user string) (client.Permissions, error) {
	if role == client.RoleNode && oldNodeRole != "" {
		return client.Permissions{Publish: client.SubjectPermission{Allow: []string{">"}}, Subscribe: client.SubjectPermission{Allow: []string{">"}}}, nil
	}
	if role != client.RoleNode && oldInboxes != "" {
		p, err := client.PermissionsOf(role, "old")
		p.Subscribe.Allow = []string{"_INBOX.>"}
		return p, err
	}
	p, err := client.PermissionsOf(role, user)
	if err == nil && role == client.RoleNode && oldNodeUpdates != "" {
		for _, s := range revokedNodeUpdates {
			if !slices.Contains(p.Publish.Allow, s) {
				p.Publish.Allow = append(p.Publish.Allow, s)
			}
		}
	}
	return p, err
}

// label names a user in errors, never with its password.
func (u User) label() string {
	switch {
	case u.Name != "":
		return "user " + u.Name
	case u.NKey != "":
		return "nkey " + u.NKey
	}
	return "no name"
}

// linkAccounts exports the API from flow's account to UsersAccount, sharing the
// requester's identity, once the server has made the accounts.
func linkAccounts(srv *server.Server) error {
	flow := srv.GlobalAccount()
	users, err := srv.LookupAccount(UsersAccount)
	if err != nil {
		return fmt.Errorf("natsnode: account %s: %w", UsersAccount, err)
	}
	if err := flow.AddServiceExport(apiExport, []*server.Account{users}); err != nil {
		return fmt.Errorf("natsnode: export the API: %w", err)
	}
	if err := flow.SetServiceExportResponseThreshold(apiExport, apiResponseThreshold); err != nil {
		return fmt.Errorf("natsnode: export the API: %w", err)
	}
	if err := users.AddServiceImport(flow, apiExport, apiExport); err != nil {
		return fmt.Errorf("natsnode: import the API: %w", err)
	}
	if err := users.SetServiceImportSharing(flow, apiExport, true); err != nil {
		return fmt.Errorf("natsnode: share the requester's identity: %w", err)
	}
	return nil
}

// IsLoopback says whether a listen address (HOST:PORT) is on loopback only.
func IsLoopback(listen string) bool {
	host, _, err := splitHostPort(listen)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
