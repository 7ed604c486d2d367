package clustertest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// flowdBuildFlags are go build's flags for flowd: -race when the test binary has the
// race detector (go test -race), so that the real processes are checked as the
// in-process tests are; each flowd's log is then searched for the detector's reports
// (Proc.start).
func flowdBuildFlags() []string {
	if raceBuild {
		return []string{"-race"}
	}
	return nil
}

// Binaries builds nats-server and flowd once per test process and returns their dir.
// flowd is built with the race detector when the test binary has it; nats-server, not
// ours, never is.
func Binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "flow-clustertest-bin")
		if buildErr != nil {
			return
		}
		for _, pkg := range []string{"github.com/nats-io/nats-server/v2", "github.com/flowrun/flow/cmd/flowd"} {
			args := []string{"build", "-o", binDir + "/"}
			if strings.HasSuffix(pkg, "/flowd") {
				args = append(args, flowdBuildFlags()...)
			}
			out, err := exec.Command("go", append(args, pkg)...).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

var (
	linkedMu   sync.Mutex
	linkedBins = map[string]string{} // by -X setting
	linkedDirs []string
)

// RemoveBuilds removes the directories Binaries and FlowdLinkedWith built into. A
// package's TestMain calls it after m.Run: the binaries live as long as the test process.
func RemoveBuilds() {
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	linkedMu.Lock()
	defer linkedMu.Unlock()
	for _, d := range linkedDirs {
		_ = os.RemoveAll(d)
	}
	linkedDirs = nil
}

// FlowdLinkedWith builds flowd with package variables set at link time (-ldflags
// "-X setting", one -X for each of more too), once per test process, and returns the
// binary's path: the negative controls switch a guard off this way, so that only the
// link differs from Binaries' (with the race detector when Binaries' flowd has it).
func FlowdLinkedWith(t testing.TB, setting string, more ...string) string {
	t.Helper()
	linkedMu.Lock()
	defer linkedMu.Unlock()
	for _, m := range more {
		setting += " -X " + m
	}
	if bin, ok := linkedBins[setting]; ok {
		return bin
	}
	dir, err := os.MkdirTemp("", "flow-clustertest-linked")
	if err != nil {
		t.Fatal(err)
	}
	linkedDirs = append(linkedDirs, dir)
	bin := filepath.Join(dir, "flowd")
	args := append(append([]string{"build", "-o", bin}, flowdBuildFlags()...), "-ldflags", "-X "+setting, "github.com/flowrun/flow/cmd/flowd")
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("build flowd with %s: %v\n%s", setting, err, out)
	}
	linkedBins[setting] = bin
	return bin
}

// Proc is a child process the test controls.
type Proc struct {
	Name string
	args []string
	env  []string             // added to the test's environment
	attr *syscall.SysProcAttr // how it starts (e.g. as another user); nil: as the test
	dir  string               // its working directory; "": the test's
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when the process has exited for good

	mu      sync.Mutex
	exit    int  // the last exit code (-1 while running or killed by a signal)
	killed  bool // Kill was called: the exit is the test's, not a failed start
	started bool // started once: its log is checked for race reports at the test's end
	// noRetry: a start that meets a port in use is not made again with the same
	// arguments (the caller picks other ports instead: StartNATS).
	noRetry bool
}

// conflictRetries is how many times a start that failed on a port in use is made again
// with the same arguments, conflictBackoff apart (times the attempt): a port another
// process held for a moment (a probe like freePorts', a short-lived connection) is free
// again by then. A port held for good is reported by the test that waits for the process.
const (
	conflictRetries = 5
	conflictBackoff = 200 * time.Millisecond
)

func (p *Proc) start(t testing.TB) {
	p.mu.Lock()
	p.killed = false
	first := !p.started
	p.started = true
	p.mu.Unlock()
	if first {
		// Registered before the caller's Kill, so it runs after it (cleanups run last
		// first): the log is whole by then, and its directory not yet removed.
		t.Cleanup(func() {
			if r := RaceReports(LogOf(p)); r != "" {
				t.Errorf("%s: the race detector reported (flowd is built with -race under go test -race):\n%s", p.Name, r)
			}
		})
	}
	cmd, from, err := p.spawn()
	if err != nil {
		t.Fatal(err)
	}
	p.done = make(chan struct{})
	go p.wait(cmd, from, p.done)
}

