package clustertest

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// What an operator's workflow can reach of flowd's secrets (issue 24, part 2), with
// real flowd processes: flowd's environment through /proc, the users file (the node
// role's password: operator becomes node), the data dir.

// planted is a variable in flowd's environment that no step may read.
const planted = "FLOW_TEST_PLANTED=planted-secret-24"

// openDir makes a directory anyone may enter (0755), outside t.TempDir (whose parents
// are the test user's only), so that only the modes of what is in it keep a step out.
func openDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "flow-reach-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// reachScript writes a script into dir that reports what the step can reach: its uid,
// the file users, a listing of the directory data, and the environment of the process
// whose PID is its first argument.
func reachScript(t *testing.T, dir, users, data string) string {
	t.Helper()
	script := filepath.Join(dir, "reach.sh")
	body := fmt.Sprintf(`echo "uid $(id -u)"
cat %s 2>/dev/null || echo users-denied
ls %s 2>/dev/null || echo datadir-denied
tr '\0' '\n' < /proc/$1/environ 2>/dev/null || echo environ-denied
`, users, data)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}

// reach runs the reach script as a workflow on the flowd at url (as user, if any) with
// flowd's PID, and returns what it printed.
func reach(t *testing.T, url, user, script string, flowdPid int) string {
	t.Helper()
	cl, err := dialAs(t, url, user)
	if err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf("name: reach\nsteps:\n  - name: look\n    uses: exec\n    with: {command: [sh, %s, \"%d\"]}\n    retry: {max_attempts: 1}\n", script, flowdPid)
	if err := call(t, cl, "workflow.apply", client.Request{File: "reach.yaml", YAML: yaml}, nil); err != nil {
		t.Fatal(err)
	}
	var res map[string]string
	if err := call(t, cl, "run.start", client.Request{Workflow: "reach"}, &res); err != nil {
		t.Fatal(err)
	}
	var r client.Run
	WaitFor(t, 60*time.Second, "the reach run to end", func() bool {
		return call(t, cl, "run.get", client.Request{ID: res["id"]}, &r) == nil && r.Status != "pending" && r.Status != "running"
	})
	if r.Status != "succeeded" || len(r.Steps) != 1 {
		t.Fatalf("reach run: %+v", r)
	}
	var out struct{ Stdout string }
	if err := json.Unmarshal(r.Steps[0].Output, &out); err != nil {
		t.Fatalf("output %s: %v", r.Steps[0].Output, err)
	}
	return out.Stdout
}

// startFlowdProc starts flowd from bin with args, as attr says, in dir, with planted in
// its environment, and waits until it is ready (or has exited: then it returns at once).
func startFlowdProc(t *testing.T, name, bin, dir string, attr *syscall.SysProcAttr, args ...string) *Proc {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	p := &Proc{Name: name, log: logf, args: append([]string{bin, "--node-id", name, "--http", "off", "--log-format", "json"}, args...),
		env: []string{planted}, attr: attr, dir: dir}
	p.start(t)
	t.Cleanup(p.Kill)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s:\n%s", name, tail(LogOf(p)))
		}
	})
	WaitFor(t, 60*time.Second, name+" ready", func() bool { return strings.Contains(LogOf(p), "flowd ready") || !p.Alive() })
	return p
}

