package steps

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// With a User (flowd --exec-user), the command runs as that user, with the user's HOME,
// in a working directory the user owns, and cannot read a file only flowd's user may
// (the users file, a credential file: 0600). The control runs the same step as this
// process's user (root): it reads the file. The file sits in a directory anyone may
// enter, so its own mode is what keeps the step out.
func TestExecUserCannotReadFlowdsFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: only root (or CAP_SETUID) may run a command as another user")
	}
	nobody, err := LookupUser("nobody")
	if err != nil {
		t.Skip("no user nobody here:", err)
	}
	open, err := os.MkdirTemp("", "flow-exec-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(open) })
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(open, "users.yaml")
	if err := os.WriteFile(secret, []byte("users: [{user: ann, password: pw-secret-1, role: admin}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// And in a PID namespace, a /proc of its own: this process (flowd) is not in it.
	script := `id -u; echo "$HOME"; stat -c %u .; cat ` + secret + ` 2>/dev/null || echo denied; test -e /proc/` + strconv.Itoa(os.Getpid()) + ` && echo sees-flowd || echo hidden`
	for _, m := range modes(t) {
		t.Run(string(m), func(t *testing.T) {
			got := strings.Split(stdoutOf(t, Exec{MaxOutput: 1 << 20, User: nobody, mode: m}, map[string]any{"command": list("sh", "-c", script)}), "\n")
			uid := strconv.Itoa(int(nobody.UID))
			proc := "sees-flowd"
			if m == ModePIDNamespace && privateProc.err == nil {
				proc = "hidden"
			}
			if len(got) != 5 || got[0] != uid || got[1] != nobody.Home || got[2] != uid || got[3] != "denied" || got[4] != proc {
				t.Fatalf("as %s: %q; want uid %s, HOME %s, its own working directory, the file denied, and %s", nobody.Name, got, uid, nobody.Home, proc)
			}
			control := stdoutOf(t, Exec{MaxOutput: 1 << 20, mode: m}, map[string]any{"command": list("sh", "-c", script)})
			if !strings.Contains(control, "pw-secret-1") || !strings.Contains(control, "sees-flowd") {
				t.Fatalf("control, as root: %q; want the file read and this process seen", control)
			}
		})
	}
}

// Running commands as another user needs a user that exists, is not this process's
// own (the step could read everything flowd can) and is not root.
func TestExecUserChecks(t *testing.T) {
	if _, err := LookupUser("no-such-user-flow"); err == nil {
		t.Fatal("an unknown user was found")
	}
	me, err := LookupUser(strconv.Itoa(os.Geteuid()))
	if err != nil {
		t.Skip("this process's user is not in the user database:", err)
	}
	if err := me.CheckSwitch(); err == nil || !strings.Contains(err.Error(), "own user") {
		t.Fatalf("CheckSwitch of this process's own user: %v", err)
	}
	if root, err := LookupUser("root"); err == nil && os.Geteuid() != 0 {
		if err := root.CheckSwitch(); err == nil {
			t.Fatal("root accepted as the exec user")
		}
	}
}

// A step running as another user gets a working directory and a TMPDIR it may write,
// also when flowd's own TMPDIR is private to flowd (inside its 0700 data dir, as in the
// image before issue 36): then both are a fresh directory in /tmp. The control is the
// step's `dir` given as that private directory: the user may not write there.
func TestExecUserGetsAWritableTmpdir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: only root (or CAP_SETUID) may run a command as another user")
	}
	nobody, err := LookupUser("nobody")
	if err != nil {
		t.Skip("no user nobody here:", err)
	}
	private := t.TempDir() // 0700, root's
	t.Setenv("TMPDIR", private)
	script := `echo x > "$TMPDIR/f" && echo tmp-ok; echo y > ./g && echo dir-ok; echo "$TMPDIR" "$(pwd)"`
	got := strings.Split(stdoutOf(t, Exec{MaxOutput: 1 << 20, User: nobody}, map[string]any{"command": list("sh", "-c", script)}), "\n")
	if len(got) != 3 || got[0] != "tmp-ok" || got[1] != "dir-ok" {
		t.Fatalf("as %s with flowd's TMPDIR private: %q; want TMPDIR and the working directory writable", nobody.Name, got)
	}
	if f := strings.Fields(got[2]); len(f) != 2 || f[0] != f[1] || !strings.HasPrefix(f[0], "/tmp/"+workDirPrefix) {
		t.Fatalf("TMPDIR and working directory %q; want the same fresh directory in /tmp", got[2])
	}
	_, err = Exec{MaxOutput: 1 << 20, User: nobody}.Run(context.Background(), in(map[string]any{"command": list("sh", "-c", "echo y > ./g"), "dir": private}))
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("control, dir %s (root's, 0700): %v; want it refused", private, err)
	}
}