// spawn starts the process once and returns it with the offset of its log at the start.
func (p *Proc) spawn() (*exec.Cmd, int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killed {
		return nil, 0, fmt.Errorf("%s: killed", p.Name)
	}
	var from int64
	if st, err := p.log.Stat(); err == nil {
		from = st.Size()
	}
	cmd := exec.Command(p.args[0], p.args[1:]...)
	if p.env != nil {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr, cmd.Dir = p.attr, p.dir
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	p.cmd = cmd
	return cmd, from, nil
}

// wait reaps the process; one that exited because a port it needs was in use is
// started again (same arguments) up to conflictRetries times.
func (p *Proc) wait(cmd *exec.Cmd, from int64, done chan struct{}) {
	defer close(done)
	for attempt := 1; ; attempt++ {
		_ = cmd.Wait()
		p.mu.Lock()
		p.exit = cmd.ProcessState.ExitCode()
		retry := !p.killed && !p.noRetry && attempt <= conflictRetries
		p.mu.Unlock()
		if !retry || !portConflict(p.log.Name(), from) {
			return
		}
		fmt.Fprintf(p.log, "clustertest: %s exited on a port in use; starting it again (attempt %d)\n", p.Name, attempt+1)
		time.Sleep(time.Duration(attempt) * conflictBackoff) // a retry's pause, not a synchronisation
		var err error
		if cmd, from, err = p.spawn(); err != nil {
			return
		}
	}
}

// portConflict reports whether the process's log since offset from says that a port it
// wanted to listen on was in use (nats-server, and flowd for its embedded NATS and HTTP).
func portConflict(log string, from int64) bool {
	b, err := os.ReadFile(log)
	if err != nil || int64(len(b)) < from {
		return false
	}
	return strings.Contains(string(b[from:]), "address already in use")
}

func (p *Proc) current() *exec.Cmd {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd
}

// killWait is how long Kill waits for the killed process to be reaped.
const killWait = 30 * time.Second

// Kill SIGKILLs the process and waits for it (killWait at most: a process that outlives
// its SIGKILL that long ends the test binary with a panic that names it, instead of
// hanging it; Kill is often a Cleanup, which has no test to fail).
func (p *Proc) Kill() {
	p.mu.Lock()
	p.killed = true
	cmd := p.cmd
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(killWait):
		panic(fmt.Sprintf("clustertest: %s (pid %d) was not reaped within %s of its SIGKILL", p.Name, cmd.Process.Pid, killWait))
	}
}

// Stop and Cont pause and resume it.
func (p *Proc) Stop() { _ = p.current().Process.Signal(syscall.SIGSTOP) }

// Cont resumes a stopped process.
func (p *Proc) Cont() { _ = p.current().Process.Signal(syscall.SIGCONT) }

// Restart starts it again with the same arguments (after Kill).
func (p *Proc) Restart(t testing.TB) { p.start(t) }

// ExitCode is the exit code of the process once it has exited (-1 if a signal ended
// it); Alive tells whether it has.
func (p *Proc) ExitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// Alive reports whether it is running.
func (p *Proc) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Ports for child processes come from below the kernel's ephemeral range
// (ip_local_port_range, 32768-60999 by default), which bind(":0") and outgoing
// connections never take: only a process naming the same number can take one between
// freePorts and the child's bind, and the child's start is retried when one did
// (Proc.wait, StartNATS). A child cannot be handed a listener (nats-server and flowd take
// addresses); what runs in the test process listens on ":0" itself (Proxy).
const portLo, portHi = 20000, 32768

var handed struct {
	sync.Mutex
	ports map[int]bool // never handed out twice by one test process
}

func freePorts(t testing.TB, n int) []int {
	handed.Lock()
	defer handed.Unlock()
	if handed.ports == nil {
		handed.ports = map[int]bool{}
	}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 10000 {
			t.Fatalf("no free port in %d-%d", portLo, portHi-1)
		}
		port := portLo + rand.IntN(portHi-portLo)
		if handed.ports[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // in use
		}
		l.Close()
		handed.ports[port] = true
		ports = append(ports, port)
	}
	return ports
}

// Cluster is n nats-server processes in one JetStream cluster on loopback.
type Cluster struct {
	Servers []*Proc
	URLs    []string
}

// URL is every server's client URL, comma-separated.
func (c *Cluster) URL() string { return strings.Join(c.URLs, ",") }

// StartNATS starts an n-server JetStream cluster (file storage, synced writes). A server
// that cannot listen on a port (another process took it after freePorts) fails the
// attempt: the cluster is started again on other ports.
func StartNATS(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartNATSWith(t, n, "")
}

// StartNATSWith is StartNATS with more of each server's configuration (accounts, TLS).
func StartNATSWith(t testing.TB, n int, extraConf string) *Cluster {
	t.Helper()
	for attempt := 1; ; attempt++ {
		c, conflict := startNATSOnce(t, n, extraConf)
		if !conflict {
			return c
		}
		if attempt == 5 {
			t.Fatalf("a NATS cluster of %d could not listen on its ports in %d attempts", n, attempt)
		}
	}
}