// A flowd running as a plain user (65534 here): its steps run as the same user, and
// the kernel would let them read flowd's /proc/PID/environ; flowd is not dumpable, so
// they may not. The test flowd is linked to skip the namespaces (steps.containment=
// subreaper), because a step in a user namespace may not read it either way; the
// control is linked with keepDumpable=1 too: its step reads the planted variable. (As
// root, CAP_SYS_PTRACE reads a non-dumpable process's environment anyway: hence a plain
// user here, and TestExecUserKeepsStepsFromFlowdsFiles for root.) The normal build as a
// plain user contains its steps in a user and a PID namespace, where the environment is
// out of reach too, and refuses --exec-user: it may not switch users.
func TestStepsCannotReadFlowdsEnvironment(t *testing.T) {
	if testing.Short() {
		t.Skip("starts flowd processes")
	}
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	if os.Geteuid() != 0 {
		t.Skip("needs root, to start flowd as another user (65534) on a data dir it owns")
	}
	const subreaper = "github.com/flowrun/flow/steps.containment=subreaper"
	for _, v := range []struct {
		name, mode string
		bin        func() string
		control    bool
	}{
		{"not-dumpable", "subreaper", func() string { return FlowdLinkedWith(t, subreaper) }, false},
		{"control-dumpable", "subreaper", func() string {
			return FlowdLinkedWith(t, subreaper, "github.com/flowrun/flow/internal/app/daemon.keepDumpable=1")
		}, true},
		{"default-build", "user-pid-namespace", func() string { return filepath.Join(Binaries(t), "flowd") }, false},
	} {
		t.Run(v.name, func(t *testing.T) {
			base := openDir(t)
			own := filepath.Join(base, "flowd") // where user 65534 may run it from
			if err := copyFile(v.bin(), own); err != nil {
				t.Fatal(err)
			}
			data := filepath.Join(base, "data")
			if err := os.Mkdir(data, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(data, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			asNobody := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			port := freePorts(t, 1)[0]
			url := fmt.Sprintf("nats://127.0.0.1:%d", port)
			node := startFlowdProc(t, "node-a", own, base, asNobody, "--data-dir", data, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", port))
			if !node.Alive() {
				t.Fatal("flowd as user 65534 exited at start")
			}
			if mode := containmentOf(LogOf(node)); mode != v.mode {
				t.Fatalf("flowd as a plain user logs containment %q; want %s (FACTS.md: unprivileged user namespaces are allowed here)", mode, v.mode)
			}
			out := reach(t, url, "", reachScript(t, base, filepath.Join(base, "none"), data), node.current().Process.Pid)
			if !strings.Contains(out, "uid 65534") {
				t.Fatalf("the step ran as %q; want flowd's user 65534", out)
			}
			if v.control {
				if !strings.Contains(out, "planted-secret-24") {
					t.Fatalf("control: the step did not read a dumpable flowd's environment:\n%s", out)
				}
				return
			}
			if strings.Contains(out, "planted-secret-24") || !strings.Contains(out, "environ-denied") {
				t.Fatalf("the step read flowd's environment:\n%s", out)
			}
			if v.mode != "user-pid-namespace" {
				return
			}
			// --exec-user needs a flowd that may switch users: this one may not.
			other := startFlowdProc(t, "node-x", own, base, asNobody, "--data-dir", data, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0]),
				"--exec-user", "daemon")
			WaitFor(t, 10*time.Second, "flowd with --exec-user as a plain user to exit", func() bool { return !other.Alive() })
			if code, log := other.ExitCode(), LogOf(other); code != 2 || !strings.Contains(log, "may not change a command's user") {
				t.Fatalf("flowd --exec-user as a plain user: exit %d:\n%s", code, log)
			}
		})
	}
}

// stepsAsTestUser are the flags that make a flowd run its exec steps as the test's own
// user, for tests whose steps read or write the test's files (t.TempDir: 0700): as
// root, --exec-user root (the one way back since issue 36; flowd warns); as a plain
// user, nothing (its steps are its own user's).
func stepsAsTestUser() []string {
	if os.Geteuid() == 0 {
		return []string{"--exec-user", "root"}
	}
	return nil
}

// What a step of an operator's workflow reaches of a flowd running as root: with
// --exec-user, and without it (issue 36: then its steps run as nobody, never as root),
// it cannot read the users file (the node role's password: operator would become
// node), list the data dir, or read flowd's environment (a variable planted in it),
// although each sits in a directory anyone may enter. The control is the same flowd
// with --exec-user root (the one way back, warned at start): its step, root, reads all
// three (CAP_SYS_PTRACE reads a non-dumpable process's environment), which is what
// every root flowd's steps did before.
func TestExecUserKeepsStepsFromFlowdsFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("starts flowd processes")
	}
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	if os.Geteuid() != 0 {
		t.Skip("needs root: --exec-user needs a flowd that may switch users")
	}
	for _, v := range []struct {
		name    string
		args    []string
		runAs   string // the start-up log's run_as
		control bool
	}{
		{"exec-user", []string{"--exec-user", "nobody"}, `"run_as":"nobody (uid 65534)"`, false},
		{"default", nil, `"run_as_why":"flowd runs as root and no --exec-user was given"`, false},
		{"control-exec-user-root", []string{"--exec-user", "root"}, `"run_as":"root"`, true},
	} {
		t.Run(v.name, func(t *testing.T) {
			base := openDir(t)
			users := filepath.Join(base, "users.yaml")
			if err := os.WriteFile(users, []byte(authUsers), 0o600); err != nil {
				t.Fatal(err)
			}
			data := filepath.Join(base, "data")
			port := freePorts(t, 1)[0]
			url := fmt.Sprintf("nats://127.0.0.1:%d", port)
			args := append([]string{"--data-dir", data, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", port), "--auth", users}, v.args...)
			node := startFlowdProc(t, "node-a", filepath.Join(Binaries(t), "flowd"), "", nil, args...)
			if !node.Alive() {
				t.Fatal("flowd exited at start")
			}
			if !strings.Contains(LogOf(node), v.runAs) {
				t.Fatalf("flowd's start-up log does not say steps run as %s:\n%s", v.runAs, tail(LogOf(node)))
			}
			out := reach(t, url, "otto", reachScript(t, base, users, data), node.current().Process.Pid)
			if v.control {
				for _, want := range []string{"uid 0", "node-pw-7", "\nnats\n", "\nstate\n", "planted-secret-24"} {
					if !strings.Contains(out, want) {
						t.Fatalf("control: the root step did not reach %q:\n%s", want, out)
					}
				}
				if !strings.Contains(LogOf(node), `"level":"WARN","msg":"exec steps run as root`) {
					t.Fatalf("--exec-user root without a warning at start:\n%s", tail(LogOf(node)))
				}
				return
			}
			for _, want := range []string{"uid 65534", "users-denied", "datadir-denied", "environ-denied"} {
				if !strings.Contains(out, want) {
					t.Fatalf("the step as nobody: no %q:\n%s", want, out)
				}
			}
			for _, secret := range []string{"node-pw-7", "operator-pw-7", "\nnats\n", "\nstate\n", "planted-secret-24"} {
				if strings.Contains(out, secret) {
					t.Fatalf("the step as nobody reached %q:\n%s", secret, out)
				}
			}
		})
	}
}

// copyFile copies an executable to a place another user may run it from.
func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(to, 0o755)
}
