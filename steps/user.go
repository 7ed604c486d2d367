package steps

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// User is a user exec commands run as instead of this process's own (flowd
// --exec-user), so that a step cannot read what flowd's user can: the data dir, the
// users file, credential files (docs/security.md).
type User struct {
	Name   string   `json:"name"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"` // supplementary groups
	Home   string   `json:"home,omitempty"`   // the command's HOME
}

// LookupUser finds a user by name, or by number, in the system's user database, with
// its primary and supplementary groups.
func LookupUser(name string) (*User, error) {
	var u *user.User
	var err error
	if _, nerr := strconv.ParseUint(name, 10, 32); nerr == nil {
		u, err = user.LookupId(name)
	} else {
		u, err = user.Lookup(name)
	}
	if err != nil {
		return nil, fmt.Errorf("steps: user %q: %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("steps: user %q has ids %s:%s, not numbers", name, u.Uid, u.Gid)
	}
	out := &User{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil && uint32(n) != out.GID {
				out.Groups = append(out.Groups, uint32(n))
			}
		}
	}
	return out, nil
}

// CheckSwitch reports why this process cannot run commands as u, or nil if it can: it
// must be allowed to change user (root, or CAP_SETUID and CAP_SETGID), and u must be
// another user than its own (or steps could read everything flowd can).
func (u *User) CheckSwitch() error {
	if int(u.UID) == os.Geteuid() {
		return fmt.Errorf("steps: user %s (uid %d) is this process's own user: give another user, one that cannot read flowd's files", u.Name, u.UID)
	}
	if u.UID == 0 {
		return fmt.Errorf("steps: user %s is root: give an unprivileged user", u.Name)
	}
	return canSwitchUser()
}

// credential is u as the kernel takes it (nil: this process's own user).
func (u *User) credential() *syscall.Credential {
	if u == nil {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
}
