package clustertest

import (
	"fmt"
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

// Binaries builds nats-server and flowd once per test process and returns their dir.
func Binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "flow-clustertest-bin")
		if buildErr != nil {
			return
		}
		for _, pkg := range []string{"github.com/nats-io/nats-server/v2", "github.com/flowrun/flow/cmd/flowd"} {
			out, err := exec.Command("go", "build", "-o", binDir+"/", pkg).CombinedOutput()
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
)

// FlowdLinkedWith builds flowd with one package variable set at link time (-ldflags
// "-X setting"), once per test process, and returns the binary's path: the negative
// controls switch a guard off this way, so that only the link differs from Binaries'.
func FlowdLinkedWith(t testing.TB, setting string) string {
	t.Helper()
	linkedMu.Lock()
	defer linkedMu.Unlock()
	if bin, ok := linkedBins[setting]; ok {
		return bin
	}
	dir, err := os.MkdirTemp("", "flow-clustertest-linked")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "flowd")
	out, err := exec.Command("go", "build", "-o", bin, "-ldflags", "-X "+setting, "github.com/flowrun/flow/cmd/flowd").CombinedOutput()
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
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

func (p *Proc) start(t testing.TB) {
	p.cmd = exec.Command(p.args[0], p.args[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(p.cmd, p.done)
}

// Kill SIGKILLs the process and waits for it.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stop and Cont pause and resume it.
func (p *Proc) Stop() { _ = p.cmd.Process.Signal(syscall.SIGSTOP) }

// Cont resumes a stopped process.
func (p *Proc) Cont() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }

// Restart starts it again with the same arguments (after Kill).
func (p *Proc) Restart(t testing.TB) { p.start(t) }

// Alive reports whether it is running.
func (p *Proc) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func freePorts(t testing.TB, n int) []int {
	var ls []net.Listener
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
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

// StartNATS starts an n-server JetStream cluster (file storage, synced writes).
func StartNATS(t testing.TB, n int) *Cluster {
	bin := Binaries(t)
	dir := t.TempDir()
	ports := freePorts(t, 2*n)
	var routes []string
	for i := 0; i < n; i++ {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i]))
	}
	c := &Cluster{}
	for i := 0; i < n; i++ {
		conf := filepath.Join(dir, fmt.Sprintf("n%d.conf", i))
		body := fmt.Sprintf(`server_name: n%d
listen: 127.0.0.1:%d
max_payload: 8MB
jetstream { store_dir: %q, sync_interval: always, max_memory_store: 256MB, max_file_store: 2GB }
cluster { name: flow-test, listen: 127.0.0.1:%d, routes: [%s] }
`, i, ports[i], filepath.Join(dir, fmt.Sprintf("js%d", i)), ports[n+i], strings.Join(routes, ", "))
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		logf, _ := os.Create(filepath.Join(dir, fmt.Sprintf("n%d.log", i)))
		p := &Proc{Name: fmt.Sprintf("nats-%d", i), args: []string{filepath.Join(bin, "nats-server"), "-c", conf}, log: logf}
		p.start(t)
		c.Servers = append(c.Servers, p)
		c.URLs = append(c.URLs, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	t.Cleanup(func() {
		for _, p := range c.Servers {
			p.Kill()
		}
	})
	return c
}

// StartFlowd starts a flowd node on the cluster.
func StartFlowd(t testing.TB, c *Cluster, name string, extra ...string) *Proc {
	bin := Binaries(t)
	dir := t.TempDir()
	logf, _ := os.Create(filepath.Join(dir, "flowd.log"))
	args := append([]string{filepath.Join(bin, "flowd"), "--node-id", name, "--nats-url", c.URL(), "--data-dir", filepath.Join(dir, "data"),
		"--http", "off", "--log-format", "json", "--log-level", "debug"}, extra...)
	p := &Proc{Name: name, args: args, log: logf}
	p.start(t)
	t.Cleanup(p.Kill)
	return p
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
