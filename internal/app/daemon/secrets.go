package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"syscall"

	"github.com/spf13/viper"

	"github.com/flowrun/flow/steps"
)

// DefaultExecUser is the user exec steps of a flowd running as root run as when no
// --exec-user is given: never root, never flowd's own user. Without it in the user
// database (a minimal image), uid and gid 65534.
const DefaultExecUser = "nobody"

// loadExecUser reads --exec-user: a user that exists, is not flowd's own nor root, and
// that this process may switch to; or root, for a flowd that is root (the old
// behaviour, warned at every start). Without it, a flowd running as root runs its steps
// as DefaultExecUser: a root step reads flowd's environment, its files and the data dir.
func (c *Config) loadExecUser(name string, bad func(string, string, ...any)) {
	if name == "root" || name == "0" {
		if os.Geteuid() != 0 {
			bad("exec-user", "root: only a flowd running as root may run its steps as root (and none should: docs/security.md)")
			return
		}
		c.ExecAsRoot = true
		return
	}
	if name == "" {
		if os.Geteuid() != 0 {
			return // flowd's own user: it cannot switch (docs/security.md says what such a step reaches)
		}
		u, err := steps.LookupUser(DefaultExecUser)
		if err != nil {
			u = &steps.User{Name: "65534", UID: 65534, GID: 65534}
		}
		if err := u.CheckSwitch(); err != nil {
			bad("exec-user", "%v (flowd runs as root without --exec-user: its steps run as %s; give --exec-user USER)", err, u.Name)
			return
		}
		c.ExecUser, c.ExecUserDefault = u, true
		return
	}
	u, err := steps.LookupUser(name)
	if err != nil {
		bad("exec-user", "%v (give a user of this system, e.g. a dedicated flow-steps user)", err)
		return
	}
	if err := u.CheckSwitch(); err != nil {
		bad("exec-user", "%v", err)
		return
	}
	c.ExecUser = u
}

// secretFiles are the files flowd reads secrets from: the users file (passwords),
// credentials and keys for NATS, and the config file when it holds a password.
func (c *Config) secretFiles() []struct{ flag, path string } {
	files := []struct{ flag, path string }{{"auth", c.Auth}, {"nats-creds", c.NATSCreds}, {"nats-admin-creds", c.NATSAdminCreds}, {"nats-nkey", c.NATSNKey}, {"nats-tls-key", c.NATSTLSKey}}
	if c.ConfigFile != "" {
		v := viper.New()
		v.SetConfigFile(c.ConfigFile)
		v.SetConfigType("yaml")
		if v.ReadInConfig() == nil && v.IsSet("nats-password") {
			files = append(files, struct{ flag, path string }{"config", c.ConfigFile})
		}
	}
	return files
}

// checkSecretFiles refuses secret files that others than their owner may read or
// change: anyone on the machine (an exec step among them, under another user) could
// read the node's passwords, or add a user to the users file.
func (c *Config) checkSecretFiles(bad func(string, string, ...any)) {
	for _, f := range c.secretFiles() {
		if f.path == "" {
			continue
		}
		st, err := os.Stat(f.path)
		if err != nil || st.IsDir() {
			continue // reported by the option's own check
		}
		if perm := st.Mode().Perm(); perm&0o077 != 0 {
			bad(f.flag, "%s holds secrets and others than its owner may read or change it (mode %04o): chmod 600 %s", f.path, perm, f.path)
		}
	}
}

// checkExecUserReach refuses a set-up in which --exec-user could still read flowd's
// secrets: a data dir or secret file that user owns (its mode would not keep the user
// out). The data dir is 0700 by now (privateDataDir), the secret files 0600 (Load).
func checkExecUserReach(c *Config) error {
	if c.ExecUser == nil {
		return nil
	}
	paths := []struct{ flag, path string }{{"data-dir", c.DataDir}}
	paths = append(paths, c.secretFiles()...)
	for _, p := range paths {
		if p.path == "" {
			continue
		}
		st, err := os.Stat(p.path)
		if err != nil {
			continue
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid == c.ExecUser.UID {
			return fmt.Errorf("flowd: --%s %s belongs to the exec user %s, whose steps could read it: give it to flowd's user (chown %d %s)",
				p.flag, p.path, c.ExecUser.Name, os.Geteuid(), p.path)
		}
	}
	return nil
}

// stepsAtStart says at start how exec steps are contained and as whom they run
// (docs/operations.md), at warn level where the containment has known holes, and
// removes the working directories a flowd that died left behind.
func stepsAtStart(logger *slog.Logger, c *Config) {
	if n, err := steps.RemoveStaleWorkDirs(c.ExecUser); err != nil {
		logger.Warn("could not look for working directories of steps of a flowd that died", "err", err)
	} else if n > 0 {
		logger.Info("removed working directories of steps of a flowd that died", "count", n)
	}
	mode := steps.Containment()
	runAs := "flowd's own user"
	switch {
	case c.ExecAsRoot:
		runAs = "root"
	case c.ExecUser != nil:
		runAs = fmt.Sprintf("%s (uid %d)", c.ExecUser.Name, c.ExecUser.UID)
	}
	attrs := []any{"mode", string(mode), "run_as", runAs, "why", steps.ContainmentNote()}
	if c.ExecUserDefault {
		attrs = append(attrs, "run_as_why", "flowd runs as root and no --exec-user was given")
	}
	if c.ExecAsRoot {
		logger.Warn("exec steps run as root (--exec-user root): a step can read flowd's environment, the users file, credentials and the data dir, so become a node, and do anything root can; give --exec-user USER, or leave it out for " + DefaultExecUser)
	}
	switch {
	case mode == steps.ModeProcessGroup:
		logger.Warn("step containment: off; what a step starts outside its process group (setsid) outlives the step", attrs...)
	case mode == steps.ModeSubreaper && c.ExecUser == nil:
		logger.Warn("step containment: subreaper; a step running as flowd's user can kill its init and escape (use --exec-user, or allow PID namespaces)", attrs...)
	default:
		logger.Info("step containment", attrs...)
	}
}
