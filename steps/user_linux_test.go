package steps

import (
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
	script := `id -u; echo "$HOME"; stat -c %u .; cat ` + secret + ` 2>/dev/null || echo denied`
	for _, m := range modes(t) {
		t.Run(string(m), func(t *testing.T) {
			got := strings.Split(stdoutOf(t, Exec{MaxOutput: 1 << 20, User: nobody, mode: m}, map[string]any{"command": list("sh", "-c", script)}), "\n")
			uid := strconv.Itoa(int(nobody.UID))
			if len(got) != 4 || got[0] != uid || got[1] != nobody.Home || got[2] != uid || got[3] != "denied" {
				t.Fatalf("as %s: %q; want uid %s, HOME %s, its own working directory, and the file denied", nobody.Name, got, uid, nobody.Home)
			}
			control := stdoutOf(t, Exec{MaxOutput: 1 << 20, mode: m}, map[string]any{"command": list("sh", "-c", script)})
			if !strings.Contains(control, "pw-secret-1") {
				t.Fatalf("control, as root: %q; want the file read", control)
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