func startNATSOnce(t testing.TB, n int, extraConf string) (c *Cluster, conflict bool) {
	bin := Binaries(t)
	dir := t.TempDir()
	ports := freePorts(t, 2*n)
	var routes []string
	for i := 0; i < n; i++ {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i]))
	}
	c = &Cluster{}
	for i := 0; i < n; i++ {
		conf := filepath.Join(dir, fmt.Sprintf("n%d.conf", i))
		body := fmt.Sprintf(`server_name: n%d
listen: 127.0.0.1:%d
max_payload: 8MB
jetstream { store_dir: %q, sync_interval: always, max_memory_store: 256MB, max_file_store: 2GB }
`, i, ports[i], filepath.Join(dir, fmt.Sprintf("js%d", i)))
		if n > 1 { // one server is a stock single server: a cluster of one never elects a meta leader
			body += fmt.Sprintf("cluster { name: flow-test, listen: 127.0.0.1:%d, routes: [%s] }\n", ports[n+i], strings.Join(routes, ", "))
		}
		body += extraConf
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("n%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		p := &Proc{Name: fmt.Sprintf("nats-%d", i), args: []string{filepath.Join(bin, "nats-server"), "-c", conf}, log: logf, noRetry: true}
		p.start(t)
		c.Servers = append(c.Servers, p)
		c.URLs = append(c.URLs, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	stop := func() {
		for _, p := range c.Servers {
			p.Kill()
		}
	}
	// Listening on both its ports, or exited: which, and why.
	for _, p := range c.Servers {
		deadline := time.Now().Add(30 * time.Second)
		for {
			log := LogOf(p)
			if strings.Contains(log, "Listening for client connections") && (n == 1 || strings.Contains(log, "Listening for route connections")) {
				break
			}
			if !p.Alive() {
				stop()
				if portConflict(p.log.Name(), 0) {
					return nil, true
				}
				t.Fatalf("%s exited at its start:\n%s", p.Name, log)
			}
			if time.Now().After(deadline) {
				stop()
				t.Fatalf("%s did not listen within 30s:\n%s", p.Name, log)
			}
			time.Sleep(20 * time.Millisecond) // polling a child's log, with a deadline
		}
	}
	for _, p := range c.Servers {
		p.mu.Lock()
		p.noRetry = false // a restart keeps its ports: retried on a conflict like any other
		p.mu.Unlock()
	}
	t.Cleanup(stop)
	return c, false
}

// StartFlowd starts a flowd node on the cluster.
func StartFlowd(t testing.TB, c *Cluster, name string, extra ...string) *Proc {
	return StartFlowdEnv(t, c, name, nil, extra...)
}

// StartFlowdEnv is StartFlowd with variables added to its environment (FLOWD_*).
func StartFlowdEnv(t testing.TB, c *Cluster, name string, env []string, extra ...string) *Proc {
	return startFlowdExe(t, c, name, filepath.Join(Binaries(t), "flowd"), env, extra...)
}

// startFlowdExe starts the flowd executable exe as node name on the cluster.
func startFlowdExe(t testing.TB, c *Cluster, name, exe string, env []string, extra ...string) *Proc {
	dir := t.TempDir()
	logf, err := os.Create(filepath.Join(dir, "flowd.log"))
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{exe, "--node-id", name, "--nats-url", c.URL(), "--data-dir", filepath.Join(dir, "data"),
		"--http", "off", "--log-format", "json", "--log-level", "debug", "--park-after", "24h"}, extra...) // long sleeps hold a worker (the tests' runs to cancel, steal, drain)
	p := &Proc{Name: name, args: args, env: env, log: logf}
	p.start(t)
	t.Cleanup(p.Kill)
	return p
}

// RaceReports returns the race detector's reports in a process's output ("" if none):
// each from its "WARNING: DATA RACE" to the line of equals signs that ends it.
func RaceReports(log string) string {
	var out []string
	for rest := log; ; {
		i := strings.Index(rest, "WARNING: DATA RACE")
		if i < 0 {
			break
		}
		rest = rest[i:]
		end := strings.Index(rest, "\n==================")
		if end < 0 {
			end = len(rest)
		}
		out = append(out, rest[:end])
		rest = rest[end:]
	}
	return strings.Join(out, "\n\n")
}

// LogOf returns a process's output so far.
func LogOf(p *Proc) string {
	b, _ := os.ReadFile(p.log.Name())
	return string(b)
}

// WaitFor polls cond until it holds or d passes.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond) // polling child processes' state, with a deadline
	}
}
