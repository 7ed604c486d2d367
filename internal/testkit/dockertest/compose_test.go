// Package dockertest tries the container image and deploy/compose.yaml with Docker, as
// an operator would: .ci/run runs it with FLOW_DOCKER_TESTS=1 (the README's test command
// skips it: it builds an image and starts nine containers). For tests only.
package dockertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/testkit/clustertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// compose runs docker-compose on the test's project.
type compose struct {
	t       *testing.T
	root    string
	project string
	env     []string
}

func (c *compose) run(args ...string) (string, error) {
	c.t.Helper()
	cmd := exec.Command("docker-compose", append([]string{"-p", c.project, "-f", filepath.Join(c.root, "deploy", "compose.yaml")}, args...)...)
	cmd.Env = append(os.Environ(), c.env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return "", err
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return out.String(), fmt.Errorf("docker-compose %s: %v: %s", strings.Join(args, " "), err, errOut.String())
		}
		return out.String(), nil
	case <-time.After(5 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		return "", fmt.Errorf("docker-compose %s: no answer in 5 minutes", strings.Join(args, " "))
	}
}

func (c *compose) must(args ...string) string {
	c.t.Helper()
	out, err := c.run(args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// flowctl runs flowctl in a container on the cluster's network as the operator "ops".
func (c *compose) flowctl(args ...string) (string, error) {
	return c.run(append([]string{"--profile", "tools", "run", "--rm", "-T", "flowctl"}, args...)...)
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

// The compose cluster (issue 29): the image built with deploy/build-image.sh (nothing
// pulled), the configuration with deploy/setup.sh (TLS, users and permissions), three
// NATS servers and three flow nodes started by deploy/compose.yaml. The payout runs
// through it while the run's owner container is SIGKILLed and one NATS container is
// stopped: every driver is paid once (the wallet's ledger equals the computed payout).
// Then a flow node is cut from the network (docker network disconnect) while it owns a
// run: the run is taken over and paid once, and the node, reconnected, comes back whole.
func TestComposeCluster(t *testing.T) {
	if os.Getenv("FLOW_DOCKER_TESTS") != "1" {
		t.Skip("FLOW_DOCKER_TESTS=1 runs it (.ci/run does): it builds an image and starts containers")
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	tag := "flow:test"
	build := exec.Command("sh", filepath.Join(root, "deploy", "build-image.sh"), tag)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build-image.sh: %v\n%s", err, out)
	}
	conf := t.TempDir()
	setup := exec.Command("sh", filepath.Join(root, "deploy", "setup.sh"), conf)
	if os.Geteuid() != 0 { // its files must belong to the containers' user
		setup = exec.Command("sudo", "-n", "sh", filepath.Join(root, "deploy", "setup.sh"), conf)
	}
	if out, err := setup.CombinedOutput(); err != nil {
		t.Fatalf("setup.sh: %v\n%s", err, out)
	}
	walletPort := freePort(t)
	// The wallet's latency makes the transfer last long enough to be seen running: each
	// look is a `docker-compose run` of flowctl, seconds on a busy machine, and at 40 ms
	// the whole transfer once ended (6 s) between two looks (issue 37, CI beside 4 busy
	// loops).
	c := &compose{t: t, root: root, project: fmt.Sprintf("flowtest%d", os.Getpid()), env: []string{
		"FLOW_IMAGE=" + tag, "FLOW_CONFIG_DIR=" + conf, "FLOW_LEASE_TTL=2s", "FLOW_WALLET_LATENCY=150ms", "FLOW_WALLET_PORT=" + walletPort,
		"FLOW_UI_PORT_1=" + freePort(t), "FLOW_UI_PORT_2=" + freePort(t), "FLOW_UI_PORT_3=" + freePort(t)}}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := c.run("logs", "--tail", "40")
			t.Logf("logs:\n%s", logs)
		}
		_, _ = c.run("down", "-v", "--remove-orphans")
	})
	c.must("up", "-d")
	status := func() client.ClusterStatus {
		var st client.ClusterStatus
		out, err := c.flowctl("cluster", "status", "-o", "json")
		if err == nil {
			_ = json.Unmarshal([]byte(out), &st)
		}
		return st
	}
	clustertest.WaitFor(t, 3*time.Minute, "three flow nodes and a leader", func() bool {
		st := status()
		return st.Leader != "" && len(st.Nodes) == 3 && st.ClusterVersion == checkpoint.NewestLogFormat
	})
	c.must("--profile", "tools", "run", "--rm", "-T", "flowctl", "workflow", "apply", "-f", "/usr/share/flow/payout.yaml")
	stepReach(t, c, conf)

	// The payout, with its owner killed and a NATS server stopped during the transfer.
	pay := func(date string) (client.Run, string) {
		out, err := c.flowctl("run", "start", "nightly-payout", "-o", "json", "--input", "wallet=http://wallet:9090", "--input", "drivers=2000",
			"--input", "approval_above=999999999999", "--input", "date="+date)
		if err != nil {
			t.Fatal(err)
		}
		var started struct{ ID string }
		if json.Unmarshal([]byte(out), &started) != nil || started.ID == "" {
			t.Fatalf("run start: %s", out)
		}
		var r client.Run
		clustertest.WaitFor(t, 2*time.Minute, "the transfer under way", func() bool {
			out, err := c.flowctl("run", "get", started.ID, "-o", "json")
			if err != nil || json.Unmarshal([]byte(out), &r) != nil || r.Owner == "" {
				return false
			}
			for _, s := range r.Steps {
				if s.Name == "transfer" && s.Status == "running" {
					return true
				}
			}
			return false
		})
		return r, started.ID
	}
	finished := func(id string) client.Run {
		var r client.Run
		clustertest.WaitFor(t, 4*time.Minute, "run "+id+" to end", func() bool {
			out, err := c.flowctl("run", "get", id, "-o", "json")
			return err == nil && json.Unmarshal([]byte(out), &r) == nil && (r.Status == "succeeded" || r.Status == "failed" || r.Status == "dead_lettered")
		})
		if r.Status != "succeeded" {
			t.Fatalf("run %s ended %s: %s", id, r.Status, r.Error)
		}
		return r
	}
	paidOnce := func(r client.Run, date string) {
		var computed struct {
			Count      int   `json:"count"`
			TotalCents int64 `json:"total_cents"`
		}
		for _, s := range r.Steps {
			if s.Name == "compute" {
				_ = json.Unmarshal(s.Output, &computed)
			}
		}
		resp, err := http.Get("http://127.0.0.1:" + walletPort + "/ledger?date=" + date)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ledger struct {
			Drivers    int   `json:"drivers"`
			TotalCents int64 `json:"total_cents"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&ledger); err != nil {
			t.Fatal(err)
		}
		if computed.Count == 0 || ledger.Drivers != computed.Count || ledger.TotalCents != computed.TotalCents {
			t.Fatalf("%s: the wallet paid %d drivers %d cents; the payout computed %d drivers %d cents", date, ledger.Drivers, ledger.TotalCents, computed.Count, computed.TotalCents)
		}
	}
	r, id := pay("2026-11-27")
	owner := r.Owner
	c.must("kill", "-s", "SIGKILL", owner)
	c.must("stop", "-t", "1", "nats-2")
	r = finished(id)
	paidOnce(r, "2026-11-27")
	t.Logf("payout %s: owner %s SIGKILLed and nats-2 stopped mid-transfer; every driver paid once (epochs %v)", id, owner, r.Epochs)
	c.must("start", "nats-2")
	c.must("start", owner)
	clustertest.WaitFor(t, 3*time.Minute, "three flow nodes again", func() bool { return len(status().Nodes) == 3 })

	// A partition: the owner cut from the network while it owns the run.
	r, id = pay("2026-11-26")
	owner = r.Owner
	cid := strings.TrimSpace(c.must("ps", "-q", owner))
	network := c.project + "_default"
	if out, err := exec.Command("docker", "network", "disconnect", network, cid).CombinedOutput(); err != nil {
		t.Fatalf("disconnect %s: %v %s", owner, err, out)
	}
	r = finished(id)
	paidOnce(r, "2026-11-26")
	if out, err := exec.Command("docker", "network", "connect", network, cid, "--alias", owner).CombinedOutput(); err != nil {
		t.Fatalf("connect %s: %v %s", owner, err, out)
	}
	// The cut node gave the run up on its own (its lease's keeper, or the epoch's
	// write, said so): it did not go on as if it still owned the run.
	logs := c.must("logs", "--no-color", owner)
	if !strings.Contains(logs, "ownership lost") && !strings.Contains(logs, "lock-stolen-mid-run") && !strings.Contains(logs, "renewal failed") {
		t.Fatalf("%s's log does not show it giving up its run when cut off:\n%s", owner, logs[max(0, len(logs)-4000):])
	}
	// Nothing the cut node wrote after it lost its lease was taken: every step committed
	// once, in the epoch that ran it (run verify).
	if out, err := c.flowctl("run", "verify", id, "-o", "json"); err != nil || !strings.Contains(out, `"ok": true`) {
		t.Fatalf("run verify %s: %v %s", id, err, out)
	}
	clustertest.WaitFor(t, 3*time.Minute, owner+" back and caught up", func() bool {
		st := status()
		for _, n := range st.Nodes {
			if n.ID == owner && n.Applied >= st.LastSeq-5 && len(n.Problems) == 0 {
				return true
			}
		}
		return false
	})
	t.Logf("payout %s: owner %s cut from the network mid-transfer; paid once, and %s came back whole", id, owner, owner)
}

// reachGo is a program that says what it can read: its uid, then each file (or, for a
// path ending in "/", each directory listing) read or denied. The image has no shell
// and no cat: a step would use any program in it; the test copies this one in.
const reachGo = `package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	fmt.Printf("uid %d\n", os.Getuid())
	for _, p := range os.Args[1:] {
		var err error
		var got string
		if strings.HasSuffix(p, "/") {
			var es []os.DirEntry
			es, err = os.ReadDir(p)
			for _, e := range es {
				got += e.Name() + " "
			}
		} else {
			var b []byte
			b, err = os.ReadFile(p)
			got = string(b)
		}
		if err != nil {
			fmt.Printf("%s: denied\n", p)
			continue
		}
		fmt.Printf("%s: read %q\n", p, got)
	}
}
`

// secretsInTheImage are what no exec step of a flow node may read (issue 36): the
// node's and the operator's environment files (passwords), the users file, the CA's
// and the servers' keys, a NATS configuration (every user's password), flowd's own
// environment (the node's password again) and its data dir.
var secretsInTheImage = []string{"/etc/flow/node.env", "/etc/flow/ops.env", "/etc/flow/people.yaml", "/etc/flow/ca-key.pem",
	"/etc/flow/server-key.pem", "/etc/flow/nats-1.conf", "/proc/1/environ", "/data/"}

// stepReach runs an exec step on the compose cluster that tries to read every secret a
// flow node's container holds, and requires each denied: the step runs as flow-steps
// (65533), flowd as root, the secrets are root's or flow's (65532) and 0600
// (deploy/setup.sh, the Dockerfile, compose.yaml). The control runs the same program
// in a flow node's container as root, flowd's user: it reads the files (flowd's own
// environment stays closed even to it: flowd is not dumpable and root there has no
// CAP_SYS_PTRACE), so it is the step's user that keeps the step out.
func stepReach(t *testing.T, c *compose, conf string) {
	t.Helper()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(reachGo), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module reach\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(src, "reach")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the reach program: %v\n%s", err, out)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"flowd-1", "flowd-2", "flowd-3"} {
		cid := strings.TrimSpace(c.must("ps", "-q", node))
		if out, err := exec.Command("docker", "cp", bin, cid+":/tmp/reach").CombinedOutput(); err != nil {
			t.Fatalf("docker cp into %s: %v\n%s", node, err, out)
		}
	}
	args := `"` + strings.Join(secretsInTheImage, `", "`) + `"`
	wf := "name: reach\nsteps:\n  - name: look\n    uses: exec\n    retry: {max_attempts: 1}\n    with: {command: [/tmp/reach, " + args + "]}\n"
	if err := os.WriteFile(filepath.Join(conf, "reach.yaml"), []byte(wf), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.flowctl("workflow", "apply", "-f", "/etc/flow/reach.yaml"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.flowctl("run", "start", "reach", "--id", "reach-1", "--wait"); err != nil {
		t.Fatal(err)
	}
	out, err := c.flowctl("run", "get", "reach-1", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var r client.Run
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Status != "succeeded" || len(r.Steps) != 1 {
		t.Fatalf("the reach run: %v %s", err, out)
	}
	var got struct{ Stdout string }
	if err := json.Unmarshal(r.Steps[0].Output, &got); err != nil {
		t.Fatalf("the reach step's output %s: %v", r.Steps[0].Output, err)
	}
	got.Stdout += "\n" // the step's output is trimmed: its last line ends like the others
	if !strings.Contains(got.Stdout, "uid 65533\n") {
		t.Fatalf("the step ran as %q; want flow-steps (65533)", got.Stdout)
	}
	for _, p := range secretsInTheImage {
		if !strings.Contains(got.Stdout, p+": denied\n") {
			t.Errorf("an exec step read %s:\n%s", p, got.Stdout)
		}
	}
	nodeEnv, err := os.ReadFile(filepath.Join(conf, "node.env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(nodeEnv), "\n") {
		if pw, ok := strings.CutPrefix(l, "FLOWD_NATS_PASSWORD="); ok && pw != "" && strings.Contains(got.Stdout, pw) {
			t.Errorf("the step's output holds the node's password")
		}
	}
	// The control: flowd's user, root in the node's container, reads the files.
	cid := strings.TrimSpace(c.must("ps", "-q", "flowd-1"))
	ctl, err := exec.Command("docker", append([]string{"exec", "-u", "0", cid, "/tmp/reach"}, secretsInTheImage...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("control: docker exec: %v\n%s", err, ctl)
	}
	for _, p := range []string{"/etc/flow/node.env", "/etc/flow/people.yaml", "/etc/flow/nats-1.conf", "/data/"} {
		if !strings.Contains(string(ctl), p+": read ") {
			t.Errorf("control: root in the node's container did not read %s:\n%s", p, ctl)
		}
	}
}

// The files deploy/setup.sh writes (mounted at /etc/flow in every container): no secret
// is readable by the flow nodes' exec steps (flow-steps, 65533), nor by any user but
// its reader's (root for flowd, docker-compose and the CA's key; 65532 for the NATS
// servers). Run without Docker (it needs root, openssl and Go). The control is the
// same check of a file left readable by others, which it must refuse.
func TestSetupKeepsSecretsFromSteps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setup.sh runs as root (its files belong to root and to 65532)")
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl:", err)
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "flowctl"), "github.com/flowrun/flow/cmd/flowctl").CombinedOutput(); err != nil {
		t.Fatalf("building flowctl: %v\n%s", err, out)
	}
	conf := filepath.Join(t.TempDir(), "run")
	setup := exec.Command("sh", filepath.Join(root, "deploy", "setup.sh"), conf)
	setup.Env = append(os.Environ(), "FLOWCTL="+filepath.Join(bin, "flowctl"))
	if out, err := setup.CombinedOutput(); err != nil {
		t.Fatalf("setup.sh: %v\n%s", err, out)
	}
	owner := map[string]uint32{"node.env": 0, "ops.env": 0, "people.yaml": 0, "ca-key.pem": 0,
		"server-key.pem": 65532, "nats-1.conf": 65532, "nats-2.conf": 65532, "nats-3.conf": 65532}
	for name, uid := range owner {
		p := filepath.Join(conf, name)
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if sys.Uid != uid || st.Mode().Perm()&0o400 == 0 {
			t.Errorf("%s: owner %d, mode %04o; want %d's, readable by it", name, sys.Uid, st.Mode().Perm(), uid)
		}
		if why := readableByOthers(st); why != "" {
			t.Errorf("%s: %s", name, why)
		}
	}
	// The control: a secret left as the files were before issue 36 would be refused
	// too (65532's, the user flowd and its steps shared); one left 0644, by anyone.
	probe := filepath.Join(conf, "node.env")
	if err := os.Chmod(probe, 0o644); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(probe)
	if readableByOthers(st) == "" {
		t.Fatal("control: a 0644 node.env passed the check")
	}
}

// readableByOthers says who besides a file's owner may read it ("": nobody), and
// whether the steps' user flow-steps (65533) may.
func readableByOthers(st os.FileInfo) string {
	sys := st.Sys().(*syscall.Stat_t)
	perm := st.Mode().Perm()
	switch {
	case sys.Uid == 65533:
		return "belongs to flow-steps (65533), the steps' user"
	case perm&0o004 != 0:
		return fmt.Sprintf("readable by every user (mode %04o)", perm)
	case perm&0o040 != 0:
		return fmt.Sprintf("readable by its group %d (mode %04o)", sys.Gid, perm)
	}
	return ""
}
